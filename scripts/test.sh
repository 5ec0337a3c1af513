#!/usr/bin/env bash
# Set up and run the test suite (CPU; tests marked gpu skip without a GPU).
#   bash scripts/test.sh            everything (about 10 minutes on 2 cores)
#   bash scripts/test.sh --quick    every module's logic, at most one real trial per engine (about 3 minutes)
# Other arguments go to pytest (bash scripts/test.sh --quick tests/test_search.py -x).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
tier=()
if [ "${1:-}" = --quick ]; then
  shift
  tier=(-m "not slow")
fi
python -m pytest -q "${tier[@]}" "$@"
