"""A benchmark's output: one JSON result with its schema, its name and its provenance, written
atomically (a reader sees the old file or the new one), and where results go by default."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from suite.files import write_json
from suite.record import provenance as measured_here

ROOT = Path(__file__).resolve().parent.parent
"""The checkout the benchmarks run from."""
RESULTS = ROOT / "results" / "benchmarks"
"""Where a benchmark's result goes unless it is told otherwise; dated figures: its README.md."""
SCHEMA = "suite.benchmark/1"


def write_result(
    path: str | Path, benchmark: str, body: dict[str, Any], device: str = "cpu", provenance: dict | None = None
) -> Path:
    """`body` as the result of `benchmark` at `path`: schema and name first, then the body, then the
    provenance of this machine now (`suite.record.provenance` of `device`) or the one given. A value
    JSON has no type for (a date, a path) is written as its text."""
    doc = {"schema": SCHEMA, "benchmark": benchmark, **body, "provenance": provenance or measured_here(device)}
    return write_json(path, json.loads(json.dumps(doc, default=str)), indent=1)
