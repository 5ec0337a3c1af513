"""Repeated measurement: the statistics against hand-computed values, a trial's record of its
runs (summary, failures, single-run records of before), the settings. A real repeated trial
killed and resumed: test_search.py, in a killed sweep."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import TINY, make_trial

from suite import record, stats, store
from suite.config import Trial
from suite.config.validate import problems
from suite.record import Record, add_run
from suite.runner import wants_run

FIXTURES = Path(__file__).parent / "fixtures" / "results"

# --- statistics, by hand --------------------------------------------------------------------


@pytest.mark.parametrize(
    "n, j, by_hand",
    [
        (1, 1, 0.0),  # one run: [x, x] never holds the median
        (2, 1, 1 - 2 / 4),  # 50%
        (3, 1, 1 - 2 / 8),  # 75%
        (5, 1, 1 - 2 / 32),  # 93.75%
        (6, 1, 1 - 2 / 64),  # 96.875%: the fewest runs for 95%
        (9, 2, 1 - 2 * (1 + 9) / 512),  # 96.09%
        (10, 3, 1 - 2 * (1 + 10 + 45) / 1024),  # 89.06%
        (20, 6, 1 - 2 * (1 + 20 + 190 + 1140 + 4845 + 15504) / 2**20),  # 95.86%
    ],
)
def test_coverage_of_order_statistics_is_binomial(n, j, by_hand):
    assert stats.coverage(n, j) == pytest.approx(by_hand, abs=1e-12)


def test_interval_of_the_median_reports_the_level_it_reaches():
    assert stats.median_interval([3.0]) == stats.Interval(3.0, 3.0, 0.0, 1)
    assert stats.median_interval([2.0, 1.0]) == stats.Interval(1.0, 2.0, 0.5, 2)
    assert stats.median_interval([1.3, 1.1, 1.2]) == stats.Interval(1.1, 1.3, 0.75, 3)
    assert stats.median_interval([5, 1, 4, 2, 3]).level == 0.9375  # below 95%: said so, not claimed
    nine = stats.median_interval([9, 1, 8, 2, 7, 3, 6, 4, 5])  # [min, max] would be 99.6%; [x2, x8] is 96.1%
    assert (nine.lo, nine.hi) == (2, 8) and nine.level == pytest.approx(0.9609375)
    twenty = stats.median_interval(list(range(1, 21)))  # the textbook [x(6), x(15)] for n = 20
    assert (twenty.lo, twenty.hi) == (6, 15)
    assert stats.runs_for_level(0.95) == 6 and stats.runs_for_level(0.5) == 2
    with pytest.raises(ValueError):
        stats.median_interval([])


def test_spreads_ties_and_separation_by_hand():
    assert stats.median([1.0, 3.0, 2.0, 10.0]) == 2.5
    assert stats.between_std([1.0, 2.0, 3.0]) == 1.0 and stats.between_std([5.0]) is None
    assert stats.pooled_std([3.0, 4.0]) == pytest.approx(math.sqrt(12.5))
    a, b, c = stats.Interval(1, 2, 0.75, 3), stats.Interval(3, 4, 0.9375, 5), stats.Interval(2, 3, 0.75, 3)
    assert not a.overlaps(b) and a.overlaps(c) and c.overlaps(b)  # touching ends overlap: tied
    assert stats.separation(a, b) == pytest.approx(0.6875) and stats.separation(a, c) == 0.0
    six = [1.00, 1.01, 1.02, 1.03, 1.04, 1.05]  # [min, max] at 96.9%, 0.05 wide around 1.025
    assert stats.narrow_enough(six, 0.05) and not stats.narrow_enough(six, 0.04)
    assert not stats.narrow_enough(six[:5], 1.0)  # five runs cannot reach 95%, however narrow


def test_an_overlap_more_runs_cannot_undo_is_seen_as_such():
    assert [stats.order(n) for n in (1, 3, 6, 8, 9, 20)] == [1, 1, 1, 1, 2, 6]
    # Up to 8 runs an interval is [min, max]: overlapping ones stay so, a point inside stays inside.
    assert stats.bound_to_overlap([1.0, 1.2, 1.1], [1.15, 1.3, 1.25], cap=6)
    assert stats.bound_to_overlap([1.1], [1.0, 1.2, 1.1], cap=8)
    assert not stats.bound_to_overlap([1.25], [1.0, 1.2, 1.1], cap=6)  # apart now
    # At 9 runs the interval drops the extremes: [x(2), x(8)]. One outlier (0.5) no longer binds.
    assert not stats.bound_to_overlap([0.5, 1.3, 1.3], [1.0, 1.1, 1.0], cap=9)
    assert stats.bound_to_overlap([0.5, 1.0, 1.3], [1.0, 1.1, 1.0], cap=9)
    assert not stats.bound_to_overlap([1.0, 1.0], [1.0, 1.0, 1.0], cap=9)  # two runs: no core yet


def test_bound_to_overlap_holds_whatever_the_runs_still_to_come():
    """Brute force: whenever it says bound, every way of adding runs up to the cap overlaps."""
    import random

    rng = random.Random(0)
    bound = 0
    for _ in range(400):
        cap = rng.choice([3, 6, 9, 12])
        a = [rng.choice(range(10)) for _ in range(rng.randint(1, cap))]
        b = [rng.choice(range(10)) for _ in range(rng.randint(1, cap))]
        if not stats.bound_to_overlap(a, b, cap):
            continue
        bound += 1
        for _ in range(30):
            xa = a + [rng.choice([-100, 100, *range(10)]) for _ in range(rng.randint(0, cap - len(a)))]
            xb = b + [rng.choice([-100, 100, *range(10)]) for _ in range(rng.randint(0, cap - len(b)))]
            assert stats.median_interval(xa).overlaps(stats.median_interval(xb)), (a, b, xa, xb)
    assert bound > 100  # the check was exercised


# --- the record of a trial's runs -----------------------------------------------------------


def fixture_record(outcome: str = "ok") -> dict:
    return next(r for p in sorted(FIXTURES.glob("*.json")) if (r := json.loads(p.read_text()))["outcome"] == outcome)


def runs_of(times: list[float]) -> tuple[Record, dict]:
    """A record of runs of a real fixture trial at these step times (its real metrics otherwise)."""
    old = fixture_record()
    t = Trial.from_json(old["trial"])
    rec = None
    for k, x in enumerate(times):
        m = dict(old["metrics"], step_time_s=x, step_time_std_s=0.01 * (k + 1), peak_mem_gib=0.4 + 0.01 * k)
        rec = add_run(rec, t, "test", "ok", "", m, 10.0 + k)
    return rec, old


def test_a_record_keeps_every_run_and_summarises_them_by_hand():
    rec, old = runs_of([1.0, 1.2, 0.9, 1.1, 1.05])
    m = rec.metrics
    assert rec.schema == record.SCHEMA and rec.outcome == "ok" and len(rec.runs) == 5
    assert rec.step_times() == [1.0, 1.2, 0.9, 1.1, 1.05]
    assert all(r.provenance["date"] and r.wall_s for r in rec.runs)
    assert m["step_time_s"] == 1.05 and m["runs"] == 5
    assert (m["step_time_ci_lo_s"], m["step_time_ci_hi_s"], m["step_time_ci_level"]) == (0.9, 1.2, 0.9375)
    assert m["step_time_between_std_s"] == pytest.approx(math.sqrt(0.05 / 4))  # squares about 1.05 sum to 0.05
    assert m["step_time_within_std_s"] == pytest.approx(math.sqrt((1 + 4 + 9 + 16 + 25) / 5) * 0.01)
    assert "step_time_std_s" not in m  # within a run: only under its own name
    assert m["peak_mem_gib"] == pytest.approx(0.44)  # memory: the largest of the runs
    assert m["tokens_per_s"] == pytest.approx(old["metrics"]["tokens_per_step"] / 1.05)  # at the median
    assert rec.wall_s == sum(10.0 + k for k in range(5))
    assert rec.interval == stats.Interval(0.9, 1.2, 0.9375, 5)
    assert Record.from_json(json.loads(json.dumps(rec.to_json()))) == rec  # its JSON holds all of it


def test_a_run_that_fails_gives_the_trial_its_outcome():
    rec, _ = runs_of([1.0, 1.1])
    t = rec.trial
    oom = add_run(rec, t, "test", "oom", "rank 0: MemoryError", {}, 3.0)
    assert oom.outcome == "oom" and oom.metrics == {} and len(oom.runs) == 3
    assert oom.message == (
        "fits only sometimes: run 3 ended oom after 2 ok run(s) (1.000, 1.100 s/step): rank 0: MemoryError"
    )
    assert not wants_run(oom, make_trial(TINY + ["measure.repeats=5"]))  # decided: not measured again
    crashed = add_run(rec, t, "test", "crashed", "rank 1 killed by SIGKILL", {}, 3.0)
    assert crashed.outcome == "crashed"
    again = crashed.without(("crashed",))  # a crashed run is run again; the good ones stay
    assert again.outcome == "ok" and again.n_runs == 2 and again.runs == rec.runs
    first = Record.new(t, "test", "crashed", "boom", {}, 1.0)
    assert first.without(("crashed",)) is None


def test_a_single_run_record_of_before_loads_as_a_single_run(tmp_path):
    old = fixture_record()
    (tmp_path / f"{old['trial_id']}.json").write_text(json.dumps(old))
    rec = store.load(tmp_path, old["trial_id"])
    assert rec.schema == record.SCHEMA and len(rec.runs) == 1 and rec.runs[0].metrics == old["metrics"]
    m = rec.metrics
    assert m["step_time_s"] == old["metrics"]["step_time_s"] and m["runs"] == 1
    assert m["step_time_ci_lo_s"] == m["step_time_ci_hi_s"] == m["step_time_s"] and m["step_time_ci_level"] == 0.0
    assert m["step_time_within_std_s"] == old["metrics"]["step_time_std_s"] and m["step_time_between_std_s"] is None
    assert rec.provenance == old["provenance"] and rec.wall_s == old["wall_s"]
    invalid = fixture_record("invalid")
    up = Record.from_json(invalid)
    assert up.runs == [] and up.outcome == "invalid" and up.message == invalid["message"]


def test_how_many_runs_a_trial_wants():
    rec, _ = runs_of([1.00, 1.01, 1.02])
    assert wants_run(None, make_trial(TINY))
    assert not wants_run(rec, make_trial(TINY + ["measure.repeats=3"]))
    assert wants_run(rec, make_trial(TINY + ["measure.repeats=4"]))
    assert wants_run(rec, make_trial(TINY + ["measure.repeats=auto"]))  # 3 runs cannot give 95%
    six, _ = runs_of([1.00, 1.01, 1.02, 1.03, 1.04, 1.05])
    assert not wants_run(six, make_trial(TINY + ["measure.repeats=auto", "measure.repeat_width=0.05"]))
    assert wants_run(six, make_trial(TINY + ["measure.repeats=auto", "measure.repeat_width=0.04"]))
    assert not wants_run(
        six, make_trial(TINY + ["measure.repeats=auto", "measure.repeat_width=0.04", "measure.max_repeats=6"])
    )


def test_repeats_are_checked_and_are_not_part_of_the_trial_id():
    base = make_trial(TINY)
    for how in ("measure.repeats=5", "measure.repeats=auto", "measure.max_repeats=20", "measure.repeat_width=0.1"):
        assert make_trial(TINY + [how]).id == base.id
    found = problems(make_trial(TINY + ["measure.repeats=0", "measure.repeat_width=0", "measure.max_repeats=0"]))
    assert "measure.repeats=0 is not allowed; give a number of runs >= 1, or auto" in found
    assert "measure.repeat_width=0.0 must be > 0" in found and "measure.max_repeats=0 must be > 0" in found
    found = problems(make_trial(TINY + ["measure.repeats=auto", "measure.max_repeats=5"]))
    assert found == [
        "measure.max_repeats=5 is too few for measure.repeats=auto: a 95% interval of the median needs at least 6 runs"
    ]
    assert "measure.repeats='often'" in problems(make_trial(TINY + ["measure.repeats=often"]))[0]


def test_a_record_of_an_unknown_or_newer_schema_is_refused_by_name(tmp_path):
    """A store a newer suite wrote (suite.trial/3), or a file of no schema, is never read by guess:
    the store names the file and the schemas it reads; the reports skip it, saying so."""
    from analysis.load import load_results

    rec, _ = runs_of([1.0, 1.1])
    for i, schema in enumerate(("suite.trial/3", None)):
        d = rec.to_json() | {"schema": schema, "trial_id": f"t{i}"}
        (tmp_path / f"t{i}.json").write_text(json.dumps(d))
        with pytest.raises(record.UnknownSchema) as e:
            store.load(tmp_path, f"t{i}")
        assert str(tmp_path / f"t{i}.json") in str(e.value) and repr(schema) in str(e.value)
        assert "this suite reads suite.trial/2 and suite.trial/1" in str(e.value)
    frame, skipped = load_results(tmp_path)
    assert frame.empty and len(skipped) == 2 and all("not a trial record of schema" in s for s in skipped)
