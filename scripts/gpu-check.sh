#!/usr/bin/env bash
# The GPU check: real trials of Pythia-160M on one GPU and a verdict table, within a time budget
# (GPU_CHECK_BUDGET_S, default 300 s from this script's start) that leaves room in a first
# 15-minute GPU session for the machine's start and a rerun. What it runs and judges, and in
# which order: suite/gpu_check/ and docs/gpu-check.md.
#   bash scripts/gpu-check.sh [OUT_DIR]   # default results/gpu-check/<UTC date-time>
#   bash scripts/gpu-check.sh --dry-run   # the plan with estimated seconds; needs no GPU, runs nothing
# Exit codes:
#   0  every verdict passed (a SKIPPED check says why it could not be judged)
#   1  a verdict failed (FAIL in the table)
#   2  the environment cannot run the check: a package missing or too old (named), and no wheel of it
#   3  no CUDA GPU usable here
#   4  none failed, but the time budget left checks out (NOT RUN in the table)
#   The dry run exits 0 when the plan fits the budget, 1 when it does not.
#
# Packages: where the GPU machine lacks what scripts/gpu-wheels.txt lists (DeepSpeed, Hydra, OmegaConf,
# submitit, pydantic, ...: a machine that reaches no registry), they are installed by name from
# .whl/, made beforehand by scripts/gpu-wheels.sh, into a folder only this check uses. .whl/ is
# ignored by git: carry it with the working tree. The suite runs from this checkout (PYTHONPATH),
# not installed. ninja is put on PATH when it sits beside the Python (a venv not activated).
set -euo pipefail
cd "$(dirname "$0")/.."
export GPU_CHECK_START=$(date +%s)
if [ -z "${PYTHON:-}" ]; then
  PYTHON=python3
  [ -x .venv/bin/python ] && PYTHON=.venv/bin/python
fi
dry=0
[ "${1:-}" = "--dry-run" ] && dry=1
if [ "$dry" = 0 ] && ! "$PYTHON" -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
  echo "gpu-check: no CUDA GPU usable by $PYTHON (torch.cuda.is_available() is not True): nothing to check" >&2
  exit 3
fi
# Each listed distribution that is absent here or at another version: "name==version absent|other".
wanted=$("$PYTHON" - <<'PY'
import importlib.metadata as md
for line in open("scripts/gpu-wheels.txt"):
    req = line.split("#")[0].strip()
    if req:
        name, version = req.split("==")
        try:
            have = md.version(name)
        except md.PackageNotFoundError:
            print(req, "absent")
            continue
        if have != version:
            print(req, "other")
PY
)
if [ -n "$wanted" ]; then
  if ! ls .whl/*.whl >/dev/null 2>&1; then
    absent=$(echo "$wanted" | awk '$2 == "absent" {print $1}' | tr '\n' ' ')
    if [ -n "$absent" ]; then
      echo "gpu-check: missing $absent and no .whl/ to install them from: run scripts/gpu-wheels.sh" >&2
      echo "  where pip reaches a registry and carry .whl/ along (or pip install -e . here)" >&2
      exit 2
    fi
  else
    site=${GPU_CHECK_SITE:-/tmp/gpu-check-site}
    names=$(echo "$wanted" | awk '{print $1}' | tr '\n' ' ')
    echo "gpu-check: installing $names from .whl/ into $site"
    # shellcheck disable=SC2086
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --find-links .whl --target "$site" $names
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 WANDB_MODE=disabled
export DS_ACCELERATOR=cuda
[ "$dry" = 1 ] && exec "$PYTHON" -m suite.gpu_check --dry-run
exec "$PYTHON" -m suite.gpu_check "${1:-results/gpu-check/$(date -u +%Y%m%d-%H%M%S)}"
