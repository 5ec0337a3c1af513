"""Search logic (with a scripted machine), and real sweeps: grid, search, resume, W&B, progress."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import psutil
import pytest
from conftest import CPU_RECIPE, ONE, make_trial
from test_trial import workers_of

from cli.bench import sweep_size
from cli.search import summary
from suite import paths, record, store, tracking
from suite.config import SearchConfig, Trial
from suite.labels import methods_label
from suite.predict import Estimate, Predictor
from suite.progress import Progress
from suite.record import Record, add_run
from suite.runner import Ran
from suite.search import (
    SearchReport,
    confirm,
    log_of,
    may_tie,
    micro_batch_search,
    more_runs,
    search,
    search_problems,
    side_by_side,
    with_measure,
)
from suite.space import divisors, with_methods


def scripted(limit: int, step_s, calls: list, run_s=lambda t, k: 0.0):
    """A stand-in machine: micro-batches up to `limit` fit; the k-th run of trial t takes
    step_s(t) + run_s(t, k) seconds per step (run_s None: that run is out of memory). It keeps
    its records with the store's own functions, and a trial asked with measure.repeats=n gets
    runs until it has n."""
    kept: dict[str, Record] = {}

    def run(t: Trial) -> Ran:
        calls.append(t.methods.micro_batch)
        rec, fresh = kept.get(t.id), 0
        while rec is None or (rec.ok and rec.n_runs < t.measure.repeats):
            k = len(rec.runs) if rec else 0
            extra = run_s(t, k)  # None: this run runs out of memory
            ok = t.methods.micro_batch <= limit and extra is not None
            ran = ("ok" if ok else "oom", "", figures(step_s(t) + extra) if ok else {}, 1.0)
            rec = add_run(rec, t, "test", *ran)
            fresh += 1
        kept[t.id] = rec
        return Ran(rec, fresh)

    return run


def figures(step_time_s: float) -> dict:
    """A run's metrics as the worker writes them, with only what the search, the store and the
    results reader (analysis.load) read."""
    return {
        "step_time_s": step_time_s,
        "tokens_per_step": 1024,
        "gas": 1,
        "step_time_std_s": 0.01 * step_time_s,
        "model_flops_per_token": 1e6,
        "hardware_flops_per_token": 1e6,
        "peak_mem_gib": 0.1,
        "noisy": False,
    }


def test_divisors_include_non_powers_of_two():
    assert divisors(24) == [1, 2, 3, 4, 6, 8, 12, 24]


@pytest.mark.parametrize(
    "limit,start,expected_calls",
    [
        (6, 1, [1, 2, 4, 8, 6]),  # double up, fail at 8, bisect to 6; 4 (measured) is slower
        (24, 4, [4, 8, 24, 12]),  # top reached: the top divisor is tried last; 12 slower
        (2, 8, [8, 4, 2, 3, 1]),  # start too high: halve down to 2, bisect (3 fails); 1 slower
        (0, 2, [2, 1]),  # nothing fits
    ],
)
def test_micro_batch_search_doubles_then_bisects_on_real_failures(tiny, limit, start, expected_calls):
    t = tiny("model.recipe.global_batch=48")  # 24 per device
    calls: list[int] = []
    report = SearchReport()
    micro_batch_search(t, start, scripted(limit, lambda t: 10.0 / t.methods.micro_batch, calls), report)
    assert calls == expected_calls
    if limit:
        name = next(iter(report.largest_fit))
        assert report.largest_fit[name] == max(d for d in divisors(24) if d <= limit)
        assert report.fastest_mb[name] == report.largest_fit[name]


def test_micro_batch_search_keeps_timing_smaller_ones_while_faster(tiny):
    t = tiny("model.recipe.global_batch=48")
    calls: list[int] = []
    report = SearchReport()
    speed = {1: 9.0, 2: 5.0, 3: 4.0, 4: 3.0, 6: 3.5, 8: 3.9, 12: 4.0, 24: 5.0}
    micro_batch_search(t, 8, scripted(12, lambda t: speed[t.methods.micro_batch], calls), report)
    assert calls == [8, 24, 12, 6, 4, 3]  # 12 fits, then 6 and 4 are faster, 3 is not
    assert list(report.fastest_mb.values()) == [4]


class FixedEstimator:
    """Predicts memory from the micro-batch and time from a table, so the test knows the answers."""

    def __init__(self, time_of):
        self.time_of = time_of

    def estimate(self, t: Trial) -> Estimate:
        return Estimate(mem_gib=0.1 * t.methods.micro_batch, step_time=self.time_of(t))


def test_search_stops_when_no_candidate_can_beat_the_best(tiny):
    base = tiny("hardware.mem_gib=0.45")
    truth = {0: 1.0, 1: 1.1, 2: 1.3, 3: 2.0}  # seconds by ZeRO stage; predictions are exact
    calls: list[int] = []
    run = scripted(4, lambda t: truth[t.methods.zero_stage], calls)
    cfg = SearchConfig(
        engines=["deepspeed"], zero_stages=[0, 1, 2, 3], offloads=["none"], recomputes=["none"], margin=0.03,
        pred_error=0.0,
    )  # fmt: skip
    report = search(base, cfg, run, FixedEstimator(lambda t: truth[t.methods.zero_stage]), log=lambda *_: None)
    assert report.best.trial.methods.zero_stage == 0
    assert "no remaining combination can beat" in report.stopped
    assert {r.trial.methods.zero_stage for r in report.records} == {0}


def test_a_combination_the_store_holds_is_read_where_its_prediction_would_have_stopped_the_search(tiny):
    """The predictor puts ZeRO-2 last, but a grid run before measured it fastest: once the search
    stops on predictions it reads what the store holds (no launch) and names that the best."""
    base = tiny("hardware.mem_gib=0.45")
    truth = {0: 1.0, 1: 1.1, 2: 0.8}  # seconds by ZeRO stage; ZeRO-2 predicted at 2.0 s
    calls: list[int] = []
    run = scripted(4, lambda t: truth[t.methods.zero_stage], calls)
    grid = [with_methods(base, zero_stage=2, micro_batch=mb) for mb in (2, 4)]
    for t in grid:
        run(t)  # the earlier grid: its results in the store
    cfg = SearchConfig(
        engines=["deepspeed"], zero_stages=[0, 1, 2], offloads=["none"], recomputes=["none"], margin=0.03,
        pred_error=0.0, min_runs=1, max_runs=1,
    )  # fmt: skip
    predicted = {0: 1.0, 1: 1.1, 2: 2.0}
    stored = {t.id for t in grid}.__contains__
    report = search(
        base, cfg, run, FixedEstimator(lambda t: predicted[t.methods.zero_stage]), lambda *_: None,
        stored=lambda t: stored(t.id),
    )  # fmt: skip
    assert "no remaining combination can beat" in report.stopped and "2 result(s) of those read" in report.stopped
    assert report.best.trial.methods.zero_stage == 2 and report.best.step_time_s == pytest.approx(0.8)
    zero2 = [r for r in report.records if r.trial.methods.zero_stage == 2]
    assert sorted(r.trial.methods.micro_batch for r in zero2) == [2, 4]
    assert all(r.n_runs == 1 for r in zero2)  # served as the grid left them: no run launched for them
    without = search(base, cfg, scripted(4, lambda t: truth[t.methods.zero_stage], []),
                     FixedEstimator(lambda t: predicted[t.methods.zero_stage]), lambda *_: None)  # fmt: skip
    assert without.best.trial.methods.zero_stage == 0  # the prediction alone stops short of it


def test_search_sets_aside_what_cannot_fit_and_respects_its_budget(tiny):
    base = tiny("hardware.mem_gib=0.01")  # micro-batch 1 (0.1 GiB predicted) exceeds it by far
    cfg = SearchConfig(engines=["deepspeed"], zero_stages=[0, 1], offloads=["none", "optimizer"], recomputes=["none"])
    report = search(base, cfg, scripted(4, lambda t: 1.0, []), FixedEstimator(lambda t: 1.0), log=lambda *_: None)
    assert report.best is None and report.records == []
    assert any("predicted to need 0.10 GiB per device at micro-batch 1" in s for s in report.set_aside)
    assert any("needs sharding" in s for s in report.set_aside)  # zero0 + offload: invalid
    base = tiny("hardware.mem_gib=1")
    cfg = SearchConfig(
        engines=["deepspeed"], zero_stages=[0, 1, 2, 3], offloads=["none"], recomputes=["none"], budget_s=2.0
    )
    report = search(
        base,
        cfg,
        scripted(4, lambda t: 1.0 + t.methods.zero_stage, []),
        FixedEstimator(lambda t: 1.0),
        log=lambda *_: None,
    )
    assert "budget" in report.stopped and report.trial_s >= 2.0


def test_a_crash_is_not_a_size_limit_the_combination_is_set_aside(tiny):
    calls = []

    def crashing(t: Trial) -> Ran:
        calls.append(t.methods.micro_batch)
        return Ran(Record.new(t, "test", "crashed", "boom", {}, 1.0), 1)

    cfg = SearchConfig(engines=["deepspeed"], zero_stages=[0, 1], offloads=["none"], recomputes=["none"])
    report = search(tiny("hardware.mem_gib=1"), cfg, crashing, FixedEstimator(lambda t: 1.0), log=lambda *_: None)
    assert len(calls) == 2  # one trial per combination, not a walk down every micro-batch
    assert report.best is None and sum("crashed: boom" in s for s in report.set_aside) == 2


# --- confirmation: intervals, not single times ----------------------------------------------

ONE_MB = "model.recipe.global_batch=2"  # one sample per worker: one micro-batch per combination
QUIET = dict(log=lambda *_: None)


def by_stage(runs: dict[int, list[float | None]]):
    """The k-th run of ZeRO stage z takes runs[z][k] s/step (the last one repeats)."""
    return lambda t, k: runs[t.methods.zero_stage][min(k, len(runs[t.methods.zero_stage]) - 1)]


def stage(rec: Record) -> int:
    return rec.trial.methods.zero_stage


def test_a_lucky_single_run_neither_ends_the_search_nor_wins_it(tiny):
    # ZeRO-0's first run is lucky (0.90); its median is 1.00. ZeRO-1 is really faster (0.96).
    # Both are predicted at 1.0; taken 5% faster than predicted, ZeRO-1 may beat ZeRO-0 by the
    # 3% margin, so it is measured. On its single lucky time, ZeRO-0 would win; as the best it
    # gets 3 runs before the stop rule rests on it, its median becomes 1.00, and ZeRO-1 wins.
    runs = {0: [0.90, 1.00, 1.06, 1.00, 1.06, 0.99], 1: [0.96, 0.965, 0.96], 2: [2.0], 3: [2.0]}
    predicted = FixedEstimator(lambda t: 1.0 if t.methods.zero_stage < 2 else 2.0)
    for refine in (False, True):
        calls: list[int] = []
        run = scripted(1, lambda t: 0.0, calls, by_stage(runs))
        cfg = SearchConfig(
            engines=["deepspeed"], zero_stages=[0, 1, 2, 3], offloads=["none"], recomputes=["none"], margin=0.03,
            pred_error=0.05, refine_ties=refine,
        )  # fmt: skip
        report = search(tiny("hardware.mem_gib=1", ONE_MB), cfg, run, predicted, **QUIET)
        assert stage(report.best) == 1 and report.best.step_time_s == pytest.approx(0.96)
        assert "no remaining combination can beat" in report.stopped
        assert {stage(r) for r in report.records} == {0, 1}  # ZeRO-2/3 predicted twice as slow: not measured
        # ZeRO-0's interval holds its lucky run, so the two stay tied however many runs they get:
        # by default that is seen at 3 runs each; refined, they are measured to the cap for nothing.
        zero0 = next(r for r in report.records if stage(r) == 0)
        assert zero0.interval.lo == 0.90 and zero0.interval.overlaps(report.best.interval)
        n = 6 if refine else 3
        assert report.tied() == [zero0] and zero0.n_runs == report.best.n_runs == n
        assert ("still tied" if refine else "no number of runs up to 6 each can undo") in report.confirmed
        assert report.launched == 2 * n == len(calls) and report.trial_s == 2.0 * n


def test_one_slow_run_of_the_best_does_not_keep_the_search_exploring(tiny):
    # What happened on a shared 2-core VM: the best one's second run fell in a slow spell (1.40
    # against 1.00 and 1.01). ZeRO-1 is predicted 12% slower, and is really 15% slower: even
    # 8% faster than predicted it cannot beat a median of 1.00 by 3%, so the search stops. On
    # the interval's high end (1.40, the slowest of 3 runs) it would have gone on to measure
    # ZeRO-1, and everything after it, on the strength of that one run.
    runs = {0: [1.00, 1.40, 1.01], 1: [1.15], 2: [2.0], 3: [2.0]}
    predicted = FixedEstimator(lambda t: {0: 1.0, 1: 1.12, 2: 2.0, 3: 2.0}[t.methods.zero_stage])
    calls: list[int] = []
    cfg = SearchConfig(
        engines=["deepspeed"], zero_stages=[0, 1, 2, 3], offloads=["none"], recomputes=["none"], margin=0.03,
        pred_error=0.08,
    )  # fmt: skip
    report = search(tiny("hardware.mem_gib=1", ONE_MB), cfg, scripted(1, lambda t: 0.0, calls, by_stage(runs)),
                    predicted, **QUIET)  # fmt: skip
    assert {stage(r) for r in report.records} == {0} and report.launched == 3 == len(calls)
    assert report.best.interval.hi == 1.40 and report.best.step_time_s == 1.01
    assert "can beat 1.010 s/step (median of 3 runs)" in report.stopped
    assert "the next is predicted at 1.131 s" in report.stopped  # 1.12 x the calibration 1.01/1.0


def test_the_stop_rule_allows_for_the_predictors_own_error(tiny, tmp_path, monkeypatch):
    # What happened to Pythia-31M: ZeRO-1 is predicted 6% slower than ZeRO-0, which is measured
    # first, but it is really 7% faster. Taking the predictions as exact, the search stops before
    # ZeRO-1; allowing them to be 10% off, it measures ZeRO-1, which wins. ZeRO-2 is predicted
    # twice as slow: far outside any error, never measured.
    truth = {0: 1.00, 1: 0.93, 2: 2.0, 3: 2.0}
    predicted = FixedEstimator(lambda t: {0: 1.00, 1: 1.06, 2: 2.0, 3: 2.0}[t.methods.zero_stage])
    space = dict(engines=["deepspeed"], zero_stages=[0, 1, 2, 3], offloads=["none"], recomputes=["none"], margin=0.03)
    found = {}
    for err in (0.0, 0.10):
        run = scripted(1, lambda t: truth[t.methods.zero_stage], [])
        cfg = SearchConfig(**space, pred_error=err)
        report = search(tiny("hardware.mem_gib=1", ONE_MB), cfg, run, predicted, **QUIET)
        found[err] = (stage(report.best), {stage(r) for r in report.records})
        assert f"even {err:.0%} faster than predicted" in report.stopped
    assert found == {0.0: (0, {0}), 0.10: (1, {0, 1})}
    # By default the error is the one published for this kind of device, 10% where there is none.
    from suite.search import prediction_error

    monkeypatch.setattr(paths, "accuracy_dir", lambda: tmp_path)
    err, why = prediction_error(tiny(), SearchConfig())
    assert err == 0.10 and why.startswith("no cpu accuracy published") and why.endswith("10% assumed")
    (tmp_path / "cpu.json").write_text(json.dumps({"step_time_err_pct": {"n": 40, "median": 12.5}}))
    err, why = prediction_error(tiny(), SearchConfig())
    assert err == pytest.approx(0.125) and "n=40 CPU trials in CPU workers of this machine" in why
    assert prediction_error(tiny(), SearchConfig(pred_error=0.2)) == (0.2, "search.pred_error")


def test_confirmation_separates_close_rivals_and_leaves_far_ones_alone(tiny):
    # ZeRO-0 and ZeRO-3 are the same speed; ZeRO-1's single run (1.02) is close to ZeRO-0's
    # but its next runs are slower; ZeRO-2 (1.5) is far from everything.
    runs = {
        0: [1.00, 1.01, 0.99, 1.00, 1.01, 0.99],
        1: [1.02, 1.05, 1.06],
        2: [1.5],
        3: [1.005, 0.995, 1.00, 1.01, 0.99, 1.00],
    }

    def confirmed(**settings):
        run = scripted(1, lambda t: 0.0, [], by_stage(runs))
        report = SearchReport()
        for z in range(4):
            t = with_methods(tiny("hardware.mem_gib=1", ONE_MB), zero_stage=z, micro_batch=1)
            report.add(t, run(t))
        confirm(report, SearchConfig(min_runs=3, max_runs=6, **settings), run, **QUIET)
        return report, {stage(r): r.n_runs for r in report.records}

    # By default ZeRO-3 (1.005, inside ZeRO-0's [0.99, 1.01]) gets the 3 runs the best one has,
    # and is then settled: tied at any number of runs up to 6. ZeRO-1's (1.02) is outside: it
    # may separate, and does. ZeRO-2 is never run again.
    report, got = confirmed()
    assert got == {0: 3, 1: 3, 2: 1, 3: 3} and "no number of runs up to 6 each can undo" in report.confirmed
    assert [stage(r) for r in report.tied()] == [3] and "a single run: no interval" not in summary(tiny(ONE_MB), report)
    report, got = confirmed(refine_ties=True)
    assert got == {0: 6, 1: 3, 2: 1, 3: 6}  # 1 separated at 3 runs; 2 never re-measured; 0 and 3 to the cap
    assert stage(report.best) in (0, 3) and [stage(r) for r in report.tied()] == [3 - stage(report.best)]
    zero1 = next(r for r in report.records if stage(r) == 1)
    assert zero1.interval.lo > report.best.interval.hi  # separated: [1.02, 1.06] above [0.99, 1.01]
    assert report.best.interval.level == pytest.approx(1 - 2 / 2**6)
    text = summary(tiny(ONE_MB), report)
    assert "median of 6 runs; 96.9% interval 0.990-1.010 s" in text
    assert "tied with the best (their intervals overlap" in text and "ZeRO-1" not in text.split("tied with")[1]
    log = log_of(tiny(ONE_MB), report)
    assert log["tied"] == [r.trial_id for r in report.tied()] and log["best_interval"]["level"] > 0.95
    assert log["best_interval"]["lo"] == 0.99 and log["best_interval"]["n"] == 6


def test_a_rival_measured_once_in_a_slow_spell_is_compared_with_the_best_run_beside_it(tiny, monkeypatch):
    # What happened to Pythia-31M: the machine ran slow (x1.4) for its first runs, then fast.
    # ZeRO-1 (really 1.00) got its one run in the slow spell: 1.42. ZeRO-0 (really 1.03) got
    # 1.40 beside it, then 1.02 and 1.03 in the fast spell. On intervals alone, ZeRO-1's run
    # (given ZeRO-0's relative interval, [1.41, 1.93]) misses ZeRO-0's [1.02, 1.40]: separated,
    # and ZeRO-0 wins. Beside ZeRO-0's run of the same minute it was 1.4% slower, within the 3%
    # margin: it is measured again, in the fast spell, and wins.
    clock = iter([0, 30, *range(600, 10_000, 60)])  # ZeRO-0, ZeRO-1 a minute apart, the rest later
    real = record.provenance
    monkeypatch.setattr(
        record, "provenance", lambda device: {**real(device), "date": datetime.fromtimestamp(next(clock)).isoformat()}
    )
    runs = {0: [1.40, 1.02, 1.03, 1.03, 1.02, 1.03], 1: [1.42, 1.00, 1.00, 1.01, 1.00, 1.00]}

    def slow_then_fast(t, k):
        return runs[t.methods.zero_stage][min(k, 5)]

    report, calls = SearchReport(), []
    run = scripted(1, lambda t: 0.0, calls, slow_then_fast)
    for z in (0, 1):
        t = with_methods(tiny("hardware.mem_gib=1", ONE_MB), zero_stage=z, micro_batch=1)
        report.add(t, run(t))
    more = report.best
    assert stage(more) == 0  # 1.40 against 1.42
    zero1 = next(r for r in report.records if stage(r) == 1)
    assert side_by_side(zero1, more) == pytest.approx(1.42 / 1.40)
    # ZeRO-0's two fast runs, then the rule with and without the run beside it:
    cfg = SearchConfig(min_runs=3, max_runs=6)
    while (more := report.best).n_runs < 3:
        more_runs(report, more, run)
    zero1 = next(r for r in report.records if stage(r) == 1)
    assert not zero1.interval.overlaps(report.best.interval)
    assert may_tie(zero1, report.best, cfg) and not may_tie(zero1, report.best, SearchConfig(margin=0.01))
    confirm(report, cfg, run, **QUIET)
    assert stage(report.best) == 1 and report.best.step_time_s == pytest.approx(1.00)
    assert report.best.n_runs == 3 and [stage(r) for r in report.tied()] == [0]  # ZeRO-0's slow run
    assert "no number of runs up to 6 each can undo" in report.confirmed and len(calls) == 6


def test_a_configuration_that_fits_only_sometimes_drops_out(tiny):
    runs = {0: [0.95, 1.0, None], 1: [1.00, 1.01, 0.99, 1.00, 1.01, 0.99]}  # ZeRO-0 runs out of memory on run 3
    run = scripted(1, lambda t: 0.0, [], by_stage(runs))
    report = SearchReport()
    for z in (0, 1):
        t = with_methods(tiny("hardware.mem_gib=1", ONE_MB), zero_stage=z, micro_batch=1)
        report.add(t, run(t))
    confirm(report, SearchConfig(min_runs=3, max_runs=6), run, **QUIET)
    zero0 = next(r for r in report.records if stage(r) == 0)
    assert zero0.outcome == "oom" and zero0.metrics == {} and len(zero0.runs) == 3
    assert zero0.message.startswith("fits only sometimes: run 3 ended oom after 2 ok run(s)")
    assert stage(report.best) == 1 and report.tied() == []
    assert "separated" in report.confirmed


def test_search_settings_are_checked_together():
    found = search_problems(SearchConfig(min_runs=1, max_runs=0, margin=1.5, pred_error=-0.1, budget_s=-1))
    assert len(found) == 5 and "search.min_runs=1 must be >= 2" in found[0]


def test_the_search_covers_both_engines_and_asks_the_predictor_in_seconds():
    """The default search space holds DeepSpeed's four stages and FSDP2's two modes; the
    predictor behind the search's interface orders memory as sharding and recomputation say,
    and gives seconds (an A100 profile: datasheet constants, no calibration needed)."""
    from suite.space import combinations, shardings

    cfg = SearchConfig(offloads=["none"], recomputes=["none", "full"])
    assert [(s["engine"], s["zero_stage"], s["reshard_after_forward"]) for s in shardings(cfg)] == [
        ("deepspeed", 0, None), ("deepspeed", 1, None), ("deepspeed", 2, None), ("deepspeed", 3, None),
        ("fsdp2", 0, False), ("fsdp2", 0, True),
    ]  # fmt: skip
    base = make_trial(["model=pythia-160m", "hardware=a100-80gb", "hardware.count=4", "methods.micro_batch=4"])
    trials = combinations(base, cfg)
    assert len(trials) == 12
    est = Predictor()
    mem = {methods_label(t): est.estimate(with_methods(t, micro_batch=4)) for t in trials}
    states = {methods_label(t): est.predict(t).model_states_gib for t in trials}
    z = [states[f"{s} offload=none recompute=none attn=sdpa"] for s in ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3")]
    # ZeRO-1/2 shard the optimizer; ZeRO-2's accumulation buffers of the partition (whole parameters) can make it
    # hold more than ZeRO-1 between steps (suite.predict.memory, measured on CPU within 3%); ZeRO-3 the least.
    assert z[0] > max(z[1], z[2]) and min(z[1], z[2]) > z[3]
    fsdp = [f"FSDP2 {m} offload=none recompute=none attn=sdpa" for m in ("full_shard", "shard_grad_op")]
    assert states[fsdp[0]] == states[fsdp[1]] < z[0]  # both shard every state; full_shard regathers
    assert mem[fsdp[0]].mem_gib < mem[fsdp[1]].mem_gib  # shard_grad_op holds parameters forward to backward
    plain, rc = mem["DDP offload=none recompute=none attn=sdpa"], mem["DDP offload=none recompute=full attn=sdpa"]
    assert rc.mem_gib < plain.mem_gib and rc.step_time > plain.step_time
    assert 0.01 < plain.step_time < 60  # seconds per step of 1024 x 2048 tokens on 4 A100s


def test_sweep_size_counts_the_basic_sweepers_jobs():
    assert sweep_size({"methods.zero_stage": "0,1,2,3"}, ["model=a,b", "methods.recompute=none,full"]) == 16
    assert sweep_size({"methods.zero_stage": "0,1,2,3"}, ["methods.zero_stage=0,1"]) == 2  # the command line wins
    assert sweep_size({}, ["model=a"]) == 1


def test_progress_prints_count_best_and_time_left_without_a_tty(tiny):
    out = io.StringIO()
    p = Progress(total=4, stream=out)
    t = tiny()
    rec = Record.new(t, "test", "ok", "", figures(1.5), 1.0)
    p.begin("x")
    p.end(rec, "line one")
    text = out.getvalue()
    assert "line one" in text and "1/4 trials done" in text and "left" in text and "1.500 s/step" in text
    assert "\r" not in text  # no live ticker in a log


# --- real sweeps ---------------------------------------------------------------------------

# Pythia-14M at sequence 128 on two workers of 0.45 GiB: micro-batch 4 runs out of memory.
SMALL = CPU_RECIPE + ["model.recipe.seq_len=128", "hardware.mem_gib=0.45", "wandb.mode=disabled"]


def cli(args: list[str], timeout: int = 600, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=timeout, **kw)


@pytest.fixture(scope="module")
def small_grid(tmp_path_factory):
    """A real Hydra multirun: ZeRO 0/1 x offload none/optimizer x micro-batch 2, 4."""
    d = tmp_path_factory.mktemp("grid")
    out = cli(
        [
            "cli.bench",
            "-m",
            *SMALL,
            f"store.dir={d}",
            "methods.zero_stage=0,1",
            "methods.offload=none,optimizer",
            "methods.micro_batch=2,4",
        ]
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return d, out


@pytest.mark.slow
def test_a_grid_through_hydra_multirun_records_every_outcome(small_grid):
    d, out = small_grid
    recs = [json.loads(p.read_text()) for p in d.glob("*.json")]
    seen = sorted(
        (
            r["trial"]["methods"]["zero_stage"],
            r["trial"]["methods"]["offload"],
            r["trial"]["methods"]["micro_batch"],
            r["outcome"],
        )
        for r in recs
    )
    assert len(recs) == 8 and len({r["trial_id"] for r in recs}) == 8, seen
    outcomes = {r["outcome"] for r in recs}
    assert {"ok", "oom", "invalid"} <= outcomes
    invalid = [r for r in recs if r["outcome"] == "invalid"]
    assert len(invalid) == 2 and all(r["wall_s"] == 0 for r in invalid)  # offload without sharding
    assert all("needs sharding" in r["message"] for r in invalid)
    assert "8/8 trials done" in out.stdout
    # Out of memory under the CPU budget (RLIMIT_DATA in each worker): the allocator's own words.
    oom = [r for r in recs if r["outcome"] == "oom"]
    assert oom and all("allocate" in r["message"] or "MemoryError" in r["message"] for r in oom)
    assert all(workers_of(Trial.from_json(r["trial"])) == [] for r in recs)  # no worker outlives its trial


@pytest.mark.slow
def test_search_finds_the_grids_winner_and_the_real_memory_limit(small_grid, calibrated):
    d, _ = small_grid
    out = cli(
        [
            "cli.search",
            *SMALL,
            f"store.dir={d}",
            "search.zero_stages=[0,1]",
            "search.offloads=[none,optimizer]",
            "search.recomputes=[none]",
            "search.min_runs=2",  # a short confirmation: two runs of each contender
            "search.max_runs=2",
        ]
    )
    assert out.returncode == 0, out.stderr[-3000:]
    log = json.loads((d / "search-pythia-14m-cpu-x2.json").read_text())
    recs = {p.stem: json.loads(p.read_text()) for p in d.glob("*.json") if not p.name.startswith("search-")}
    grid = [r for r in recs.values() if r["sweep"] == "adhoc" and r["outcome"] == "ok"]
    winner = min(grid, key=lambda r: r["metrics"]["step_time_s"])
    found = recs[log["best"]]
    assert found["metrics"]["runs"] == 2 and log["best_interval"]["n"] == 2  # confirmed before it is named
    assert log["search"]["min_runs"] == 2 and log["search"]["zero_stages"] == [0, 1]  # its settings, as JSON
    same = found["trial"]["methods"] == winner["trial"]["methods"]
    intervals = [Record.from_json(r).interval for r in (found, winner)]
    # Or tied with the fastest. Real trials minutes apart on a shared 2-core machine drift by up to
    # a fifth (a loaded fresh clone's ran the same trial 1.2x slower), so a real pick is only
    # held to that; the exact pick on a grid's figures: test_a_replayed_search_meets_the_recorded_noise...
    near = found["metrics"]["step_time_s"] <= 1.25 * winner["metrics"]["step_time_s"]
    assert same or intervals[0].overlaps(intervals[1]) or near, (found["trial"]["methods"], winner["trial"]["methods"])
    assert "best:" in out.stdout and "for 143,000 steps" in out.stdout and "confirmation:" in out.stdout
    # The micro-batch limit it reports is real: that one ran, and the next divisor did not fit.
    for name, mb in log["largest_fit"].items():
        ran = [
            r
            for r in recs.values()
            if r["trial_id"] in log["trials"] and methods_label(Trial.from_json(r["trial"])) == name
        ]
        by_mb = {r["trial"]["methods"]["micro_batch"]: r["outcome"] for r in ran}
        assert by_mb[mb] == "ok"
        bigger = [m for m in (1, 2, 4) if m > mb]
        if bigger:
            assert by_mb.get(bigger[0]) == "oom", (name, by_mb)


@pytest.mark.slow
def test_a_sweep_killed_with_sigkill_resumes_its_runs_without_loss_or_duplicates(tmp_path):
    """A sweep of two trials of two runs each, killed with SIGKILL once the second trial's second
    run has started, then run again: its workers died with it; the finished trial is served from
    the store untouched; the other keeps its first run as it was (the cut-off run left no trace),
    gets one run now, and its one record holds both runs in order, summarised by hand."""
    how = ["measure.repeats=2", "measure.timeout_s=600"]  # a loaded machine may start workers slowly
    args = ["cli.bench", "-m", *ONE, *how, "wandb.mode=disabled", f"store.dir={tmp_path}", "methods.zero_stage=0,1"]
    done_t, cut_t = (make_trial(ONE + how + [f"methods.zero_stage={z}"]) for z in (0, 1))
    cut = store.path_for(tmp_path, cut_t.id)
    proc = subprocess.Popen([sys.executable, "-m", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while not (cut.exists() and workers_of(cut_t)):  # its first run stored, the workers of its second started
        assert time.monotonic() < deadline and proc.poll() is None, "the sweep never reached the second run"
        time.sleep(0.1)
    children = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    psutil.wait_procs(children, timeout=10)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]  # workers died too
    done = store.path_for(tmp_path, done_t.id)
    done_mtime, first = done.stat().st_mtime_ns, json.loads(cut.read_text())
    assert len(json.loads(done.read_text())["runs"]) == 2
    assert len(first["runs"]) == 1 and first["metrics"]["runs"] == 1  # run 1 whole, run 2 left no trace

    out = cli(args)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("from store") == 1 and "1 of 2 runs measured now" in out.stdout
    assert done.stat().st_mtime_ns == done_mtime  # the finished trial was not run again
    assert sorted(p.name for p in tmp_path.glob("*.json")) == sorted([done.name, cut.name])  # one record per trial
    rec = json.loads(cut.read_text())
    assert rec["outcome"] == "ok" and len(rec["runs"]) == 2 and rec["metrics"]["runs"] == 2
    assert rec["runs"][0] == first["runs"][0]  # the run before the kill, kept as it was
    dates = [r["provenance"]["date"] for r in rec["runs"]]
    assert dates == sorted(dates)
    times = [r["metrics"]["step_time_s"] for r in rec["runs"]]
    assert rec["metrics"]["step_time_s"] == pytest.approx(sum(times) / 2)  # the median of two
    assert (rec["metrics"]["step_time_ci_lo_s"], rec["metrics"]["step_time_ci_hi_s"]) == (min(times), max(times))
    # Fresh processes each time: every run starts from the same weights and batches, so its losses are the
    # first run's; a process that went on training would have moved on.
    losses = [r["metrics"]["loss_per_step"] for r in rec["runs"]]
    assert losses[0][0] != losses[0][-1]
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_broken_wandb_setup_is_a_warning_not_a_failed_trial(tmp_path, capsys, tiny):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")  # W&B cannot make its folder here
    rec = Record.new(tiny(), "s", "ok", "", figures(1.0), 1.0)
    before = json.dumps(rec.to_json())
    tracking.log_trial(rec, "offline", "p", str(blocker / "sub"))  # returns: nothing raised
    assert "W&B logging failed, the trial result is kept" in capsys.readouterr().err
    assert json.dumps(rec.to_json()) == before  # the record is left as it was


def test_a_replayed_search_meets_the_recorded_noise_in_the_order_it_came(tiny, tmp_path):
    # benchmarks.search_replay: the grid's figures are the truth, the noise store's runs over
    # their median are the machine's noise, in the order they were measured.
    from benchmarks import search_replay as replay

    def stored(d: Path, t: Trial, times: list[float]) -> None:
        rec = None
        for k, x in enumerate(times):
            rec = add_run(rec, t, "test", "ok", "", figures(x), 1.0)
            rec.runs[-1].provenance = {"date": f"2026-12-01T10:00:0{len(times) - k}+00:00"}
        store.save(d, rec)

    base = tiny("hardware.mem_gib=1", ONE_MB)
    truth = {(z, rc): 1.0 if (z, rc) == (1, "none") else 1.3 + 0.1 * z for z in range(4) for rc in ("none", "full")}
    for (z, rc), x in truth.items():
        stored(tmp_path / "grid", with_methods(base, zero_stage=z, recompute=rc, micro_batch=1), [x, x, x])
    stored(tmp_path / "noise", base, [3.0, 1.0, 2.0])  # dated backwards: measured 2.0, then 1.0, then 3.0
    series, about = replay.noise_series(tmp_path / "noise", "median")
    assert series == [1.0, 0.5, 1.5] and about["runs"] == 3 and about["over_1_2"] == pytest.approx(1 / 3)

    records = replay.load(tmp_path / "grid")
    grid = {replay.key(r.trial.methods): r for r in records}
    machine = replay.Replay(grid, series, 1, "median")
    t = with_methods(base, zero_stage=1, recompute="none", micro_batch=1)
    first = machine(with_measure(t, repeats=3))
    assert first.record.step_times() == [0.5, 1.5, 1.0]  # from the second factor, around
    assert first.fresh_runs == 3 and first.record.runs[0].date < first.record.runs[2].date

    # A quiet machine: ZeRO-1 is predicted and measured fastest; the next is predicted 30% slower,
    # beyond the predictor's error, so the search stops after the best one's 3 runs: 3 of the
    # grid's 24 seconds, the grid's winner every time.
    predicted = FixedEstimator(lambda t: truth[(t.methods.zero_stage, t.methods.recompute)])
    row = replay.replay_model(base.model.name, records, [1.0], "median", 4, 0, predicted)
    assert row["grid_trial_s"] == 24.0 and row["runs_launched_median"] == 3
    assert row["share_of_grid_time"]["max"] == pytest.approx(3 / 24) and row["share_of_grid_time"]["over_target"] == 0
    assert row["winner_slower"]["max"] == 0.0
