"""Search against the exhaustive grid on CPU: trials launched, trial seconds, same winner?

Runs `suite-bench -m experiment=cpu-grid` (4 ZeRO stages x 2 recomputation x 4
micro-batches, 0.8 GiB per worker so some configurations run out of memory) for two models,
then `suite-search experiment=cpu-search` for each into a fresh store, and compares.

    python benchmarks/search_vs_grid.py [--models pythia-14m,pythia-31m] [--out results/benchmarks/search_vs_grid.json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def records(d: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(d.glob("*.json")) if not p.name.startswith("search-")]


def methods_of(rec: dict) -> dict:
    return rec["trial"]["methods"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="pythia-14m,pythia-31m")
    ap.add_argument("--work", default=str(ROOT / "results/tmp/search_vs_grid"))
    ap.add_argument("--out", default=str(ROOT / "results/benchmarks/search_vs_grid.json"))
    ap.add_argument("--reuse-grid", action="store_true", help="keep the grid already measured in --work")
    args = ap.parse_args()
    from suite import store

    work = Path(args.work)
    grid_dir, search_dir = work / "grid", work / "search"
    shutil.rmtree(search_dir, ignore_errors=True)
    if not args.reuse_grid:
        shutil.rmtree(grid_dir, ignore_errors=True)
    common = ["wandb.mode=disabled"]
    subprocess.run(
        ["suite-bench", "-m", "experiment=cpu-grid", f"model={args.models}", f"store.dir={grid_dir}", *common],
        check=True,
    )
    rows = []
    for model in args.models.split(","):
        subprocess.run(
            ["suite-search", "experiment=cpu-search", f"model={model}", f"store.dir={search_dir}", *common], check=True
        )
        log = json.loads((search_dir / f"search-{model}-cpu-x2.json").read_text())
        grid = [r for r in records(grid_dir) if r["trial"]["model"]["name"] == model]
        ok = [r for r in grid if r["outcome"] == "ok"]
        winner = min(ok, key=lambda r: r["metrics"]["step_time_s"])
        found = json.loads((search_dir / f"{log['best']}.json").read_text())
        g, s = winner["metrics"]["step_time_s"], found["metrics"]["step_time_s"]
        # The search's winner as the grid measured it: same configuration, same conditions.
        same_in_grid = next((r for r in ok if methods_of(r) == methods_of(found)), None)
        rows.append(
            {
                "model": model,
                "grid_configurations": len(grid),
                "grid_outcomes": {
                    o: sum(r["outcome"] == o for r in grid) for o in sorted({r["outcome"] for r in grid})
                },
                "grid_trials_launched": sum(r["outcome"] not in ("invalid", "unsupported") for r in grid),
                "grid_trial_s": sum(r["wall_s"] for r in grid),
                "search_trials_launched": log["launched"],
                "search_trial_s": log["trial_s"],
                "search_stopped": log["stopped"],
                "grid_winner": methods_of(winner),
                "grid_winner_step_s": g,
                "search_winner": methods_of(found),
                "search_winner_step_s": s,
                "same_configuration": methods_of(winner) == methods_of(found),
                "search_winner_step_in_grid_s": same_in_grid["metrics"]["step_time_s"] if same_in_grid else None,
                "largest_fit": log["largest_fit"],
                "fastest_mb": log["fastest_mb"],
            }
        )
    total = {
        k: sum(r[k] for r in rows)
        for k in ("grid_trials_launched", "grid_trial_s", "search_trials_launched", "search_trial_s")
    }
    total["search_share_of_grid_time"] = total["search_trial_s"] / total["grid_trial_s"]
    out = {
        "schema": "suite.benchmark/1",
        "benchmark": "search_vs_grid",
        "models": rows,
        "total": total,
        "target_share": 0.30,
        "provenance": store.provenance("cpu"),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    for r in rows:
        gap = r["search_winner_step_in_grid_s"]
        within = f"{(gap / r['grid_winner_step_s'] - 1):+.1%} in the grid" if gap else "not in grid"
        print(
            f"{r['model']}: grid {r['grid_trials_launched']} trials / {r['grid_trial_s']:.0f} s; search "
            f"{r['search_trials_launched']} trials / {r['search_trial_s']:.0f} s; "
            f"same winner: {r['same_configuration']} "
            f"(grid {r['grid_winner_step_s']:.3f} s, search {r['search_winner_step_s']:.3f} s, {within})"
        )
    print(
        f"search spent {total['search_share_of_grid_time']:.0%} of the grid's trial time (target <= 30%) -> {args.out}"
    )


if __name__ == "__main__":
    main()
