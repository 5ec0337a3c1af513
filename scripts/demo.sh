#!/usr/bin/env bash
# Set up and run the main job on its default: the CPU demo sweep, or a short sweep on the
# local GPUs where there are some. Results land in results/runs/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
if hw=$(python -m suite.detect 2>/dev/null); then
  echo "GPUs found: running the GPU demo on hardware=$hw"
  suite-bench -m experiment=gpu-demo hardware="$hw" "$@"
else
  echo "No CUDA GPU found: running the CPU demo sweep"
  suite-bench -m experiment=cpu-demo "$@"
fi
echo "Results: $(pwd)/results/runs/ (one JSON file per trial); tables: suite-report tables results/runs"
