"""The one table of metrics (suite/metric_table.py): every metric a record holds is in it, the record
summarises runs by it, and the loader, the page and the docs read what it says."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY, make_trial

from analysis.load import load_results
from leaderboard.page import COLUMNS, metrics_payload
from suite import metric_table
from suite.metric_table import TABLE, Metric
from suite.record import Record, add_run

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = [ROOT / "tests" / "fixtures" / "results", ROOT / "tests" / "fixtures" / "repeats"]


def stored_metrics() -> list[dict]:
    """The metrics of every run and summary of the committed fixture records."""
    out = []
    for d in FIXTURES:
        for p in sorted(d.glob("*.json")):
            rec = Record.from_json(json.loads(p.read_text()))
            out += [rec.metrics, *(r.metrics for r in rec.runs)]
    return out


def test_the_table_imports_nothing_heavy():
    code = "import sys, suite.metric_table; print(sorted(m for m in sys.modules if m in ('torch', 'pandas')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_every_metric_a_record_holds_is_a_row_of_the_table():
    names = {k for m in stored_metrics() for k in m}
    assert names and names <= set(metric_table.BY_NAME), sorted(names - set(metric_table.BY_NAME))


def test_the_docs_hold_the_table_as_generated():
    doc = metric_table.DOC.read_text(encoding="utf-8")
    assert metric_table.with_table(doc) == doc, "run `python -m suite.metric_table` and commit docs/results-format.md"
    assert all(f"| `{m.name}` |" in doc for m in TABLE)


def test_a_bad_row_is_refused_naming_every_problem():
    with pytest.raises(ValueError) as e:
        Metric("x_gib", "GiB", "floaty", "mean", "?", label="x", frame=True)
    text = str(e.value)
    for wrong in ("type 'floaty'", "over_runs 'mean'", "needs a format", "largest of the runs"):
        assert wrong in text


def test_the_record_summarises_runs_as_the_table_says():
    t = make_trial(TINY)
    runs = [  # three runs of a trial, the median one (1.1 s) neither the largest in memory nor the fastest probe
        {"step_time_s": 1.0, "step_time_std_s": 0.01, "peak_mem_gib": 0.5, "probe_flops": 3.0, "noisy": False},
        {"step_time_s": 1.2, "step_time_std_s": 0.02, "peak_mem_gib": 0.7, "probe_flops": 1.0, "noisy": True},
        {"step_time_s": 1.1, "step_time_std_s": 0.03, "peak_mem_gib": 0.6, "probe_flops": 2.0, "noisy": False},
    ]
    rec, flops = None, {"model_flops_per_token": 1e6, "hardware_flops_per_token": 1e6}
    for m in runs:
        rec = add_run(rec, t, "test", "ok", "", m | flops, 1.0)
    m = rec.metrics
    assert metric_table.BY_NAME["peak_mem_gib"].over_runs == metric_table.MAX and m["peak_mem_gib"] == 0.7
    assert metric_table.BY_NAME["probe_flops"].over_runs == metric_table.MEDIAN and m["probe_flops"] == 2.0
    assert metric_table.BY_NAME["noisy"].over_runs == metric_table.ANY and m["noisy"] is True
    assert not set(metric_table.named(metric_table.PER_RUN)) & set(m)  # each run keeps its own
    assert set(metric_table.named(metric_table.OF_RUNS)) <= set(m) and m["runs"] == 3
    assert set(metric_table.named(metric_table.AT_MEDIAN)) <= set(m)  # computed again at the median step
    assert m["step_time_s"] == 1.1 and rec.figure("step_time_within_std_s") > 0
    with pytest.raises(KeyError, match="not a metric of suite.metric_table"):
        rec.figure("step_time")  # a misspelt name is an error, not a missing figure


def test_the_frame_and_the_page_carry_the_tables_metrics():
    frame, _ = load_results(FIXTURES[1])
    same_as_the_trials = {"precision", "attention", "engine"}  # what ran: the frame has the trial's (analysis.load)
    for m in TABLE:
        assert (m.name in frame) == (m.frame or m.name in same_as_the_trials), m.name
        if m.frame and m.numeric:
            assert str(frame[m.name].dtype) == ("float64" if m.type == "float" else "Int64"), m.name
    assert set(metric_table.FRAME) <= set(COLUMNS)
    listed = {m["name"]: m for m in metrics_payload()}
    assert set(listed) == {m.name for m in TABLE if m.label}
    assert listed["peak_mem_gib"] == {
        "name": "peak_mem_gib",
        "label": "peak memory",
        "unit": "GiB",
        "format": "gib",
        "over_runs": "max",
        "description": metric_table.BY_NAME["peak_mem_gib"].description,
    }


def test_the_page_formats_every_format_of_the_table():
    script = (ROOT / "leaderboard" / "page.js").read_text()
    fmt = script[script.index("const FMT = {") : script.index("};", script.index("const FMT = {"))]
    assert set(metric_table.FORMATS) <= set(re.findall(r"^\s+(\w+): ", fmt, re.M))
