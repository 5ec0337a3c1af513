"""`suite-search`: the fastest configuration of one model on one budget, found with few trials.

    suite-search model=pythia-1b hardware=a6000-x4
    suite-search experiment=cpu-search            # a CPU-sized example

1. Enumerate the method combinations of `search.*` (engine: DeepSpeed's ZeRO stages and
   FSDP2's two modes; offload, recomputation, attention, compile); invalid ones are set
   aside with their reason, and so are those the predictor (`suite.predict`) puts above the
   device memory at the smallest micro-batch by more than `search.fit_margin`.
2. Order the rest by their predicted step time in seconds (the fastest micro-batch
   predicted to fit).
3. For each, find the largest micro-batch that fits among the divisors of the per-device
   batch: start at the largest predicted to fit, double up (or halve down) on real outcomes,
   then bisect; then time the next smaller micro-batch too, and keep going down while smaller
   is faster (the largest is not assumed to be fastest).
4. Stop when no remaining combination can beat the best one: its prediction, calibrated by
   the median measured/predicted ratio so far (the minimum proved too eager to explore,
   since timing noise alone makes some ratio low) and less the predictor's own error
   (`search.pred_error`, by default the median error published for this kind of device), is
   not below the best one's median step time by `search.margin`. Without the error term a
   search of Pythia-31M stopped one combination short of the grid's winner, predicted 5%
   slower than the best so far (its pick was 6.8% slower). Before the rule rests on that
   median, the best one is measured `search.min_runs` times: a lucky single run no longer
   ends the search early. The rule once took the high end of the best one's interval
   instead; at 3 runs that is their slowest, and on a shared 2-core VM about one run in nine
   is over 20% slow: one such run kept searches of Pythia-14M and -31M exploring, and they
   spent 30-36% of the grid's time where the others spent 5-19%, for the same winners. A
   replay of recorded runs through the search (`benchmarks/search_replay.py`) gave the same
   picture. Or stop when `search.budget_s` of trial time is spent.
5. Confirm (`confirm`): re-measure the best configuration and every one that may tie it
   (intervals overlap; or, measured once, its run came within `search.margin` of the best
   one's run nearest in time: a machine that drifts makes runs minutes apart incomparable,
   and a Pythia-31M search named a winner 6.8% slower than the grid's, whose one run fell in
   a slow spell and the best one's later runs in a fast one) until they separate or reach
   `search.max_runs` runs each, then name the winner with its interval and the
   configurations statistically tied with it. A tie that no number of runs up to the cap
   can separate is not re-measured: with the cap below 9 runs, an interval is [min, max],
   and more runs only widen it. (A search of Pythia-31M
   spent 18 of its 48 runs taking six tied configurations from 3 runs to 6, and separated none.)

The predictor of a CPU budget needs this machine's constants; a search without them measures
them first (`suite-predict calibrate`, quick), once per machine and worker count.

A trial is one record of one or more runs (suite/store.py); asking `run` for a trial with
`measure.repeats=n` adds runs until it has n. Every run goes through the results store, so
an interrupted search started again with the same command re-uses what was measured and
goes on from there.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from suite import stats, store
from suite.config import SearchConfig, Trial, problems, register, unsupported
from suite.predict import Estimate, Estimator

Run = Callable[[Trial], dict]


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def with_methods(t: Trial, **changes: Any) -> Trial:
    return replace(t, methods=replace(t.methods, **changes))


def with_measure(t: Trial, **changes: Any) -> Trial:
    return replace(t, measure=replace(t.measure, **changes))


def runs(rec: dict) -> int:
    """Runs behind an `ok` record's figures."""
    return rec["metrics"]["runs"]


