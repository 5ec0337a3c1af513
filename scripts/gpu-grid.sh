#!/usr/bin/env bash
# The GPU grid: the suite's own trials of Pythia-160M, -410M and -1B on this machine's GPUs, under their
# own memory and capped at 24 and 48 GiB (cards of that size emulated), as the predictor's ground truth,
# within a time budget (GPU_GRID_BUDGET_S, default 480 s from this script's start). What it runs, in
# which order and why: suite/gpu_grid/ and docs/gpu-grid.md.
#   bash scripts/gpu-grid.sh [OUT_DIR]    # default results/gpu-grid/<UTC date>-<gpu>
#   bash scripts/gpu-grid.sh --dry-run    # the plan: trials, estimated seconds, total; needs no GPU, runs nothing
#        [--gpu h200 --count 1]           # the dry run's GPUs
# Everything it writes is packed as one archive for transport, GPU_GRID_ARCHIVE (default OUT_DIR.tar.gz),
# holding OUT_DIR's folder: extract it under results/gpu-grid/ to commit it, then score it there with
#   suite-report accuracy results/gpu-grid/<date>-<gpu>/records --publish   # results/accuracy/cuda.json
# Exit codes (the GPU check's):
#   0  every planned trial ran to a result (ok or out of memory: both are measurements)
#   1  a trial failed (crashed, nan, its own timeout, on another GPU than its profile's) or an op did not build
#   2  the environment cannot run it: a package missing or too old (named), and no wheel of it
#   3  no CUDA GPU usable here (nothing written)
#   4  none failed, but the time budget cut planned trials (NOT RUN in the table)
#   The dry run exits 0 when the plan fits the budget, 1 when it does not.
# Packages as for scripts/gpu-check.sh (scripts/gpu-env.sh): what the machine lacks, from .whl/ (made by
# scripts/gpu-wheels.sh); the suite runs from this checkout (PYTHONPATH); DeepSpeed's ops are built once.
set -euo pipefail
cd "$(dirname "$0")/.."
export GPU_GRID_START=$(date +%s)
NAME=gpu-grid VERB=run DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
. scripts/gpu-env.sh  # the Python, exit 3 without a GPU, packages from .whl/ (exit 2), PYTHONPATH
[ "$DRY" = 1 ] && exec "$PYTHON" -m suite.gpu_grid --dry-run "${@:2}"
if [ -n "${1:-}" ]; then
  out=$1
else
  profile=$("$PYTHON" -m suite.detect) || exit 2  # it says why: GPUs of no known profile, or unusable
  out=results/gpu-grid/$(date -u +%Y-%m-%d)-${profile%-x*}
fi
rc=0
"$PYTHON" -m suite.gpu_grid "$out" || rc=$?
if [ -d "$out" ]; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$out/nvidia-smi.csv" 2>/dev/null || true
  if "$PYTHON" -c "import pandas" 2>/dev/null; then  # scored here too where the reports' packages are
    timeout 300 "$PYTHON" -m cli.report accuracy "$out/records" --out "$out/accuracy" >"$out/accuracy.txt" 2>&1 || true
  fi
  archive=${GPU_GRID_ARCHIVE:-$out.tar.gz}
  tar -czf "$archive" -C "$(dirname "$out")" "$(basename "$out")"
  echo "gpu-grid: packed $out as $archive ($(du -h "$archive" | cut -f1))"
fi
exit "$rc"
