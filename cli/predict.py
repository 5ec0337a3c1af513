"""`suite-predict`: predicted memory, step time, days and cost of a model on hardware nobody here
has measured, every figure labelled predicted and shown with the error measured so far in its regime
(each row's tag names its regime; the legend under the table gives each regime's labels with their n).

    suite-predict model=pythia-1b hardware=a6000 hardware.count=4     # every valid configuration, ranked
    suite-predict model=pythia-1b hardware=all                         # the best configuration per GPU budget
    suite-predict model=pythia-1b hardware=a100-80gb hardware.count=8 cluster.nodes=4
    suite-predict model=pythia-1b hardware=a100-80gb hardware.count=8 search.fixed=true \
        methods.engine=fsdp2 methods.recompute=selective methods.micro_batch=8   # one configuration, as given
    suite-predict calibrate hardware=cpu [--quick]                     # measure this machine's constants
    suite-predict published-accuracy [--publish [--out F]] [--no-fit] [--rows N] # GPU predictions vs published runs
    suite-predict model=pythia hardware=rtx-3090 hardware.host.mem_gib=128 hardware.host.nvme_gib=931 --largest
        # per memory tier (GPU; + 128 GiB host memory; + a 1 TB NVMe drive) the largest Pythia that trains

Overrides are Hydra's, as for suite-bench (conf/). What is predicted, and which is best, is
`analysis.predicted.predict_budget`, the answer of `suite-report tables --predict` too: the
configurations of `search.*` (suite/space.py) at every micro-batch dividing the per-device batch, a
bf16 recipe at fp16 on a GPU without bf16; docs/predictor.md says how each figure is made. Writes
the table as CSV to reports/predict/. Bad input exits 2.
"""

from __future__ import annotations

import csv
import math
import sys
from dataclasses import replace
from pathlib import Path

from analysis import ReportError, largest, published_runs
from analysis.predicted import PUBLISHED_CAVEAT, Labels, predict_all
from analysis.prices import gpu_keys, load_prices
from suite import nvme
from suite.calibrate import calibrate
from suite.config import compose
from suite.config.schema import Trial
from suite.config.validate import absent_devices
from suite.predict.machine import calibration_key, save_calibration

OUT_DIR = Path("reports/predict")
CSV_FIELDS = (
    "configuration", "fits", "device_gib", "peak_mem_gib", "step_time_s", "mfu", "days", "cloud_usd", "owned_usd"
)  # fmt: skip