@dataclass
class SearchReport:
    trials: dict[str, Trial] = field(default_factory=dict)
    """The trials the search asked for, by id; `latest` holds each one's record as it stands now."""
    latest: dict[str, dict] = field(default_factory=dict)
    launched: int = 0
    """Runs measured by this search (a trial's repeats count one each)."""
    set_aside: list[str] = field(default_factory=list)
    stopped: str = "every candidate measured"
    confirmed: str = "nothing to confirm"
    largest_fit: dict[str, int] = field(default_factory=dict)
    fastest_mb: dict[str, int] = field(default_factory=dict)
    grid_size: int = 0
    pred_error: float = 0.0
    pred_error_source: str = ""

    def add(self, t: Trial, rec: dict) -> None:
        self.trials[rec["trial_id"]] = t
        self.latest[rec["trial_id"]] = rec
        self.launched += rec.get("_fresh_runs", 0)

    @property
    def records(self) -> list[dict]:
        return list(self.latest.values())

    @property
    def trial_s(self) -> float:
        """Wall time of every run behind the records used."""
        return sum(r["wall_s"] for r in self.latest.values())

    @property
    def ok(self) -> list[dict]:
        return [r for r in self.latest.values() if r["outcome"] == "ok"]

    @property
    def best(self) -> dict | None:
        """The `ok` record with the smallest median step time."""
        return min(self.ok, key=lambda r: r["metrics"]["step_time_s"], default=None)

    def tied(self) -> list[dict]:
        """The other `ok` records whose interval overlaps the best one's, fastest first."""
        best = self.best
        if best is None:
            return []
        iv = store.interval(best)
        found = [r for r in self.ok if r is not best and store.interval(r).overlaps(iv)]
        return sorted(found, key=lambda r: r["metrics"]["step_time_s"])


def combo_name(t: Trial) -> str:
    me = t.methods
    if me.engine == "fsdp2":
        sharding = f"fsdp2-{'full_shard' if me.reshard_after_forward else 'shard_grad_op'}"
    else:
        sharding = f"zero{me.zero_stage}"
    return (
        f"{sharding} offload={me.offload} recompute={me.recompute} attn={me.attention}"
        f"{' compile' if me.compile else ''}"
    )


def shardings(cfg: SearchConfig) -> list[dict[str, Any]]:
    """The engine settings the search covers: each ZeRO stage under DeepSpeed, both FSDP2
    modes; an engine it does not know is kept, for `problems` to name."""
    out: list[dict[str, Any]] = []
    for engine in cfg.engines:
        if engine == "deepspeed":
            out += [{"engine": engine, "zero_stage": z, "reshard_after_forward": None} for z in cfg.zero_stages]
        elif engine == "fsdp2":
            out += [{"engine": engine, "zero_stage": 0, "reshard_after_forward": r} for r in (False, True)]
        else:
            out.append({"engine": engine, "zero_stage": 0, "reshard_after_forward": None})
    return out


def combinations(base: Trial, cfg: SearchConfig) -> list[Trial]:
    """Every combination of the search's axes, valid or not, at the smallest micro-batch."""
    axes = itertools.product(
        shardings(cfg),
        cfg.offloads,
        cfg.recomputes,
        cfg.attentions or [base.methods.attention],
        cfg.compiles or [base.methods.compile],
    )
    return [
        with_methods(base, **sh, offload=o, recompute=r, attention=a, compile=c, micro_batch=1)
        for sh, o, r, a, c in axes
    ]


class GaveUp(Exception):
    """A trial failed for a reason other than its size (crash, timeout, NaN)."""


def micro_batch_search(t: Trial, start_mb: int, run: Run, report: SearchReport) -> list[dict]:
    """Largest fitting micro-batch by doubling/halving then bisection; then smaller ones while faster."""
    divs = divisors(t.per_device_batch)
    results: dict[int, dict] = {}

    def fits(i: int) -> bool:
        if i not in results:
            ti = with_methods(t, micro_batch=divs[i])
            rec = run(ti)
            report.add(ti, rec)
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


def predictor(base: Trial, log=print) -> Estimator:
    """The predictor for the search, this machine's constants measured first where a CPU
    budget has none (quick microbenchmarks, saved for every later search and prediction)."""
    from suite.predict import Predictor
    from suite.predict.calibrate import calibrate
    from suite.predict.machine import NotCalibrated, calibration_key, save_calibration

    p = Predictor()
    try:
        p.machine(base)
    except NotCalibrated:
        key = calibration_key(base.hardware)
        log(f"search: no calibration of {key} on this machine; measuring it first (suite-predict calibrate, quick)")
        path = save_calibration(calibrate(replace(base, nodes=1), quick=True, log=log), key)
        log(f"search: calibration written to {path}")
        p = Predictor()
    return p


