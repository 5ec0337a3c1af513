"""The search: the fastest configuration of one model on one budget, found with few trials.

1. Enumerate the method combinations of `search.*` (`suite.space`: DeepSpeed's ZeRO stages and
   FSDP2's two modes; offload, recomputation, attention, compile). Invalid ones are set aside with
   their reason, and so are those the predictor (`suite.predict`) puts above the device memory at
   the smallest micro-batch by more than `search.fit_margin`.
2. Order the rest by their predicted step time (the fastest micro-batch predicted to fit).
3. For each, find the largest micro-batch that fits among the divisors of the per-device batch:
   start at the largest predicted to fit, double up (or halve down) on real outcomes, then
   bisect; then time smaller micro-batches while they are faster (the largest is not assumed
   to be the fastest).
4. Stop when no remaining combination can beat the best one (`beaten`): its prediction,
   calibrated by the median measured/predicted ratio so far and taken as fast as the
   predictor's own error allows (`search.pred_error`), is not below the best one's median step
   time by `search.margin`. The best one first gets `search.min_runs` runs, so a lucky single
   run cannot end the search; the median, not the interval's high end (at 3 runs, the slowest
   run), keeps one run in a slow spell of a shared machine from prolonging it. Or stop when
   `search.budget_s` of trial time is spent. Either way, the combinations left unmeasured are
   read where the store already holds results of them (`from_store`): those cost nothing.
5. Confirm (`confirm`): re-measure the best configuration and every one that may tie it until
   they separate or reach `search.max_runs` runs, then name the winner with its interval and
   the configurations statistically tied with it. A tie that no number of runs up to the cap
   can separate is reported as it stands (below 9 runs an interval is [min, max], which more
   runs only widen).

Every run goes through the results store (`suite.runner`), so an interrupted search started
again re-uses what was measured. A CPU budget's predictor needs this machine's constants; a
search without them measures them first (`suite.calibrate`, quick). The measurements behind
these rules are in results/benchmarks/README.md (search_vs_grid, search_replay).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from suite import stats
from suite.calibrate import calibrate
from suite.config.schema import SearchConfig, Trial
from suite.config.validate import problems, unsupported
from suite.labels import methods_label
from suite.predict import Estimate, Estimator, Predictor
from suite.predict.machine import NotCalibrated, calibration_key, save_calibration
from suite.predict.regimes import error_label, n_params_of
from suite.record import Record
from suite.runner import Ran
from suite.space import combinations, divisors, micro_batches, with_methods

Run = Callable[[Trial], Ran]
"""How the search measures a trial: `suite.runner.run_one` in the command; tests script their own."""


def with_measure(t: Trial, **changes: Any) -> Trial:
    return replace(t, measure=replace(t.measure, **changes))


@dataclass
class SearchReport:
    trials: dict[str, Trial] = field(default_factory=dict)
    """The trials the search asked for, by id; `latest` holds each one's record as it stands now."""
    latest: dict[str, Record] = field(default_factory=dict)
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

    def add(self, t: Trial, ran: Ran) -> Record:
        self.trials[ran.record.trial_id] = t
        self.latest[ran.record.trial_id] = ran.record
        self.launched += ran.fresh_runs
        return ran.record

    @property
    def records(self) -> list[Record]:
        return list(self.latest.values())

    @property
    def trial_s(self) -> float:
        """Wall time of every run behind the records used."""
        return sum(r.wall_s for r in self.latest.values())

    @property
    def ok(self) -> list[Record]:
        return [r for r in self.latest.values() if r.ok]

    @property
    def best(self) -> Record | None:
        """The `ok` record with the smallest median step time."""
        return min(self.ok, key=lambda r: r.step_time_s, default=None)

    def tied(self) -> list[Record]:
        """The other `ok` records whose interval overlaps the best one's, fastest first."""
        best = self.best
        if best is None:
            return []
        found = [r for r in self.ok if r is not best and r.interval.overlaps(best.interval)]
        return sorted(found, key=lambda r: r.step_time_s)


