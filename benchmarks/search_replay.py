"""The search replayed against recorded runs: its cost and its winner over many noisy sittings, in seconds.

No trial runs. Each configuration of a grid store (`benchmarks.search_vs_grid`'s, 3 runs
per configuration) takes its grid figure as its true step time, and its out-of-memory outcome
as it was. The machine's noise is replayed from a store of repeated runs
(`benchmarks.prediction_accuracy --repeats 3`'s): each run's step time over its configuration's median
(or, as a second noise model, over its minimum, with the grid's minimum as the truth), in the
order the runs were measured, so slow spells come as they came. A replayed search starts at a random point of that
series and its k-th run takes the k-th factor after it; it runs `suite.search.search` itself,
with this checkout's predictor and the published error, as `experiment=cpu-search` with
DeepSpeed only (search_vs_grid's space). A run costs the grid's wall time per run.

For each stop rule (`median`: the best one's median, the rule now; `high`: its interval's high
end, the rule before) and model it gives, over `--sittings` replays: the search's share of the
grid's trial seconds (median, p90, max, how many over 20%) and its winner's true step time over
the grid winner's (median, p90, max, how many over 3%). A replay is a model of the machine, not
a measurement of the search: search_vs_grid measures it.

    python -m benchmarks.search_replay [--grid results/tmp/search_vs_grid/grid]
        [--noise-store results/tmp/prediction_accuracy-run6] [--sittings 150]
        [--out results/benchmarks/search_replay.json]
"""

from __future__ import annotations

import argparse
import random
import statistics
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from analysis.accuracy import _stats
from analysis.load import read_results
from benchmarks.output import RESULTS, ROOT, write_result
from suite import search as S
from suite.config import SearchConfig
from suite.predict import Predictor
from suite.record import Record, add_run
from suite.runner import Ran

SHARE, WITHIN = 0.20, 0.03  # the search's targets: its share of the grid's time, its winner's distance


def key(methods) -> tuple:
    m = methods if isinstance(methods, dict) else vars(methods)
    return m["zero_stage"], m["recompute"], m["micro_batch"], m["engine"], m["offload"]


def load(d: Path) -> list[Record]:
    """The ok and out-of-memory trial records of a store (analysis.load's reading of one)."""

    return read_results(d).records(("ok", "oom"))


def truth(rec: Record, noise: str) -> float:
    times = rec.step_times()
    return min(times) if noise == "min" else statistics.median(times)


def noise_series(d: Path, noise: str) -> tuple[list[float], dict]:
    """Each run's step time over its configuration's median (or minimum), in the order measured."""
    points = []
    for rec in load(d):
        ok = rec.ok_runs if rec.ok else []
        if len(ok) < 3:
            continue
        ref = truth(rec, noise)
        points += [(r.provenance["date"], r.step_time_s / ref) for r in ok]
    if not points:
        raise SystemExit(f"no record with 3 ok runs or more in {d}: nothing to replay")
    points.sort()
    series = [f for _, f in points]
    about = {
        "store": str(d),
        "runs": len(series),
        "from": points[0][0],
        "to": points[-1][0],
        "over_1_2": sum(f > 1.2 for f in series) / len(series),
    }
    return series, about


class Replay:
    """A machine that answers `run(trial)` from the grid, each run slowed by the next recorded factor."""

    def __init__(self, grid: dict[tuple, Record], series: list[float], start: int, noise: str):
        self.grid, self.series, self.pos, self.noise = grid, series, start, noise
        self.clock = datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp()
        self.kept: dict[str, Record] = {}

    def __call__(self, t) -> Ran:
        g = self.grid.get(key(t.methods))
        if g is None:  # the grid has no ok or oom record of it: a failure, which the search sets aside
            return Ran(Record.new(t, "replay", "crashed", "not in the grid replayed", {}, 0.0))
        rec, fresh = self.kept.get(t.id), 0
        while rec is None or (rec.ok and rec.n_runs < t.measure.repeats):
            wall = g.wall_s / max(1, len(g.runs))
            if g.ok:
                step = truth(g, self.noise) * self.series[self.pos % len(self.series)]
                self.pos += 1
                run = ("ok", "", {**g.ok_runs[0].metrics, "step_time_s": step}, wall)
            else:
                run = (g.outcome, g.message, {}, wall)
            rec = add_run(rec, t, "replay", *run)
            self.clock += wall  # side_by_side pairs runs by date: give each its replayed one
            rec.runs[-1].provenance = {"date": datetime.fromtimestamp(self.clock, timezone.utc).isoformat()}
            fresh += 1
        self.kept[t.id] = rec
        return Ran(rec, fresh)