def search(base: Trial, cfg: SearchConfig, run: Run, est: Estimator | None = None, log=print) -> SearchReport:
    est = est or predictor(base, log)
    report = SearchReport()
    report.pred_error, report.pred_error_source = prediction_error(base, cfg)
    capacity = base.hardware.mem_gib or math.inf
    divs = divisors(base.per_device_batch) if base.per_device_batch > 0 else [1]
    candidates = []
    for t in combinations(base, cfg):
        t = with_methods(t, micro_batch=divs[0])
        report.grid_size += len(divs)
        why = "; ".join(problems(t)) or unsupported(t)
        if why:
            report.set_aside.append(f"{combo_name(t)}: {why}")
            continue
        ests: dict[int, Estimate] = {d: est.estimate(with_methods(t, micro_batch=d)) for d in divs}
        least = ests[divs[0]].mem_gib
        if least > capacity * (1 + cfg.fit_margin):
            report.set_aside.append(
                f"{combo_name(t)}: predicted to need {least:.2f} GiB per device at micro-batch {divs[0]}, "
                f"over the {capacity:g} GiB there are by more than the {cfg.fit_margin:.0%} fit margin"
            )
            continue
        fit = [d for d in divs if ests[d].mem_gib <= capacity] or [divs[0]]
        pred = min(ests[d].step_time for d in fit)  # its fastest micro-batch predicted to fit
        candidates.append((pred, fit[-1], t))
    candidates.sort(key=lambda x: x[0])
    log(
        f"search: {len(candidates)} method combinations to consider, {len(report.set_aside)} set aside; "
        f"micro-batches from {divs}; the predictor's step time taken as up to {report.pred_error:.1%} off "
        f"({report.pred_error_source})"
    )

    for k, (pred, start, t) in enumerate(candidates):
        if spent(report, cfg):
            report.stopped = f"trial-time budget of {cfg.budget_s:g} s spent"
            break
        why = beaten(report, pred, est, cfg, run, log)
        if why:
            report.stopped = f"{why} (next: {combo_name(t)}); {len(candidates) - k} not measured"
            break
        log(f"search: [{k + 1}/{len(candidates)}] {combo_name(t)}, starting at micro-batch {start}")
        try:
            micro_batch_search(t, start, run, report)
        except GaveUp as e:
            report.set_aside.append(str(e))
    confirm(report, cfg, run, log)
    return report


def prediction_error(base: Trial, cfg: SearchConfig) -> tuple[float, str]:
    """How far an unmeasured prediction may be off (a fraction of its step time), and why."""
    if cfg.pred_error is not None:
        return cfg.pred_error, "search.pred_error"
    from suite.predict import published_error

    s = published_error(base.hardware.device) or {}
    st = s.get("step_time_err_pct") or {}
    if st.get("n"):
        return st["median"] / 100, f"median |error| on {st['n']} {base.hardware.device} trials, results/accuracy"
    return 0.10, f"no {base.hardware.device} accuracy published: 10% assumed"


def spent(report: SearchReport, cfg: SearchConfig) -> bool:
    return bool(cfg.budget_s) and report.trial_s >= cfg.budget_s


def more_runs(report: SearchReport, rec: dict, run: Run) -> dict:
    """One more run of a measured trial, through the store like every run."""
    t = with_measure(report.trials[rec["trial_id"]], repeats=runs(rec) + 1, rerun=False)
    new = run(t)
    report.add(t, new)
    if new["outcome"] == "ok" and runs(new) <= runs(rec):
        raise RuntimeError(f"run() returned {rec['trial_id']} without the run asked for")
    return new