class GaveUp(Exception):
    """A trial failed for a reason other than its size (crash, timeout, NaN)."""


def micro_batch_search(t: Trial, start_mb: int, run: Run, report: SearchReport) -> list[Record]:
    """Largest fitting micro-batch by doubling/halving then bisection; then smaller ones while faster."""
    divs = divisors(t.per_device_batch)
    results: dict[int, Record] = {}

    def fits(i: int) -> bool:
        if i not in results:
            ti = with_methods(t, micro_batch=divs[i])
            rec = results[i] = report.add(ti, run(ti))
            if rec.outcome not in ("ok", "oom"):  # not a question of size: stop this combination
                raise GaveUp(f"{methods_label(t)}: micro-batch {divs[i]} {rec.outcome}: {rec.message}")
        return results[i].ok

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
    name = methods_label(t)
    report.largest_fit[name] = divs[lo]
    fastest = lo
    for j in range(lo - 1, -1, -1):  # time smaller ones; continue while they are faster
        if not fits(j) or results[j].step_time_s >= results[fastest].step_time_s:
            break
        fastest = j
    report.fastest_mb[name] = divs[fastest]
    return list(results.values())


def predictor(base: Trial, log=print) -> Estimator:
    """The predictor for the search, this machine's constants measured first where a CPU
    budget has none (quick microbenchmarks, saved for every later search and prediction)."""

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


def candidates(base: Trial, cfg: SearchConfig, est: Estimator, report: SearchReport) -> tuple[list[tuple], str]:
    """The valid combinations the predictor does not rule out, fastest predicted first:
    (predicted s/step, the largest micro-batch predicted to fit, trial); and a line saying so."""
    capacity = base.hardware.mem_gib or math.inf
    divs = micro_batches(base)
    out = []
    for t in combinations(base, cfg):
        t = with_methods(t, micro_batch=divs[0])
        report.grid_size += len(divs)
        why = "; ".join(problems(t)) or unsupported(t)
        if why:
            report.set_aside.append(f"{methods_label(t)}: {why}")
            continue
        ests: dict[int, Estimate] = {d: est.estimate(with_methods(t, micro_batch=d)) for d in divs}
        least = ests[divs[0]].mem_gib
        if least > capacity * (1 + cfg.fit_margin):
            report.set_aside.append(
                f"{methods_label(t)}: predicted to need {least:.2f} GiB per device at micro-batch {divs[0]}, "
                f"over the {capacity:g} GiB there are by more than the {cfg.fit_margin:.0%} fit margin"
            )
            continue
        fit = [d for d in divs if ests[d].mem_gib <= capacity] or [divs[0]]
        pred = min(ests[d].step_time for d in fit)  # its fastest micro-batch predicted to fit
        out.append((pred, fit[-1], t))
    out.sort(key=lambda x: x[0])
    log_line = (
        f"search: {len(out)} method combinations to consider, {len(report.set_aside)} set aside; "
        f"micro-batches from {divs}; the predictor's step time taken as up to {report.pred_error:.1%} off "
        f"({report.pred_error_source})"
    )
    return out, log_line


def search(
    base: Trial,
    cfg: SearchConfig,
    run: Run,
    est: Estimator | None = None,
    log=print,
    stored: Callable[[Trial], bool] | None = None,
) -> SearchReport:
    """`stored(t)`: whether the store already holds a result of `t`. Once the search stops on
    predictions, the combinations it did not measure are still read where the store has them (a
    grid run before, an earlier search): a measurement costs nothing there and beats a prediction."""
    est = est or predictor(base, log)
    report = SearchReport()
    report.pred_error, report.pred_error_source = prediction_error(base, cfg)
    ranked, line = candidates(base, cfg, est, report)
    log(line)
    stopped, read = None, 0
    for k, (pred, start, t) in enumerate(ranked):
        if stopped is None and spent(report, cfg):
            stopped = f"trial-time budget of {cfg.budget_s:g} s spent"
        if stopped is None:
            why = beaten(report, pred, est, cfg, run, log)
            if why:
                stopped = f"{why} (next: {methods_label(t)}); {len(ranked) - k} not measured"
        if stopped is not None:
            read += from_store(report, t, run, stored)
            continue
        log(f"search: [{k + 1}/{len(ranked)}] {methods_label(t)}, starting at micro-batch {start}")
        try:
            micro_batch_search(t, start, run, report)
        except GaveUp as e:
            report.set_aside.append(str(e))
    if stopped is not None:
        report.stopped = stopped + (f" ({read} result(s) of those read from the store)" if read else "")
    confirm(report, cfg, run, log)
    return report


