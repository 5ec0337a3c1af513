"""`suite-search`: the fastest configuration of one model on one budget, found with few trials.

    suite-search model=pythia-1b hardware=a6000-x4
    suite-search experiment=cpu-search            # a CPU-sized example

1. Enumerate the method combinations of `search.*` (ZeRO stage, offload, recomputation,
   attention, compile); invalid ones are set aside with their reason, and so are those
   whose model states alone exceed the device memory (they cannot fit at any micro-batch).
2. Order the rest by the estimator's predicted step time (`suite.estimate`).
3. For each, find the largest micro-batch that fits among the divisors of the per-device
   batch: start at the estimator's guess, double up (or halve down) on real outcomes, then
   bisect; then time the next smaller micro-batch too, and keep going down while smaller
   is faster (the largest is not assumed to be fastest).
4. Stop when no remaining combination can beat the best measured step time by
   `search.margin` (predictions calibrated by the median measured/predicted ratio so far:
   the minimum proved too eager to explore, since timing noise alone makes some ratio
   low), or when `search.budget_s` of trial time is spent.

Every trial goes through the results store, so an interrupted search started again with
the same command re-uses what was measured and goes on from there.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

from suite.config import SearchConfig, Trial, problems, register, unsupported
from suite.estimate import Estimator, SimpleEstimator

Run = Callable[[Trial], dict]


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def with_methods(t: Trial, **changes: Any) -> Trial:
    return replace(t, methods=replace(t.methods, **changes))


@dataclass
class SearchReport:
    best: dict | None = None
    records: list[dict] = field(default_factory=list)
    launched: int = 0
    trial_s: float = 0.0
    set_aside: list[str] = field(default_factory=list)
    stopped: str = "every candidate measured"
    largest_fit: dict[str, int] = field(default_factory=dict)
    fastest_mb: dict[str, int] = field(default_factory=dict)
    grid_size: int = 0

    def add(self, rec: dict) -> None:
        self.records.append(rec)
        self.trial_s += rec["wall_s"]
        if not rec.get("_source"):
            self.launched += 1
        if rec["outcome"] == "ok" and (
            self.best is None or rec["metrics"]["step_time_s"] < self.best["metrics"]["step_time_s"]
        ):
            self.best = rec


def combo_name(t: Trial) -> str:
    me = t.methods
    return (
        f"zero{me.zero_stage} offload={me.offload} recompute={me.recompute} attn={me.attention}"
        f"{' compile' if me.compile else ''}"
    )


class GaveUp(Exception):
    """A trial failed for a reason other than its size (crash, timeout, NaN)."""


def micro_batch_search(t: Trial, start_mb: int, run: Run, report: SearchReport) -> list[dict]:
    """Largest fitting micro-batch by doubling/halving then bisection; then smaller ones while faster."""
    divs = divisors(t.per_device_batch)
    results: dict[int, dict] = {}

    def fits(i: int) -> bool:
        if i not in results:
            rec = run(with_methods(t, micro_batch=divs[i]))
            report.add(rec)
            results[i] = rec
            if rec["outcome"] not in ("ok", "oom"):  # not a question of size: stop this combination
                raise GaveUp(f"{combo_name(t)}: micro-batch {divs[i]} {rec['outcome']}: {rec['message']}")
        return results[i]["outcome"] == "ok"

    last = len(divs) - 1

    def up(i: int) -> int | None:  # the first divisor at least double divs[i], else the top one
        return next((j for j in range(i + 1, last + 1) if divs[j] >= 2 * divs[i]), last if i < last else None)

    def down(i: int) -> int | None:  # the last divisor at most half divs[i], else the smallest
        return next((j for j in range(i - 1, -1, -1) if divs[j] <= divs[i] // 2), 0 if i > 0 else None)

    lo, hi = None, None
    i = divs.index(start_mb)
    if fits(i):  # double up until something fails
        lo = i
        while (j := up(lo)) is not None:
            if not fits(j):
                hi = j
                break
            lo = j
    else:  # halve down until something fits
        hi = i
        while (j := down(hi)) is not None:
            if fits(j):
                lo = j
                break
            hi = j
    if lo is None:
        return list(results.values())
    while hi is not None and hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    name = combo_name(t)
    report.largest_fit[name] = divs[lo]
    fastest = lo
    for j in range(lo - 1, -1, -1):  # time smaller ones; continue while they are faster
        if not fits(j) or results[j]["metrics"]["step_time_s"] >= results[fastest]["metrics"]["step_time_s"]:
            break
        fastest = j
    report.fastest_mb[name] = divs[fastest]
    return list(results.values())


def search(base: Trial, cfg: SearchConfig, run: Run, est: Estimator | None = None, log=print) -> SearchReport:
    est = est or SimpleEstimator()
    report = SearchReport()
    capacity = base.hardware.mem_gib or math.inf
    divs = divisors(base.per_device_batch) if base.per_device_batch > 0 else [1]
    axes = itertools.product(
        cfg.zero_stages,
        cfg.offloads,
        cfg.recomputes,
        cfg.attentions or [base.methods.attention],
        cfg.compiles or [base.methods.compile],
    )
    candidates = []
    for z, o, r, a, c in axes:
        t = with_methods(base, zero_stage=z, offload=o, recompute=r, attention=a, compile=c, micro_batch=divs[0])
        report.grid_size += len(divs)
        why = "; ".join(problems(t)) or unsupported(t)
        if why:
            report.set_aside.append(f"{combo_name(t)}: {why}")
            continue
        ests = {d: est.estimate(with_methods(t, micro_batch=d)) for d in divs}
        states = ests[divs[0]].model_states_gib
        if states > capacity:
            report.set_aside.append(f"{combo_name(t)}: model states alone need {states:.2f} GiB > {capacity:g} GiB")
            continue
        start = max((d for d in divs if ests[d].mem_gib <= capacity), default=divs[0])
        candidates.append((ests[start].step_time, start, t))
    candidates.sort(key=lambda x: x[0])
    log(
        f"search: {len(candidates)} method combinations to consider, {len(report.set_aside)} set aside; "
        f"micro-batches from {divs}"
    )

    ratios: list[float] = []
    for k, (pred, start, t) in enumerate(candidates):
        if cfg.budget_s and report.trial_s >= cfg.budget_s:
            report.stopped = f"trial-time budget of {cfg.budget_s:g} s spent"
            break
        if report.best is not None and ratios:
            best_s = report.best["metrics"]["step_time_s"]
            optimistic = pred * statistics.median(ratios)
            if optimistic >= best_s * (1 - cfg.margin):
                report.stopped = (
                    f"no remaining combination can beat {best_s:.3f} s by {cfg.margin:.0%} "
                    f"(next: {combo_name(t)}, predicted {optimistic:.3f} s); "
                    f"{len(candidates) - k} not measured"
                )
                break
        log(f"search: [{k + 1}/{len(candidates)}] {combo_name(t)}, starting at micro-batch {start}")
        try:
            measured = micro_batch_search(t, start, run, report)
        except GaveUp as e:
            report.set_aside.append(str(e))
            continue
        for rec in measured:
            if rec["outcome"] == "ok":
                ratio = rec["metrics"]["step_time_s"] / est.estimate(Trial.from_dict(rec["trial"])).step_time
                ratios.append(ratio)
    return report


def summary(base: Trial, report: SearchReport) -> str:
    from analysis.estimates import training_days

    lines = [f"search for {base.model.name} on {base.hardware.name}: {report.stopped}"]
    lines.append(
        f"  spent: {report.launched} trials launched, {len(report.records)} used, "
        f"{report.trial_s:.0f} s of trials (the full grid is {report.grid_size} configurations)"
    )
    for name, mb in report.largest_fit.items():
        fastest = report.fastest_mb[name]
        verdict = "largest is fastest" if fastest == mb else f"micro-batch {fastest} is faster"
        lines.append(f"  {name}: largest micro-batch that fits {mb}; {verdict}")
    for line in report.set_aside:
        lines.append(f"  set aside: {line}")
    if report.best is None:
        lines.append("  no configuration fits this budget")
        return "\n".join(lines)
    t, m = Trial.from_dict(report.best["trial"]), report.best["metrics"]
    days = training_days(m["step_time_s"], t.model.recipe.train_steps)
    mfu = f"{m['mfu']:.1%}" if m.get("mfu") is not None else "n/a"
    lines.append(
        f"  best: {combo_name(t)} micro-batch {t.methods.micro_batch} x GAS {t.gas}: "
        f"{m['step_time_s']:.3f} s/step, peak {m['peak_mem_gib']:.2f} GiB, MFU {mfu}, "
        f"{days:.1f} days for {t.model.recipe.train_steps:,} steps"
    )
    lines.append(f"  result: {report.best['trial_id']}.json")
    return "\n".join(lines)


def _main(cfg: DictConfig) -> None:
    from suite.cli import run_one, summary_line, trial_from_cfg
    from suite.progress import Progress

    base = trial_from_cfg(cfg)
    found = [p for p in problems(base) if "micro_batch" not in p]
    if found:
        print("Invalid search base:", *[f"  - {p}" for p in found], sep="\n", file=sys.stderr)
        sys.exit(2)
    progress = Progress()

    def run(t: Trial) -> dict:
        from suite.cli import describe

        progress.begin(describe(t))
        rec = run_one(t, cfg.store.dir, cfg.store.sweep, True, cfg.wandb)
        progress.end(rec, summary_line(rec, t))
        return rec

    report = search(base, SearchConfig(**cfg.search), run)
    text = summary(base, report)
    print(text)
    out = Path(cfg.store.dir) / f"search-{base.model.name}-{base.hardware.name}.json"
    out.write_text(
        json.dumps(
            {
                "schema": "suite.search/1",
                "base": base.to_dict(),
                "stopped": report.stopped,
                "launched": report.launched,
                "trial_s": report.trial_s,
                "grid_size": report.grid_size,
                "set_aside": report.set_aside,
                "largest_fit": report.largest_fit,
                "fastest_mb": report.fastest_mb,
                "best": report.best["trial_id"] if report.best else None,
                "trials": [r["trial_id"] for r in report.records],
            },
            indent=1,
        )
    )
    print(f"  search log: {out}")


def main() -> None:
    from suite.cli import CONF_DIR

    register()
    hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")(_main)()


if __name__ == "__main__":
    main()