def quantiles(xs: list[float]) -> dict:
    """n, median, p90 and max, as the accuracy report summarises a quantity."""
    import pandas as pd

    return _stats(pd.Series(xs))


def replay_model(
    model: str, records: list[Record], series: list[float], noise: str, sittings: int, seed: int, est=None
) -> dict:
    """`sittings` replayed searches of `model` (est: the predictor, this checkout's by default)."""

    grid = {key(r.trial.methods): r for r in records if r.trial.model.name == model}
    ok = {k: r for k, r in grid.items() if r.ok}
    if not ok:
        raise SystemExit(f"no configuration of {model} ran ok in the grid: nothing to replay")
    best_true = min(truth(r, noise) for r in ok.values())
    grid_s = sum(r.wall_s for r in grid.values())
    base = next(iter(grid.values())).trial
    base = replace(base, measure=replace(base.measure, repeats=1, rerun=False))
    cfg = SearchConfig(engines=["deepspeed"], offloads=["none"])
    est, rng = est or Predictor(), random.Random(seed)
    shares, slower, runs = [], [], []
    for _ in range(sittings):
        report = S.search(base, cfg, Replay(grid, series, rng.randrange(len(series)), noise), est, log=lambda *a: None)
        shares.append(report.trial_s / grid_s)
        slower.append(truth(ok[key(report.trials[report.best.trial_id].methods)], noise) / best_true - 1)
        runs.append(report.launched)
    return {
        "model": model,
        "grid_trial_s": grid_s,
        "share_of_grid_time": {**quantiles(shares), "over_target": sum(s > SHARE for s in shares)},
        "winner_slower": {**quantiles(slower), "over_target": sum(s > WITHIN for s in slower)},
        "runs_launched_median": statistics.median(runs),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", default=str(ROOT / "results/tmp/search_vs_grid/grid"))
    ap.add_argument("--noise-store", default=str(ROOT / "results/tmp/prediction_accuracy-run6"))
    ap.add_argument("--models", default="pythia-14m,pythia-31m")
    ap.add_argument("--sittings", type=int, default=150, help="replayed searches per model, rule and noise model")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=str(RESULTS / "search_replay.json"))
    args = ap.parse_args()
    if args.sittings < 1:
        ap.error("--sittings must be at least 1")

    records = load(Path(args.grid))
    if not records:
        raise SystemExit(f"no trial records in {args.grid}: run python -m benchmarks.search_vs_grid first")
    rules = {"median": S.stop_reference, "high": lambda best: best.interval.hi}
    cells, noise_about = [], {}
    for noise in ("median", "min"):
        series, noise_about[noise] = noise_series(Path(args.noise_store), noise)
        for rule, reference in rules.items():
            S.stop_reference = reference
            try:
                for model in args.models.split(","):
                    row = replay_model(model, records, series, noise, args.sittings, args.seed)
                    cells.append({"noise": noise, "rule": rule, **row})
            finally:
                S.stop_reference = rules["median"]
            for c in cells[-len(args.models.split(",")) :]:
                sh, ws = c["share_of_grid_time"], c["winner_slower"]
                print(
                    f"noise {noise:6s} rule {rule:6s} {c['model']}: share {sh['median']:.0%} / p90 {sh['p90']:.0%} / "
                    f"max {sh['max']:.0%}, over {SHARE:.0%} in {sh['over_target']}/{args.sittings}; winner slower "
                    f"{ws['median']:.1%} / p90 {ws['p90']:.1%} / max {ws['max']:.1%}, over {WITHIN:.0%} in "
                    f"{ws['over_target']}/{args.sittings}"
                )
    out = {
        "setting": {
            "grid": args.grid,
            "grid_records": len(records),
            "noise": noise_about,
            "sittings": args.sittings,
            "seed": args.seed,
        },
        "cells": cells,
        "targets": {"share": SHARE, "winner_within": WITHIN},
    }
    write_result(args.out, "search_replay", out)
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