def from_store(report: SearchReport, t: Trial, run: Run, stored: Callable[[Trial], bool] | None) -> int:
    """The results the store holds of combination `t` at any micro-batch, added to the report
    (`run` serves them from the store, launching nothing); how many."""
    if stored is None:
        return 0
    held = [u for d in micro_batches(t) if stored(u := with_methods(t, micro_batch=d))]
    for u in held:
        report.add(u, run(u))
    return len(held)


def prediction_error(base: Trial, cfg: SearchConfig) -> tuple[float, str]:
    """How far an unmeasured prediction may be off (a fraction of its step time), and why: the
    base trial's step-time error label (`suite.predict.regimes.error_label`: its regime's, or the
    nearest scored one's, named), else 10%."""
    if cfg.pred_error is not None:
        return cfg.pred_error, "search.pred_error"
    label = error_label(base, "step", n_params_of(base))
    if label.scored:
        return label.median_pct / 100, f"{label.long} (results/accuracy)"
    return 0.10, f"no {base.hardware.device} accuracy published for it ({label.long}): 10% assumed"


def spent(report: SearchReport, cfg: SearchConfig) -> bool:
    return bool(cfg.budget_s) and report.trial_s >= cfg.budget_s


def more_runs(report: SearchReport, rec: Record, run: Run) -> Record:
    """One more run of a measured trial, through the store like every run."""
    t = with_measure(report.trials[rec.trial_id], repeats=rec.n_runs + 1, rerun=False)
    new = report.add(t, run(t))
    if new.ok and new.n_runs <= rec.n_runs:
        raise RuntimeError(f"run() returned {rec.trial_id} without the run asked for")
    return new


def calibration(report: SearchReport, est: Estimator) -> float | None:
    """Median of measured / predicted step time over the `ok` records so far."""
    ratios = [r.step_time_s / est.estimate(report.trials[r.trial_id]).step_time for r in report.ok]
    return statistics.median(ratios) if ratios else None


def stop_reference(best: Record) -> float:
    """The time `beaten` holds candidates against: the best one's median step time.
    (benchmarks/search_replay.py swaps in the interval's high end, to compare the two rules.)"""
    return best.step_time_s


def beaten(report: SearchReport, pred: float, est: Estimator, cfg: SearchConfig, run: Run, log) -> str | None:
    """Why a candidate predicted at `pred` (and every later one) cannot beat the best, or None.

    The candidate's time may lie anywhere within the predictor's error of its calibrated
    prediction, so it is worth measuring while its prediction less that error is below the
    best one's median by `cfg.margin`. The rule stops on a median of `cfg.min_runs` runs, not
    a single time: the best one gets them first (they may make another configuration the
    best, which is then measured again in turn).
    """
    while True:
        best, ratio = report.best, calibration(report, est)
        if best is None or ratio is None:
            return None
        median = stop_reference(best)
        if pred * ratio * (1 - report.pred_error) < median * (1 - cfg.margin):
            return None
        if best.n_runs >= cfg.min_runs or spent(report, cfg):
            return (
                f"no remaining combination can beat {median:.3f} s/step (median of {best.n_runs} runs) "
                f"by {cfg.margin:.0%}, even {report.pred_error:.0%} faster than predicted: "
                f"the next is predicted at {pred * ratio:.3f} s"
            )
        log(f"search: confirming the best so far before stopping on it ({best.n_runs + 1} runs)")
        more_runs(report, best, run)