def calibration(report: SearchReport, est: Estimator) -> float | None:
    """Median of measured / predicted step time over the `ok` records so far."""
    ratios = [r["metrics"]["step_time_s"] / est.estimate(report.trials[r["trial_id"]]).step_time for r in report.ok]
    return statistics.median(ratios) if ratios else None


def stop_reference(best: dict) -> float:
    """The time `beaten` holds candidates against: the best one's median step time.
    (benchmarks/search_replay.py swaps in the interval's high end, the rule before, to compare.)"""
    return best["metrics"]["step_time_s"]


def beaten(report: SearchReport, pred: float, est: Estimator, cfg: SearchConfig, run: Run, log) -> str | None:
    """Why a candidate predicted at `pred` (and every later one) cannot beat the best, or None.

    The candidate's time may lie anywhere within the predictor's error of its calibrated
    prediction, so it is worth measuring while its prediction less that error is below the
    best one's median by `cfg.margin`. The rule stops on a median of `cfg.min_runs` runs, not
    a single time: the best one gets them first (they may make another configuration the
    best, which is then measured again in turn). It is the median, not the interval's high
    end: at 3 runs that is the slowest run, and one run in a slow spell of a shared machine
    would keep the search exploring on its strength (module docstring, step 4).
    """
    while True:
        best, ratio = report.best, calibration(report, est)
        if best is None or ratio is None:
            return None
        median = stop_reference(best)
        if pred * ratio * (1 - report.pred_error) < median * (1 - cfg.margin):
            return None
        if runs(best) >= cfg.min_runs or spent(report, cfg):
            return (
                f"no remaining combination can beat {median:.3f} s/step (median of {runs(best)} runs) "
                f"by {cfg.margin:.0%}, even {report.pred_error:.0%} faster than predicted: "
                f"the next is predicted at {pred * ratio:.3f} s"
            )
        log(f"search: confirming the best so far before stopping on it ({runs(best) + 1} runs)")
        more_runs(report, best, run)


def side_by_side(rec: dict, best: dict) -> float | None:
    """The smallest ratio of a run of `rec` to the run of `best` measured nearest in time to it
    (their provenance dates), or None without dates: how the two compared when the machine was
    in the same state. A shared machine drifts (a 2-core VM ran 30% faster for minutes), and a
    rival measured once in a slow spell looks separated from a best one measured in a fast one."""

    def dated(r: dict) -> list[tuple[float, float]]:
        out = []
        for x in store.ok_runs(r):
            date = (x.get("provenance") or {}).get("date")
            if date:
                out.append((datetime.fromisoformat(date).timestamp(), x["metrics"]["step_time_s"]))
        return out

    mine, theirs = dated(rec), dated(best)
    if not mine or not theirs:
        return None
    return min(t / min(theirs, key=lambda b: abs(b[0] - when))[1] for when, t in mine)


def may_tie(rec: dict, best: dict, cfg: SearchConfig) -> bool:
    """Whether `rec` may be tied with `best`: their intervals overlap, once `rec` has the
    `cfg.min_runs` runs an interval is judged on. Measured once, `rec` is given the relative
    interval of the best one; with more runs but fewer than that, it is a contender whose
    runs are completed first. Measured once, it may also tie when its run was within
    `cfg.margin` of the best one's run nearest in time (`side_by_side`): in the same state of
    the machine the two were that close, whatever the best one's later runs say."""
    iv = store.interval(best)
    if runs(rec) >= cfg.min_runs:
        return store.interval(rec).overlaps(iv)
    if runs(rec) > 1:
        return True
    paired = side_by_side(rec, best)
    if paired is not None and paired <= 1 + cfg.margin:
        return True
    m, x = best["metrics"]["step_time_s"], rec["metrics"]["step_time_s"]
    return stats.Interval(x * iv.lo / m, x * iv.hi / m, iv.level, 1).overlaps(iv)


