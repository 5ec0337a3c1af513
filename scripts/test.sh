#!/usr/bin/env bash
# Set up and run the test suite (CPU; tests marked gpu skip without a GPU).
#   bash scripts/test.sh            everything, one test at a time, as CI runs it (15-16 minutes on 2 cores)
#   bash scripts/test.sh --quick    every module's logic, at most one real trial per engine, two test
#                                   processes side by side, a file each (pytest-xdist; about 3 minutes on 2 cores)
# Other arguments go to pytest (bash scripts/test.sh --quick tests/test_search.py -x).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
tier=(-n 2 --dist loadgroup)  # two test processes: see tests/conftest.py, pytest_collection_modifyitems
if [ "${1:-}" = --quick ]; then
  shift
  tier+=(-m "not slow")
fi
python -m pytest -q "${tier[@]}" "$@"
