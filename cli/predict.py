"""`suite-predict`: predicted memory, step time, days and cost of a model on hardware nobody here
has measured, every figure labelled predicted and shown with the error measured so far.

    suite-predict model=pythia-1b hardware=a6000 hardware.count=4     # every valid configuration, ranked
    suite-predict model=pythia-1b hardware=all                         # the best configuration per GPU budget
    suite-predict model=pythia-1b hardware=a100-80gb hardware.count=8 cluster.nodes=4
    suite-predict model=pythia-1b hardware=a100-80gb hardware.count=8 search.fixed=true \
        methods.engine=fsdp2 methods.recompute=selective methods.micro_batch=8   # one configuration, as given
    suite-predict calibrate hardware=cpu [--quick]                     # measure this machine's constants

Overrides are Hydra's, as for suite-bench (conf/). The configurations are the methods of `search.*`
times every micro-batch dividing the per-device batch (analysis/predicted.py); docs/predictor.md
says how each figure is made. Writes the table as CSV to reports/predict/. Bad input exits 2.
"""

from __future__ import annotations

import csv
import math
import sys
from dataclasses import replace
from pathlib import Path

from analysis import ReportError
from analysis.predicted import describe_error, error_note, one_hardware
from analysis.prices import gpu_keys, load_prices
from suite.config import compose
from suite.config.schema import GPU_COUNTS, Trial

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


def _columns(err: dict[str, str]) -> str:
    mem, time = err["mem_short"], err["time_short"]
    return f"{'fits':<5} {'GiB/GPU ' + mem:>14} {'s/step ' + time:>14} {'MFU':>6} {'days':>8} {'cloud $':>10}"


def _cells(r: dict) -> str:
    mfu = _num(r["mfu"] and 100 * r["mfu"], "5.1f") + ("%" if r["mfu"] else " ")
    return (
        f"{'yes' if r['fits'] else 'no':<5} {_num(r['device_gib'], '14.2f')} {_num(r['step_time_s'], '14.3f')} "
        f"{mfu:>6} {_num(r['days'], '8.1f')} {_num(r['cloud_usd'], '10,.0f')}"
    )


def table(rs: list[dict], err: dict[str, str]) -> list[str]:
    head = f"{'#':>3}  {'configuration':<48} {_columns(err)}"
    return [head, "-" * len(head)] + [f"{i:>3}  {r['config']:<48} {_cells(r)}" for i, r in enumerate(rs, 1)]


def budgets(overrides: list[str]) -> list[list[str]]:
    """The hardware overrides to predict: the one given, or with hardware=all every GPU type at
    every count of one node."""
    if "hardware=all" not in overrides:
        return [[]]
    return [[f"hardware={gpu}", f"hardware.count={n}"] for gpu in compose.gpu_profiles() for n in GPU_COUNTS]


def composer(rest: list[str]):
    """compose(rest + hardware + extra), with Hydra run once per `extra` where no override of
    `rest` touches hardware: the other GPU types of hardware=all are swapped in
    (`compose.with_hardware`), 25 s -> a few for 84 budgets."""
    own = any(o.split("=", 1)[0].lstrip("+~").startswith(("hardware", "experiment")) for o in rest)
    bases: dict[tuple[str, ...], object] = {}

    def composed(hardware: list[str], extra: list[str]):
        pair = len(hardware) == 2 and hardware[0].startswith("hardware=") and hardware[1].startswith("hardware.count=")
        if own or not pair:
            return compose.compose(rest + hardware + extra)
        gpu, count = (h.partition("=")[2] for h in hardware)
        if tuple(extra) not in bases:
            bases[tuple(extra)] = compose.compose(rest + hardware + extra)
        return compose.with_hardware(bases[tuple(extra)], gpu, int(count))

    return composed