def side_by_side(rec: Record, best: Record) -> float | None:
    """The smallest ratio of a run of `rec` to the run of `best` measured nearest in time to it
    (their provenance dates), or None without dates: how the two compared when the machine was
    in the same state. A shared machine drifts, and a rival measured once in a slow spell looks
    separated from a best one measured in a fast one."""

    def dated(r: Record) -> list[tuple[float, float]]:
        return [(x.date.timestamp(), x.step_time_s) for x in r.ok_runs if x.date]

    mine, theirs = dated(rec), dated(best)
    if not mine or not theirs:
        return None
    return min(t / min(theirs, key=lambda b: abs(b[0] - when))[1] for when, t in mine)


def may_tie(rec: Record, best: Record, cfg: SearchConfig) -> bool:
    """Whether `rec` may be tied with `best`: their intervals overlap, once `rec` has the
    `cfg.min_runs` runs an interval is judged on. Measured once, `rec` is given the relative
    interval of the best one; with more runs but fewer than that, it is a contender whose
    runs are completed first. Measured once, it may also tie when its run was within
    `cfg.margin` of the best one's run nearest in time (`side_by_side`): in the same state of
    the machine the two were that close, whatever the best one's later runs say."""
    iv = best.interval
    if rec.n_runs >= cfg.min_runs:
        return rec.interval.overlaps(iv)
    if rec.n_runs > 1:
        return True
    paired = side_by_side(rec, best)
    if paired is not None and paired <= 1 + cfg.margin:
        return True
    m, x = best.step_time_s, rec.step_time_s
    return stats.Interval(x * iv.lo / m, x * iv.hi / m, iv.level, 1).overlaps(iv)


def settled(rec: Record, best: Record, cfg: SearchConfig) -> bool:
    """Whether `rec` stays tied with `best` however many more runs, up to `cfg.max_runs` each,
    either gets (`stats.bound_to_overlap`): below 9 runs an interval is [min, max], and an
    overlap of two [min, max] intervals never closes with more runs."""
    return stats.bound_to_overlap(rec.step_times(), best.step_times(), cfg.max_runs)


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
        if best.n_runs < cfg.min_runs:
            more_runs(report, best, run)
            continue
        rivals = [r for r in report.ok if r is not best and may_tie(r, best, cfg)]
        short = [r for r in rivals if r.n_runs < cfg.min_runs]
        if short:
            more_runs(report, min(short, key=lambda r: r.step_time_s), run)
            continue
        if not cfg.refine_ties:
            rivals = [r for r in rivals if not settled(r, best, cfg)]
        open_ = [r for r in [best, *rivals] if r.n_runs < cfg.max_runs]
        if not rivals or not open_:
            report.confirmed = confirmation(report, cfg, best, bool(rivals))
            return
        r = min(open_, key=lambda r: r.n_runs)  # the fewest runs first, so both sides of an overlap grow
        t = report.trials[r.trial_id]
        log(f"search: re-measuring {methods_label(t)} mb {t.methods.micro_batch} ({r.n_runs + 1} runs)")
        more_runs(report, r, run)


def confirmation(report: SearchReport, cfg: SearchConfig, best: Record, open_rivals: bool) -> str:
    """What the confirmation ended with."""
    tied = report.tied()
    if not tied:
        return f"the best one separated from every other measured configuration ({best.n_runs} runs)"
    if open_rivals:
        return f"{len(tied)} configuration(s) still tied with the best one at {cfg.max_runs} runs each"
    return (
        f"{len(tied)} configuration(s) tied with the best one ({best.n_runs} runs): their intervals "
        f"overlap in a way no number of runs up to {cfg.max_runs} each can undo"
    )


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
        "base": base.to_json(),
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
        "best": best.trial_id if best else None,
        "best_interval": dict(vars(best.interval), median=best.step_time_s) if best else None,
        "tied": [r.trial_id for r in report.tied()],
        "trials": list(report.latest),
    }