def settled(rec: dict, best: dict, cfg: SearchConfig) -> bool:
    """Whether `rec` stays tied with `best` however many more runs, up to `cfg.max_runs` each,
    either gets (`stats.bound_to_overlap`): below 9 runs an interval is [min, max], and an
    overlap of two [min, max] intervals never closes with more runs."""

    def times(r: dict) -> list[float]:
        return [x["metrics"]["step_time_s"] for x in store.ok_runs(r)]

    return stats.bound_to_overlap(times(rec), times(best), cfg.max_runs)


def confirm(report: SearchReport, cfg: SearchConfig, run: Run, log=print) -> None:
    """Re-measure the best configuration and each one that may tie it, one run at a time,
    until their intervals separate or each has `cfg.max_runs` runs (or the budget is spent).

    Every rival that may tie gets `cfg.min_runs` runs first, as the best one has: the winner is
    named on medians of as many runs (a rival measured once in a slow spell of the machine, run
    again beside the best one, may win). Beyond that, a rival whose interval is bound to
    overlap the best one's up to the cap (`settled`) is reported tied as it stands: more runs
    could only move the medians, never separate the two. `search.refine_ties=true`
    re-measures such ties to the cap all the same."""
    while (best := report.best) is not None:
        if spent(report, cfg):
            report.confirmed = f"stopped by the trial-time budget of {cfg.budget_s:g} s: intervals may still overlap"
            return
        if runs(best) < cfg.min_runs:
            more_runs(report, best, run)
            continue
        rivals = [r for r in report.ok if r is not best and may_tie(r, best, cfg)]
        short = [r for r in rivals if runs(r) < cfg.min_runs]
        if short:
            more_runs(report, min(short, key=lambda r: r["metrics"]["step_time_s"]), run)
            continue
        if not cfg.refine_ties:
            rivals = [r for r in rivals if not settled(r, best, cfg)]
        open_ = [r for r in [best, *rivals] if runs(r) < cfg.max_runs]
        if not rivals or not open_:
            tied = report.tied()
            report.confirmed = (
                f"the best one separated from every other measured configuration ({runs(best)} runs)"
                if not tied
                else f"{len(tied)} configuration(s) still tied with the best one at {cfg.max_runs} runs each"
                if rivals
                else f"{len(tied)} configuration(s) tied with the best one ({runs(best)} runs): their intervals "
                f"overlap in a way no number of runs up to {cfg.max_runs} each can undo"
            )
            return
        r = min(open_, key=runs)  # the fewest runs first, so both sides of an overlap grow
        log(
            f"search: re-measuring {combo_name(report.trials[r['trial_id']])} "
            f"mb {report.trials[r['trial_id']].methods.micro_batch} ({runs(r) + 1} runs)"
        )
        more_runs(report, r, run)


def describe_interval(rec: dict) -> str:
    m = rec["metrics"]
    if runs(rec) == 1:
        return f"{m['step_time_s']:.3f} s/step (a single run: no interval)"
    return (
        f"{m['step_time_s']:.3f} s/step (median of {runs(rec)} runs; {m['step_time_ci_level']:.1%} interval "
        f"{m['step_time_ci_lo_s']:.3f}-{m['step_time_ci_hi_s']:.3f} s)"
    )


