#!/usr/bin/env bash
# Create .venv and install the suite. Without a GPU, PyTorch's CPU build goes in first so
# the project's torch range does not pull a CUDA build. With GPUs, bring your CUDA build of
# torch (setup stops, saying what to install, if the torch here cannot use the GPUs), and
# flash-attn is built where nvcc is (FLASH_ATTN=0 skips it; setup goes on without it).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -d .venv ] || "$PY" -m venv .venv
. .venv/bin/activate
pip install -q --upgrade pip
gpus=$( (command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU ' || true)
if [ "$gpus" = 0 ]; then
  python -c "import torch" 2>/dev/null || pip install -q torch==2.13.0
  export DS_ACCELERATOR=cpu
fi
pip install -q -e '.[test]'
if [ "$gpus" != 0 ]; then
  # A CPU-only torch already here satisfies the project's torch range; every GPU trial would
  # then quietly run on the CPU. suite.detect says which torch this is and what to install.
  if ! python -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
    python -m suite.detect || true
    exit 1
  fi
  flash=$(python -c "from suite.config.validate import FLASH_ATTN_INSTALL; print(FLASH_ATTN_INSTALL)")
  nvcc=$(command -v nvcc || ls "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" 2>/dev/null || true)
  if [ "${FLASH_ATTN:-1}" = 0 ] || python -c "import flash_attn" 2>/dev/null; then
    :
  elif ! python -c "import sys, torch; sys.exit(torch.cuda.get_device_capability(0) < (8, 0))"; then
    echo "flash-attn not installed: it needs an Ampere or newer GPU (compute capability 8.0+)"
  elif [ -z "$nvcc" ]; then
    echo "flash-attn not installed: its build needs nvcc (the CUDA toolkit); with it: $flash"
    echo "  methods.attention=flash_attention_2 trials are recorded as 'unsupported' until then."
  else
    echo "Installing flash-attn (a prebuilt wheel if one matches this torch, else a build of up to an hour; FLASH_ATTN=0 skips it)..."
    if ! (export PATH="$(dirname "$nvcc"):$PATH"; eval "$flash"); then
      echo "warning: flash-attn did not install (see above); setup goes on without it. Retry: $flash"
      echo "  methods.attention=flash_attention_2 trials are recorded as 'unsupported' until then."
    fi
  fi
fi
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
