"""The suite's commands, thin: each parses its input, calls the library, prints.

    suite-bench    cli/bench.py    one trial, or a Hydra sweep of them
    suite-search   cli/search.py   the fastest configuration of a model on a budget, in few trials
    suite-predict  cli/predict.py  predicted memory, time, days and cost; `calibrate` this machine
    suite-plan     cli/plan.py     every GPU type and count, bought or rented: the cheapest, the fastest, the front
    suite-report   cli/report.py   tables, export, leaderboard, accuracy

They sit above `suite` (the library), `analysis` and `leaderboard`, and nothing imports them.
"""

import sys

from suite.config.compose import OverrideError, overrides


def hydra_argv(program: str) -> None:
    """Rewrite this process's Hydra overrides in place (old hardware names, see
    `suite.config.compose.overrides`), or exit 2 saying the form to use."""
    try:
        sys.argv[1:] = overrides(sys.argv[1:])
    except OverrideError as e:
        print(f"{program}: error: {e}", file=sys.stderr)
        sys.exit(2)
