"""`suite-plan`: the seed paper's question, "$100K or 100 days", for any model: every GPU type with a
price and count, bought or rented, with its days, dollars, energy and CO2e; the cheapest option
within the deadline, the fastest within the budget, the Pareto front of days against dollars.

    suite-plan model=pythia-1b plan.max_days=30                  # the cheapest within 30 days, the front
    suite-plan model=pythia-1b plan.max_usd=5000 plan.buy=false   # the fastest rented for $5,000
    suite-plan model=pythia-1b plan.tokens=chinchilla              # 20 tokens per parameter (default: the recipe's)
    suite-plan model=pythia-1b plan.gpus=[rtx-3090,h100-sxm] plan.max_nodes=2
    suite-plan model=pythia-1b --store results/runs               # measured where the store holds a trial (store.dir)

Settings (`plan.*`, suite/config/schema.py PlanConfig): tokens, max_days, max_usd, buy, gpus,
max_nodes, usd_per_kwh, pue, grid_g_per_kwh, out; other Hydra overrides (model.recipe.*, search.*)
apply to every option. Each figure is labelled measured or predicted (analysis/plan.py says how it
is made); the table and the figure are written to plan.out (reports/plan/). Exit 2: bad input, or
nothing meets the deadline and budget (the nearest option is named).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from analysis import ReportError
from analysis.plan import Unmet, lines, make_plan, write_plan
from analysis.prices import load_prices
from suite.config import compose


def _overrides(args: list[str]) -> list[str]:
    """Hydra overrides, with `--store DIR` as store.dir=DIR."""
    out, it = [], iter(args)
    for a in it:
        if a == "--store":
            out.append(f"store.dir={next(it, '')}")
        elif a.startswith("--store="):
            out.append(f"store.dir={a.split('=', 1)[1]}")
        elif a.startswith("-"):
            raise ReportError(f"{a}: not an option of suite-plan (--store DIR, -h); settings are plan.KEY=VALUE")
        else:
            out.append(a)
    return compose.overrides(out)


def main(argv: list[str] | None = None, workers: int | None = None) -> int:
    """The command; its budgets are predicted in `workers` processes, by default one per CPU it may
    use (forked: this process has run no torch operation by then). Called within a process that
    has, pass 1."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    try:
        workers = len(os.sched_getaffinity(0)) if workers is None else workers
        plan = make_plan(_overrides(args), load_prices(), workers=workers)
        print("\n".join(lines(plan)))
        written = write_plan(plan, Path(plan.settings.out))
        print("wrote " + ", ".join(str(p) for p in written))
        if plan.unmet:
            raise Unmet(plan.unmet)
    except (ReportError, HydraException, OmegaConfBaseException, compose.OverrideError) as e:
        cause = f" ({str(e.__cause__).splitlines()[0]})" if e.__cause__ and str(e.__cause__) else ""
        print(f"suite-plan: error: {str(e).splitlines()[0]}{cause}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
