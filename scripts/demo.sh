#!/usr/bin/env bash
# Set up and run the main job on its default: the CPU demo sweep, or a short sweep on the
# local GPUs where there are some. Results land in results/runs/.
set -euo pipefail
cd "$(dirname "$0")/.."
# Its CPU trials load one DeepSpeed op, FusedAdam: setup builds only that one here (CPU Adam,
# for offload trials, is built by scripts/test.sh's setup, by the first offload trial or by
# python -m suite.ops). Both side by side take 3 minutes on 2 cores; FusedAdam alone about 1.
SUITE_OPS=${SUITE_OPS-fused_adam} bash scripts/setup.sh
. .venv/bin/activate
# 0: the GPUs' profile; 1: no GPU here; 2: GPUs this torch cannot use, or of no known profile
# (suite.detect says which and what to do): never the CPU demo on a GPU machine.
hw=$(python -m suite.detect) && found=0 || found=$?
case $found in
  0)
    echo "GPUs found: running the GPU demo on hardware=$hw"
    suite-bench -m experiment=gpu-demo hardware="$hw" "$@"
    ;;
  1)
    echo "No CUDA GPU found: running the CPU demo sweep"
    suite-bench -m experiment=cpu-demo "$@"
    ;;
  *) exit 1 ;;
esac
echo "Results: $(pwd)/results/runs/ (one JSON file per trial)"
# What was measured here, then what the predictor says of a real model on real GPU budgets
# (every figure labelled predicted, with the error measured so far), in one report and on the page.
predict=(--predict pythia-1b@rtx-3090-x2 --predict pythia-1b@a6000-x4 --predict pythia-1b@a100-80gb-x8)
suite-report tables results/runs "${predict[@]}"
# The sweep's page, now with the predictions, and the figures for a paper beside it (PDF, PNG, CSV, caption).
suite-report leaderboard results/runs -o results/runs/leaderboard.html --figures results/runs/figures "${predict[@]}"
echo "Figures: $(pwd)/results/runs/figures/ (each as PDF, PNG, its data as CSV and its caption)"
