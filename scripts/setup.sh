#!/usr/bin/env bash
# Create .venv and install the suite. Without a GPU, PyTorch's CPU build goes in first so
# the project's torch range does not pull a CUDA build. With GPUs, bring your CUDA build of
# torch (setup stops, saying what to install, if the torch here cannot use the GPUs), and
# flash-attn is built where nvcc is (FLASH_ATTN=0 skips it; setup goes on without it).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
start=$SECONDS
[ -d .venv ] || "$PY" -m venv .venv
. .venv/bin/activate
gpus=$( (command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU ' || true)
[ "$gpus" = 0 ] && export DS_ACCELERATOR=cpu
# The packages install once per pyproject.toml: a later run whose stamp matches skips pip (seconds).
stamp=.venv/.suite-installed
want=$( (cat pyproject.toml; echo "gpus=$gpus") | sha256sum | cut -d' ' -f1)
ops_pid=
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "Installing the suite into .venv (the first time: a few minutes)..."
  pip install -q --upgrade pip
  if [ "$gpus" = 0 ]; then
    python -c "import torch" 2>/dev/null || pip install -q torch==2.13.0
    # DeepSpeed first, so that its CPU ops (below) compile while pip installs the rest: a
    # compiler process each beside pip, on 2 cores about a minute less than one after the other.
    python -c "import deepspeed" 2>/dev/null || pip install -q "$(grep -o '"deepspeed[^"]*"' pyproject.toml | tr -d '"')"
    python -m suite.ops ${SUITE_OPS:-} &
    ops_pid=$!
    trap 'kill "$ops_pid" 2>/dev/null || true' EXIT
  fi
  pip install -q -e '.[test]'
  echo "$want" > "$stamp"
fi
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
  # DeepSpeed compiles the CPU ops a trial loads (CPU Adam, FusedAdam; async I/O for the NVMe
  # tier, where libaio is installed: without it one line says so and the rest are built) on first
  # use; build them here, side by side, once per machine (torch's cache, which every clone
  # shares), rather than in a trial. Without a compiler this stops, saying what to install.
  # SUITE_OPS names the ops to build (the demo: fused_adam, the only one its trials load). A
  # first install started them beside pip (above): wait for them here.
  if [ -n "$ops_pid" ]; then
    echo "Waiting for DeepSpeed's CPU ops..."
    wait "$ops_pid" || { echo "Setup stopped: DeepSpeed's CPU ops did not build (why above)."; exit 1; }
    trap - EXIT
  else
    python -m suite.ops ${SUITE_OPS:-}
  fi
fi
echo "Setup done in $((SECONDS - start)) s."
