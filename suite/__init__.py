"""suite: measured (and predicted) step time, memory, MFU, days and cost of pretraining recipes on GPU budgets."""

import os

# Models are built from configs with random weights; nothing is ever downloaded. Set before
# transformers or huggingface_hub is imported (they read these once), so every suite process,
# the trial workers included (they inherit the environment), is offline: no Hub config, model
# or kernel ("hub kernels", which transformers 5 may fetch for Mamba and others) can be fetched.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["USE_HUB_KERNELS"] = "0"
