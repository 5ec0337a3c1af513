"""Figures at scale: how long `suite-report figures` takes for 5,000 trial records.

The records are copies of the real CPU records of tests/fixtures (results and repeats) with only
their identity changed (`relabel`: model name, GPU profile and count, trial id, as the
leaderboard's tests make theirs): every GPU type of conf/hardware/ at 1, 2,
4 and 8 GPUs under a few model names. Their measurements are the CPU ones, which is all the
figures need to be timed. Timed: the whole command in a fresh process (imports, load, estimates,
figure 5's scoring, six figures written), after one untimed run that fills the trace cache.
Target: at most 30 s.

    python -m benchmarks.figures_scale [--records 5000] [--runs 3] [--work results/tmp/figures_scale] \
        [--out results/benchmarks/figures_scale.json]
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from analysis import figures, plotting
from analysis.estimates import estimated_results
from analysis.load import read_results
from analysis.prices import load_prices
from benchmarks.output import RESULTS, ROOT, write_result
from suite.config import Trial
from suite.config.compose import gpu_profiles

FIXTURES = [ROOT / "tests/fixtures/results", ROOT / "tests/fixtures/repeats"]
MODELS = ("scale-a", "scale-b", "scale-c", "scale-d", "scale-e")
COUNTS = (1, 2, 4, 8)
TARGET_S = 30.0


def relabel(rec: dict, model: str, gpu: str, count: int) -> dict:
    """A copy of a real record with only its identity changed: hardware, model name, trial id."""

    rec = copy.deepcopy(rec)
    rec["trial"]["hardware"].update(gpu_profiles()[gpu], name=f"{gpu}-x{count}", count=count)
    rec["trial"]["model"]["name"] = model
    rec["trial_id"] = Trial.from_json(rec["trial"]).id
    return rec


def make_records(folder: Path, n: int) -> int:
    """`n` relabelled copies of the fixtures' records in `folder` (one model name, GPU type and
    count after another, each with every real record), each a trial of its own (records of one
    model on budgets that differ only in their name become one trial: the first is kept);
    returns how many were written."""

    real = [json.loads(p.read_text()) for d in FIXTURES for p in sorted(d.glob("*.json"))]
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    variants = itertools.product(MODELS, sorted(gpu_profiles()), COUNTS)
    written: set[str] = set()
    for (model, gpu, count), rec in itertools.product(variants, real):
        if len(written) == n:
            break
        copy = relabel(rec, model, gpu, count)
        if copy["trial_id"] not in written:
            (folder / f"{copy['trial_id']}.json").write_text(json.dumps(copy))
            written.add(copy["trial_id"])
    return len(written)


def timed(folder: Path, out: Path) -> tuple[float, str]:
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "cli.report", "figures", str(folder), "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return time.perf_counter() - t0, done.stdout


def phases(folder: Path, out: Path) -> dict[str, float]:
    """The same work in this process, each part timed: load and estimates, figure 5's scoring, and
    each figure's data and drawing (imports not counted: they are done by then)."""

    took: dict[str, float] = {}
    t0 = time.perf_counter()
    results = read_results(folder)
    df = estimated_results(results, load_prices())
    took["load_and_estimates_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    x = figures.Inputs(df, str(folder), None, figures.scored(results))
    took["scoring_s"] = time.perf_counter() - t0
    out.mkdir(parents=True, exist_ok=True)
    for spec in figures.SPECS:
        t0 = time.perf_counter()
        built = spec.build(x)
        took[f"{spec.stem}_data_s"] = time.perf_counter() - t0
        if not isinstance(built, str):
            t0 = time.perf_counter()
            plotting.draw(spec.number, built.data, out / spec.stem)
            took[f"{spec.stem}_draw_s"] = time.perf_counter() - t0
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=5000)
    ap.add_argument("--runs", type=int, default=3, help="timed runs after the untimed one")
    ap.add_argument("--work", type=Path, default=ROOT / "results/tmp/figures_scale")
    ap.add_argument("--out", type=Path, default=RESULTS / "figures_scale.json")
    ap.add_argument("--note", default="", help="the machine and its load, recorded with the result")
    args = ap.parse_args()
    n = make_records(args.work / "records", args.records)
    print(f"{n} records in {args.work / 'records'}")
    first, _ = timed(args.work / "records", args.work / "figures")
    print(f"untimed first run (fills the trace cache): {first:.1f} s")
    times, printed = [], ""
    for i in range(args.runs):
        s, printed = timed(args.work / "records", args.work / "figures")
        times.append(s)
        print(f"run {i + 1}: {s:.1f} s")
    parts = phases(args.work / "records", args.work / "phases")
    print("in one process: " + ", ".join(f"{k} {v:.1f}" for k, v in parts.items()))
    result = {
        "records": n,
        "command": f"suite-report figures {args.work / 'records'} --out {args.work / 'figures'}",
        "first_run_s": first,
        "runs_s": times,
        "median_s": statistics.median(times),
        "phases_s": parts,
        "target_s": TARGET_S,
        "printed": printed.splitlines(),
        "note": args.note,
    }
    write_result(args.out, "figures_scale", result)
    print(f"median of {len(times)}: {result['median_s']:.1f} s (target <= {TARGET_S:g} s) -> {args.out}")


if __name__ == "__main__":
    main()
