"""Any transformers architecture, one generic path for all, a module per concern:

    config.py     the model's transformers config: a local config.json read as JSON (never the
                  Hub), its fields, the task's AutoModelFor... class; no model built
    arch.py       the facts validation and labels need (shape, attentions, blocks), read without
                  building and cached in memory and on disk
    recompute.py  the repeated block and activation recomputation (full, selective)
    build.py      the model with random weights, and synthetic batches for its task
    kernels.py    optional fused kernels (Mamba's): which one runs, and their PyTorch references
    flops.py      FLOPs of a forward and backward, counted on the meta device

A model is data (`ModelConfig`): a transformers `model_type` with its config fields (or a local
`config.json`) and a task; the batch, the labels and the unit of throughput follow the task,
not the family. This package imports nothing: `config` and `arch` import no torch (a report or
the leaderboard reads architecture facts without it), the other modules do.
"""