def summary(base: Trial, report: SearchReport) -> str:
    from analysis.estimates import training_days

    lines = [f"search for {base.model.name} on {base.hardware.name}: {report.stopped}"]
    lines.append(
        f"  spent: {report.launched} runs launched, {len(report.records)} configurations used, "
        f"{report.trial_s:.0f} s of trials (the full grid is {report.grid_size} configurations)"
    )
    for name, mb in report.largest_fit.items():
        fastest = report.fastest_mb[name]
        verdict = "largest is fastest" if fastest == mb else f"micro-batch {fastest} is faster"
        later = next(
            (r for i, r in report.latest.items() if combo_name(report.trials[i]) == name
             and report.trials[i].methods.micro_batch == mb and r["outcome"] != "ok"),
            None,
        )  # fmt: skip
        lines.append(
            f"  {name}: largest micro-batch that fits {mb}; {verdict}"
            + (f" (but a later run of it ended {later['outcome']}: {later['message']})" if later else "")
        )
    for line in report.set_aside:
        lines.append(f"  set aside: {line}")
    best = report.best
    if best is None:
        lines.append("  no configuration fits this budget")
        return "\n".join(lines)
    t, m = report.trials[best["trial_id"]], best["metrics"]
    steps = t.model.recipe.train_steps
    days = training_days(m["step_time_s"], steps)
    lo, hi = training_days(m["step_time_ci_lo_s"], steps), training_days(m["step_time_ci_hi_s"], steps)
    mfu = f"{m['mfu']:.1%}" if m.get("mfu") is not None else "n/a"
    lines.append(
        f"  best: {combo_name(t)} micro-batch {t.methods.micro_batch} x GAS {t.gas}: {describe_interval(best)}, "
        f"peak {m['peak_mem_gib']:.2f} GiB, MFU {mfu}, {days:.1f} days ({lo:.1f}-{hi:.1f}) for {steps:,} steps"
    )
    lines.append(f"  result: {best['trial_id']}.json")
    lines.append(f"  confirmation: {report.confirmed}")
    tied = report.tied()
    if tied:
        lines.append("  tied with the best (their intervals overlap: the runs cannot tell them apart):")
    for r in tied:
        rt = report.trials[r["trial_id"]]
        lines.append(f"    {combo_name(rt)} micro-batch {rt.methods.micro_batch}: {describe_interval(r)}")
    return "\n".join(lines)


def search_problems(cfg: SearchConfig) -> list[str]:
    """Every problem with the search's own settings."""
    p = []
    if cfg.min_runs < 2:
        p.append(f"search.min_runs={cfg.min_runs} must be >= 2: one run has no interval to compare")
    if cfg.max_runs < cfg.min_runs:
        p.append(f"search.max_runs={cfg.max_runs} must be >= search.min_runs={cfg.min_runs}")
    if not 0 <= cfg.margin < 1:
        p.append(f"search.margin={cfg.margin} must be a fraction in [0, 1)")
    if cfg.pred_error is not None and not 0 <= cfg.pred_error < 1:
        p.append(f"search.pred_error={cfg.pred_error} must be a fraction in [0, 1) (null: the published error)")
    if cfg.budget_s < 0:
        p.append(f"search.budget_s={cfg.budget_s} must be >= 0 (0: no limit)")
    return p


def log_of(base: Trial, report: SearchReport, cfg: SearchConfig | None = None) -> dict:
    """The search log written next to the results: its settings, what it spent, found and left tied."""
    best = report.best
    return {
        "schema": "suite.search/2",
        "base": base.to_dict(),
        "search": asdict(cfg) if cfg else None,
        "stopped": report.stopped,
        "confirmed": report.confirmed,
        "launched": report.launched,
        "trial_s": report.trial_s,
        "grid_size": report.grid_size,
        "pred_error": report.pred_error,
        "pred_error_source": report.pred_error_source,
        "set_aside": report.set_aside,
        "largest_fit": report.largest_fit,
        "fastest_mb": report.fastest_mb,
        "best": best["trial_id"] if best else None,
        "best_interval": dict(vars(store.interval(best)), median=best["metrics"]["step_time_s"]) if best else None,
        "tied": [r["trial_id"] for r in report.tied()],
        "trials": list(report.latest),
    }


def _main(cfg: DictConfig) -> None:
    from suite.cli import run_one, summary_line, trial_from_cfg
    from suite.progress import Progress

    base = trial_from_cfg(cfg)
    search_cfg = SearchConfig(**OmegaConf.to_container(cfg.search, resolve=True))
    found = [p for p in problems(base) if "micro_batch" not in p] + search_problems(search_cfg)
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

    report = search(base, search_cfg, run)
    print(summary(base, report))
    out = Path(cfg.store.dir) / f"search-{base.model.name}-{base.hardware.name}.json"
    out.write_text(json.dumps(log_of(base, report, search_cfg), indent=1))
    print(f"  search log: {out}")


def main() -> None:
    from suite.cli import CONF_DIR

    register()
    hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")(_main)()


if __name__ == "__main__":
    main()
