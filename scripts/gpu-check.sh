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
NAME=gpu-check VERB=check DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
. scripts/gpu-env.sh  # the Python, exit 3 without a GPU, packages from .whl/ (exit 2), PYTHONPATH
[ "$DRY" = 1 ] && exec "$PYTHON" -m suite.gpu_check --dry-run
exec "$PYTHON" -m suite.gpu_check "${1:-results/gpu-check/$(date -u +%Y%m%d-%H%M%S)}"
