#!/usr/bin/env bash
# Set up and run the test suite (CPU; tests marked gpu skip without a GPU).
#   bash scripts/test.sh            everything, as CI runs it (pytest from a fresh clone, 2 cores: 7:46 on an EPYC, 13:20 on a slower machine)
#   bash scripts/test.sh --quick    every module's logic, at most one real trial per engine (2 minutes)
# Both run two test processes side by side (pytest-xdist), each test on its own or with the other tests
# of its module where they share a module-scoped fixture (tests/conftest.py, pytest_xdist_make_scheduler).
# Other arguments go to pytest (bash scripts/test.sh --quick tests/test_search.py -x).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
tier=(-n 2 --dist loadgroup)
if [ "${1:-}" = --quick ]; then
  shift
  tier+=(-m "not slow")
fi
python -m pytest -q "${tier[@]}" "$@"