def _num(x: float | None, fmt: str) -> str:
    """`x` formatted, or n/a in the same width."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        width = "".join(c for c in fmt.split(".")[0] if c.isdigit())
        return "n/a".rjust(int(width or 0))
    return format(x, fmt)


def _columns() -> str:
    return f"{'fits':<5} {'GiB/GPU':>9} {'±':>6} {'s/step':>10} {'±':>6} {'MFU':>6} {'days':>8} {'cloud $':>10}  regime"


def _cells(r: dict, tag: str) -> str:
    mfu = _num(r["mfu"] and 100 * r["mfu"], "5.1f") + ("%" if r["mfu"] else " ")
    err: Labels = r["labels"]
    return (
        f"{'yes' if r['fits'] else 'no':<5} {_num(r['device_gib'], '9.2f')} {err.memory.cell:>6} "
        f"{_num(r['step_time_s'], '10.3f')} {err.step.cell:>6} {mfu:>6} {_num(r['days'], '8.1f')} "
        f"{_num(r['cloud_usd'], '10,.0f')}  {tag}"
    )


def tags(rs: list[dict]) -> dict[str, str]:
    """A short tag (A, B, ..., Z, AA, ...) per regime of `rs`, in order of first appearance."""
    out: dict[str, str] = {}
    for r in rs:
        regime = r["labels"].regime
        if regime not in out:
            i, tag = len(out), ""
            while True:
                tag = chr(ord("A") + i % 26) + tag
                i = i // 26 - 1
                if i < 0:
                    break
            out[regime] = tag
    return out


def legend(rs: list[dict], tagged: dict[str, str]) -> list[str]:
    """Each tag's regime and its labels in full: step time, memory (GiB/GPU: nvidia-smi's kind), fit."""
    out = [
        "error labels by regime: each ± is the median |predicted - measured| / measured of scored runs in the "
        "regime named, with their n; * where the configuration's own regime has too few and another is shown, named:"
    ]
    seen: dict[str, Labels] = {}
    for r in rs:
        seen.setdefault(r["labels"].regime, r["labels"])
    published = False
    for regime, err in seen.items():
        out += [f"  {tagged[regime]:>2}  {regime}", f"      {err.step.long}", f"      {err.memory.long}"]
        out.append(f"      fit: {err.fit.text}")
        published |= "published runs" in (err.step.origin, err.memory.origin)
    if published:
        out.append(f"  {PUBLISHED_CAVEAT}")
    return out


def table(rs: list[dict]) -> list[str]:
    tagged = tags(rs)
    head = f"{'#':>3}  {'configuration':<48} {_columns()}"
    lines = [f"{i:>3}  {r['config']:<48} {_cells(r, tagged[r['labels'].regime])}" for i, r in enumerate(rs, 1)]
    return [head, "-" * len(head), *lines, *legend(rs, tagged)]


def predict_main(overrides: list[str]) -> None:
    if "--largest" in overrides:  # per memory tier, the largest of a family that trains (analysis/largest.py)
        print("\n".join(largest.report([o for o in overrides if o != "--largest"])))
        return
    every = "hardware=all" in overrides
    found = predict_all(overrides, load_prices(), gpu_keys())
    if every:
        model = next((o.split("=", 1)[1] for o in overrides if o.startswith("model=")), "the model")
        print(f"PREDICTED, not measured: the best configuration of {model} per hardware profile")
        best = [b.best for b in found if b.best]
        tagged = tags(best)
        head = f"{'hardware':<18} {'best configuration':<48} {_columns()}"
        print(head + "\n" + "-" * len(head))
        for b in found:
            label = f"cannot run: {b.why}" if b.why else b.label
            if b.best:
                cells = f"{b.best['config']:<48} {_cells(b.best, tagged[b.best['labels'].regime])}"
            else:
                cells = "" if b.why else "does not fit"
            print(f"{_budget(b):<18} {cells}" + (f"  [{label}]" if label else ""))
        print("\n".join(legend(best, tagged)))
        return
    written = []
    for b in found:
        base = b.base
        at = f", at {b.label}" if b.label else ""
        per_device = f"{base.hardware.mem_gib:g} GiB per device{at}"
        print(f"PREDICTED, not measured: {base.model.name} on {_budget(b)} ({per_device})")
        print(f"  {len(b.rows)} valid configurations; constants: {b.predictor.machine(base).source}")
        print("\n".join("  " + line for line in table(b.rows)))
        written.append(write_csv(base, b.rows))
    for path in written:
        print(f"wrote {path}")


def _budget(b) -> str:
    nodes = f" x {b.base.nodes} nodes ({b.predictor.network.name})" if b.base.nodes > 1 else ""
    return b.base.hardware.name + nodes


def write_csv(base: Trial, rs: list[dict]) -> Path:
    """Every predicted configuration of one budget, as CSV, each row marked predicted, with its labels."""
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUT_DIR / f"{base.model.name}-{base.hardware.name}{f'-{base.nodes}nodes' if base.nodes > 1 else ''}.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["predicted", *CSV_FIELDS, "regime", "memory_error", "time_error", "fit_error"])
        for r in rs:
            err: Labels = r["labels"]
            cells = (r["config" if k == "configuration" else k] for k in CSV_FIELDS)
            w.writerow(["yes", *cells, err.regime, err.memory.long, err.step.long, err.fit.text])
    return path


def calibrate_main(overrides: list[str], quick: bool) -> None:
    cfg = compose.config(overrides)
    t = replace(compose.trial_from_cfg(cfg), nodes=1)
    absent = absent_devices(t)
    if absent:
        raise ReportError(f"{absent}: calibrate measures this machine's own devices")
    swapping = replace(t, methods=replace(t.methods, offload="optimizer", offload_device="nvme"))
    m = calibrate(t, quick=quick, nvme_dir=nvme.resolved(swapping, cfg.store.dir).methods.nvme_path)
    print(f"wrote {save_calibration(m, calibration_key(t.hardware))}")


def published_main(args: list[str]) -> None:
    """Every published training run predicted and scored, out of sample (analysis/published_runs.py);
    --publish writes results/accuracy/cuda-published.json, the error every GPU figure is shown with."""
    import argparse

    ap = argparse.ArgumentParser(prog="suite-predict published-accuracy", description=published_main.__doc__)
    ap.add_argument("--publish", action="store_true", help="write results/accuracy/cuda-published.json")
    ap.add_argument("--out", type=Path, help="with --publish: write there instead (a check that leaves the file be)")
    ap.add_argument("--no-fit", action="store_true", help="the cited constants alone: every sustained fraction 1.0")
    ap.add_argument("--rows", type=int, default=0, help="score only the first N expressible runs (a check)")
    a = ap.parse_args(args)
    s, recs = published_runs.run(a.rows, fit=not a.no_fit)
    print(published_runs.report(s))
    if a.publish:
        print(f"wrote {published_runs.publish(s, recs, a.out)}")


def main(argv: list[str] | None = None) -> int:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    try:
        if args and args[0] == "calibrate":
            calibrate_main([a for a in args[1:] if a != "--quick"], "--quick" in args)
        elif args and args[0] == "published-accuracy":
            published_main(args[1:])
        else:
            predict_main(args)
    except (ReportError, HydraException, OmegaConfBaseException, compose.OverrideError) as e:
        print(f"suite-predict: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
