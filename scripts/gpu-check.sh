#!/usr/bin/env bash
# The GPU check: real trials of Pythia-160M on one GPU and a verdict table, in at most 6 minutes
# on one H200 (a time budget of GPU_CHECK_BUDGET_S=320 s from the start; what it leaves out is
# reported as not run). What it covers and judges: suite/gpu_check.py.
#   bash scripts/gpu-check.sh [OUT_DIR]     # default results/gpu-check/<UTC date-time>
# Exit 0: every verdict passed; 1: a verdict failed; 3: no CUDA GPU here; 4: none failed, but the
# time budget left some checks out (the table says which).
#
# Time: each trial spends ~10-20 s starting its process, importing torch, transformers and
# DeepSpeed, building the model and the engine before its first step; its steps take seconds.
# About 20 trials (~15 s each), DeepSpeed's ops compiled once (~1 min, side by side) and one
# torch.compile (~1 min) fill the budget; the wheels install in seconds.
#
# Where DeepSpeed, Hydra, OmegaConf, submitit, hjson or pydantic are missing (a GPU machine
# that reaches no registry), they are installed from .whl/, made beforehand by
# scripts/gpu-wheels.sh, into a folder of their own that only this check uses.
set -euo pipefail
cd "$(dirname "$0")/.."
export GPU_CHECK_START=$(date +%s)
if [ -z "${PYTHON:-}" ]; then
  PYTHON=python3
  [ -x .venv/bin/python ] && PYTHON=.venv/bin/python
fi
if ! "$PYTHON" -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
  echo "gpu-check: no CUDA GPU usable by $PYTHON (torch.cuda.is_available() is not True): nothing to check" >&2
  exit 3
fi
missing=$("$PYTHON" - <<'PY'
import importlib.util
need = ["deepspeed", "hydra", "omegaconf", "submitit", "hjson", "pydantic", "hydra_plugins.hydra_submitit_launcher"]
print(" ".join(m for m in need if importlib.util.find_spec(m) is None))
PY
)
if [ -n "$missing" ]; then
  if ! ls .whl/*.whl >/dev/null 2>&1; then
    echo "gpu-check: missing $missing, and no .whl/ to install them from: run scripts/gpu-wheels.sh" >&2
    echo "  where pip reaches a registry and bring .whl/ along (or pip install -e . here)" >&2
    exit 2
  fi
  site=${GPU_CHECK_SITE:-/tmp/gpu-check-site}
  echo "gpu-check: installing $missing from .whl/ into $site"
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 WANDB_MODE=disabled
export DS_ACCELERATOR=cuda
exec "$PYTHON" -m suite.gpu_check "${1:-results/gpu-check/$(date -u +%Y%m%d-%H%M%S)}"