def _one(composed, hardware: list[str], every: bool, prices, keys):
    """(base, rows, predictor, label) of one budget. Under hardware=all a profile that cannot run
    the recipe's precision (bf16 on a V100) is predicted at fp16, and says so; one that cannot run
    the model at all is a row saying why (rows None), never the end of the command."""
    from suite.predict import Predictor
    from suite.predict.machine import NotCalibrated
    from suite.predict.timing import Network

    label = ""
    for extra in ([], ["methods.precision=fp16"]) if every else ([],):
        cfg = composed(hardware, extra)
        predictor = Predictor(network=Network(cfg.cluster.network_gbps, cfg.cluster.network))
        try:
            base, rs = one_hardware(cfg, predictor, prices, keys)
            return base, rs, predictor, label
        except NotCalibrated as e:
            raise ReportError(str(e)) from None
        except ReportError as e:
            if not every:
                raise
            label, why = f"fp16 ({cfg.model.recipe.precision} unsupported)", str(e)
    return compose.trial_from_cfg(cfg), None, predictor, f"cannot run: {why}"


def predict_main(overrides: list[str]) -> None:
    every = "hardware=all" in overrides
    rest = [o for o in overrides if o != "hardware=all"]
    prices, keys = load_prices(), gpu_keys()
    summary, written = [], []
    composed = composer(rest)
    for hardware in budgets(overrides):
        base, rs, predictor, label = _one(composed, hardware, every, prices, keys)
        err = error_note(base.hardware.device)
        nodes = f" x {base.nodes} nodes ({predictor.network.name})" if base.nodes > 1 else ""
        budget = base.hardware.name + nodes
        if every:
            best = next((r for r in rs if r["fits"]), None) if rs is not None else None
            summary.append((budget, best, err, label))
            continue
        print(f"PREDICTED, not measured: {base.model.name} on {budget} ({base.hardware.mem_gib:g} GiB per device)")
        print(f"  {len(rs)} valid configurations; constants: {predictor.machine(base).source}")
        print(f"  error so far: {describe_error(err)}")
        print("\n".join("  " + line for line in table(rs, err)))
        written.append(write_csv(base, rs, err))
    if every:
        model = next((o.split("=", 1)[1] for o in rest if o.startswith("model=")), "the model")
        print(f"PREDICTED, not measured: the best configuration of {model} per hardware profile")
        err = summary[0][2] if summary else error_note("cuda")
        head = f"{'hardware':<18} {'best configuration':<48} {_columns(err)}"
        print(head + "\n" + "-" * len(head))
        for budget, best, _, label in summary:
            cells = (
                f"{best['config']:<48} {_cells(best)}" if best else "" if label.startswith("cannot") else "does not fit"
            )
            print(f"{budget:<18} {cells}" + (f"  [{label}]" if label else ""))
        print(f"error so far: {describe_error(err)}")
    for path in written:
        print(f"wrote {path}")


def write_csv(base: Trial, rs: list[dict], err: dict) -> Path:
    """Every predicted configuration of one budget, as CSV, each row marked predicted."""
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUT_DIR / f"{base.model.name}-{base.hardware.name}{f'-{base.nodes}nodes' if base.nodes > 1 else ''}.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["predicted", *CSV_FIELDS, "memory_error", "time_error"])
        for r in rs:
            w.writerow(
                ["yes", *(r["config" if k == "configuration" else k] for k in CSV_FIELDS), err["mem"], err["time"]]
            )
    return path


def calibrate_main(overrides: list[str], quick: bool) -> None:
    from suite.calibrate import calibrate
    from suite.config.validate import absent_devices
    from suite.predict.machine import calibration_key, save_calibration

    t = replace(compose.trial(overrides), nodes=1)
    absent = absent_devices(t)
    if absent:
        raise ReportError(f"{absent}: calibrate measures this machine's own devices")
    m = calibrate(t, quick=quick)
    print(f"wrote {save_calibration(m, calibration_key(t.hardware))}")


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
        else:
            predict_main(args)
    except (ReportError, HydraException, OmegaConfBaseException, compose.OverrideError) as e:
        print(f"suite-predict: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
