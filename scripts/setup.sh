#!/usr/bin/env bash
# Create .venv and install the suite. Without a GPU, PyTorch's CPU build goes in first so
# the project's torch range does not pull a CUDA build; with one, bring your own CUDA torch.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -d .venv ] || "$PY" -m venv .venv
. .venv/bin/activate
pip install -q --upgrade pip
if ! (command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1); then
  python -c "import torch" 2>/dev/null || pip install -q torch==2.13.0
  export DS_ACCELERATOR=cpu
fi
pip install -q -e '.[test]'
if [ "${DS_ACCELERATOR:-}" = cpu ]; then
  # DeepSpeed compiles its CPU ops (shared-memory allreduce, CPU Adam, FusedAdam) on first use; do it
  # once here (a few minutes, cached under ~/.cache/torch_extensions) rather than in a
  # timed trial.
  echo "Preparing DeepSpeed CPU ops (cached after the first time)..."
  python - <<'PY'
from deepspeed.accelerator import get_accelerator
for name in ("ShareMemCommBuilder", "CPUAdamBuilder", "FusedAdamBuilder"):
    get_accelerator().create_op_builder(name).load(verbose=False)
PY
fi
