"""The GPU check: a short set of real trials on one GPU and a verdict on each figure that a first
GPU run could get wrong. Run by scripts/gpu-check.sh (which brings missing packages along):

    python -m suite.gpu_check OUT_DIR   # exit 0: all passed; 1: a verdict failed; 3: no GPU; 4: budget left some out

It covers detection; Pythia-160M under bf16 and fp16 at ZeRO 0-3, with and without recomputation;
sdpa against flash_attention_2 (where flash-attn is installed) and `compile=true`; optimizer
offload; a forced out-of-memory. Verdicts: MFU plausible (HFU where recomputation runs);
no skipped (fp16 overflow) step in the timed window; ZeRO-3's first loss equal to ZeRO-0's; peak
memory against the predictor (`suite.predict`); the trial's GPU is its profile's; after all
trials, no GPU memory held by this process (the launcher). Trials run in priority order within a
time budget (GPU_CHECK_BUDGET_S from GPU_CHECK_START, both set by the script); a trial that the
budget leaves out is reported as not run (exit 4 when nothing failed).

Records: OUT_DIR/records/ (the store: one JSON per trial, worker logs in records/logs/),
OUT_DIR/verdicts.json and OUT_DIR/table.txt (the table printed at the end).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from suite.config import Trial
from suite.record import Record

MODEL = "pythia-160m"
MICRO_BATCH = 16  # 16 x 2048 tokens per micro-step: enough work per kernel for a meaningful MFU
MEASURE = {"warmup_steps": 2, "timed_steps": 3, "max_micro_steps": 2, "timeout_s": 150.0}
MFU_RANGE = (0.20, 0.75)  # what Pythia-160M can plausibly reach on a data-centre GPU
FIRST_LOSS_RTOL = 0.01  # ZeRO-3 against ZeRO-0 at the same seed: the same model, other reduction orders
MEMORY_RTOL = 0.25  # predicted peak memory against the measured one
OOM_MICRO_BATCH = 512  # activations of ~300 GiB at 2048 tokens: out of memory on any GPU today
TRIAL_START_S = 20.0  # each trial's process start, imports, model build and engine set-up, before any step
COMPILE_EXTRA_S = 70.0  # torch.compile's first compilation of Pythia-160M
OPS = ("CPUAdamBuilder", "FusedAdamBuilder")  # DeepSpeed's JIT-compiled ops a trial may load


@dataclass(frozen=True)
class Check:
    """One trial of the check: a name, its methods (over the base trial's) and the verdicts it gets."""

    name: str
    methods: dict[str, Any]
    verdicts: tuple[str, ...]
    cost_s: float = TRIAL_START_S


def plan() -> list[Check]:
    """The check's trials, most important first (a short budget drops the last ones)."""
    timed = ("mfu", "skipped", "memory", "profile")

    def grid(precision: str, stage: int, recompute: str) -> Check:
        extra = ("first_loss",) if stage == 3 else ()
        name = f"{precision} zero={stage} recompute={recompute}"
        return Check(name, {"precision": precision, "zero_stage": stage, "recompute": recompute}, timed + extra)

    first = [grid("bf16", 0, "none"), grid("bf16", 3, "none"), grid("fp16", 0, "none"), grid("fp16", 3, "none")]
    special = [
        Check("forced oom", {"precision": "bf16", "micro_batch": OOM_MICRO_BATCH}, ("oom",)),
        Check("offload optimizer", {"precision": "bf16", "zero_stage": 2, "offload": "optimizer"}, timed),
        Check("flash_attention_2", {"precision": "bf16", "attention": "flash_attention_2"}, ("flash",)),
        Check(
            "compile", {"precision": "bf16", "compile": True}, (*timed, "recompiles"), TRIAL_START_S + COMPILE_EXTRA_S
        ),
    ]
    # Then recomputation at the ends of the ZeRO range, then the middle stages.
    rest = [grid(p, s, "full") for s in (0, 3) for p in ("bf16", "fp16")]
    rest += [grid(p, s, r) for r in ("none", "full") for p in ("bf16", "fp16") for s in (1, 2)]
    return first + special + rest


def trial_of(base: Trial, c: Check) -> Trial:
    methods = {"micro_batch": MICRO_BATCH, "attention": "sdpa", **c.methods}
    return dataclasses.replace(base, methods=dataclasses.replace(base.methods, **methods))


@dataclass
class Row:
    name: str
    outcome: str
    figures: dict[str, Any] = field(default_factory=dict)
    verdicts: dict[str, str] = field(default_factory=dict)
    """verdict name -> 'pass' or 'FAIL: why' (a verdict that cannot be decided fails)."""

    @property
    def passed(self) -> bool:
        return all(v == "pass" for v in self.verdicts.values())


def _rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


def judge(c: Check, rec: Record | None, records: dict[str, Record], predicted_gib: float | None) -> Row:
    """The verdicts of one trial's record; `records` by check name (for ZeRO-3 against ZeRO-0)."""
    if rec is None:
        return Row(c.name, "not run", verdicts={"run": "FAIL: left out by the time budget"})
    m = rec.metrics or {}
    recompute = c.methods.get("recompute", "none") == "full"
    row = Row(c.name, rec.outcome)
    row.figures = {
        "step_time_s": m.get("step_time_s"),
        "mfu": m.get("mfu"),
        "hfu": m.get("hfu"),
        "peak_mem_gib": m.get("peak_mem_gib"),
        "predicted_gib": predicted_gib,
        "skipped": m.get("skipped_steps_discarded"),
        "first_loss": m.get("first_loss"),
        "wall_s": rec.wall_s,
        "message": (rec.message or "")[:160],
    }
    v = row.verdicts
    ok, message = rec.ok, rec.message or ""
    if "oom" in c.verdicts:
        named = "rank 0" in message
        v["oom"] = "pass" if rec.outcome == "oom" and named else f"FAIL: {rec.outcome}: {message}"
        return row
    if "flash" in c.verdicts:
        if ok:
            v["flash"] = "pass"
        elif rec.outcome == "unsupported" and "flash-attn" in message:
            v["flash"] = "pass"  # not installed or not usable here: recorded with its reason, as it should be
        else:
            v["flash"] = f"FAIL: {rec.outcome}: {message}"
        return row
    if not ok:
        v["ok"] = f"FAIL: {rec.outcome}: {message}"
        return row
    if "mfu" in c.verdicts:
        key = "hfu" if recompute else "mfu"
        x = m.get(key)
        lo, hi = MFU_RANGE
        if x is None:
            v[key] = f"FAIL: no {key} (no peak FLOP/s for this precision in the profile?)"
        else:
            v[key] = "pass" if lo <= x <= hi else f"FAIL: {key} {x:.4f} outside {lo:.0%}-{hi:.0%}"
    if "skipped" in c.verdicts:
        n = m.get("skipped_steps_discarded")
        v["skipped"] = "pass" if n == 0 else f"FAIL: {n if n is not None else 'no count'} skipped in the timed window"
    if "first_loss" in c.verdicts:
        zero0 = records.get(c.name.replace("zero=3", "zero=0"))
        a = m.get("first_loss")
        b = zero0.metrics.get("first_loss") if zero0 and zero0.ok else None
        if a is None or b is None:
            v["first_loss"] = f"FAIL: cannot compare (ZeRO-3 {a}, ZeRO-0 {b})"
        else:
            v["first_loss"] = "pass" if _rel(a, b) <= FIRST_LOSS_RTOL else f"FAIL: {a:.4f} against ZeRO-0's {b:.4f}"
    if "memory" in c.verdicts:
        peak = m.get("peak_mem_gib")
        if predicted_gib is None or not peak:
            v["memory"] = f"FAIL: cannot compare (predicted {predicted_gib}, measured {peak})"
        else:
            ratio = predicted_gib / peak
            v["memory"] = "pass" if abs(ratio - 1) <= MEMORY_RTOL else f"FAIL: predicted/measured {ratio:.2f}"
    if "profile" in c.verdicts:
        wrong = m.get("profile_mismatch")
        v["profile"] = "pass" if wrong is None else f"FAIL: ran on {wrong['device_name']} (fits {wrong['detected']})"
    if "recompiles" in c.verdicts:
        n = m.get("recompiles_timed")
        v["recompiles"] = "pass" if n == 0 else f"FAIL: {n if n is not None else 'no count'} recompiles when timed"
    return row


def _fmt(x: Any, kind: str) -> str:
    if x is None:
        return "-"
    if kind == "pct":
        return f"{x:.1%}"
    if kind == "s":
        return f"{x:.3f}"
    if kind == "int":
        return f"{x:.0f}"
    if kind == "gib":
        return f"{x:.2f}"
    if kind == "loss":
        return f"{x:.4f}"
    return str(x)


COLUMNS = [
    ("check", 32, lambda r: r.name),
    ("outcome", 11, lambda r: r.outcome),
    ("step s", 8, lambda r: _fmt(r.figures.get("step_time_s"), "s")),
    ("MFU", 6, lambda r: _fmt(r.figures.get("mfu"), "pct")),
    ("HFU", 6, lambda r: _fmt(r.figures.get("hfu"), "pct")),
    ("peak GiB", 8, lambda r: _fmt(r.figures.get("peak_mem_gib"), "gib")),
    ("pred GiB", 8, lambda r: _fmt(r.figures.get("predicted_gib"), "gib")),
    ("skipped", 7, lambda r: _fmt(r.figures.get("skipped"), "")),
    ("1st loss", 8, lambda r: _fmt(r.figures.get("first_loss"), "loss")),
    ("wall s", 6, lambda r: _fmt(r.figures.get("wall_s"), "int")),
]


def table(rows: list[Row]) -> str:
    """The verdict table: one line per check, its figures, then PASS or what failed."""
    head = "  ".join(f"{name:<{w}}" for name, w, _ in COLUMNS) + "  verdict"
    lines = [head, "-" * len(head)]
    for r in rows:
        cells = "  ".join(f"{get(r):<{w}}"[:w] for _, w, get in COLUMNS)
        failed = [f"{k}: {v.removeprefix('FAIL: ')}" for k, v in r.verdicts.items() if v != "pass"]
        lines.append(f"{cells}  {'PASS' if r.passed else 'FAIL ' + '; '.join(failed)}")
    n_pass = sum(r.passed for r in rows)
    lines.append(f"{n_pass} of {len(rows)} checks passed")
    return "\n".join(lines)


def gpu_apps() -> list[str] | None:
    """The processes holding GPU memory (nvidia-smi), or None when it cannot say."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else None


def build_ops(log) -> Row:
    """Compile DeepSpeed's JIT ops once, side by side, before any trial loads them (a fresh
    machine has none cached); trials then load them from the cache."""
    code = (
        "import sys; from deepspeed.accelerator import get_accelerator as a; a().create_op_builder(sys.argv[1]).load()"
    )
    start = time.monotonic()
    procs = {op: subprocess.Popen([sys.executable, "-c", code, op], stdout=log, stderr=subprocess.STDOUT) for op in OPS}
    failed = [op for op, p in procs.items() if p.wait() != 0]
    row = Row("deepspeed ops " + "+".join(o.removesuffix("Builder") for o in OPS), "ok" if not failed else "crashed")
    row.figures["wall_s"] = round(time.monotonic() - start)
    row.verdicts["build"] = "pass" if not failed else f"FAIL: {', '.join(failed)} did not build (see ops.log)"
    return row


def base_trial(gpu: str) -> Trial:
    """Pythia-160M with its recipe on one GPU of type `gpu`, measured briefly (MEASURE)."""
    from suite.config.compose import trial

    measure = [f"measure.{k}={v}" for k, v in MEASURE.items()] + ["measure.rerun=true"]
    return trial([f"model={MODEL}", f"hardware={gpu}", "hardware.count=1", *measure])


def predicted_gib(t: Trial) -> float | None:
    """The predictor's peak memory per device in the timed window, as the worker measures it
    (`suite.predict`, from the GPU's datasheet), or None when it cannot say."""
    from suite.predict import Predictor

    try:
        return Predictor().predict(t).peak_mem_gib
    except Exception:  # noqa: BLE001 - a verdict that cannot be decided fails; the check goes on
        return None


def finish(out: Path, rows: list[Row]) -> None:
    """Print and write the table; exit 0 (all passed), 1 (a verdict failed) or 4 (none failed,
    but the time budget left checks out)."""
    text = table(rows)
    print("\n" + text)
    (out / "table.txt").write_text(text + "\n")
    (out / "verdicts.json").write_text(json.dumps([dataclasses.asdict(r) for r in rows], indent=1) + "\n")
    left_out = [r for r in rows if r.outcome == "not run"]
    failed = [r for r in rows if not r.passed and r.outcome != "not run"]
    sys.exit(1 if failed else 4 if left_out else 0)


def main() -> None:
    from suite import detect
    from suite.runner import run_one, summary_line

    out = Path(sys.argv[1] if len(sys.argv) > 1 else f"results/gpu-check/{time.strftime('%Y%m%d-%H%M%S')}")
    start = float(os.environ.get("GPU_CHECK_START", time.time()))
    budget_s = float(os.environ.get("GPU_CHECK_BUDGET_S", "320"))
    code, found = detect.diagnose()
    if code == 1:
        print(f"gpu-check: {found}: nothing to check", file=sys.stderr)
        sys.exit(3)
    out.mkdir(parents=True, exist_ok=True)
    row = Row("detect", "ok" if code == 0 else "crashed", {"message": found})
    row.verdicts["detect"] = "pass" if code == 0 else f"FAIL: {found}"
    rows = [row]
    print(f"detect: {found}", flush=True)
    if code != 0:
        finish(out, rows)
    base = base_trial(detect.profile_of(*detect.local_gpus()[0]))  # the check runs on one GPU
    with open(out / "ops.log", "w") as log:
        rows.append(build_ops(log))
    print(f"deepspeed ops: {rows[-1].verdicts['build']} ({rows[-1].figures['wall_s']} s)", flush=True)
    records: dict[str, Record] = {}
    walls: list[float] = []
    checks = plan()
    for c in checks:
        t = trial_of(base, c)
        cost = c.cost_s if not walls else sum(walls) / len(walls) + (c.cost_s - TRIAL_START_S)
        if time.time() - start + cost > budget_s:
            print(f"[    not run] {c.name}: {cost:.0f} s more would pass the {budget_s:.0f} s budget", flush=True)
            continue
        # A trial that hangs may not take the rest of the budget with it.
        left_s = budget_s - (time.time() - start)
        t = dataclasses.replace(
            t, measure=dataclasses.replace(t.measure, timeout_s=min(t.measure.timeout_s, int(left_s)))
        )
        ran = run_one(t, str(out / "records"), "gpu-check", in_sweep=True)
        rec = records[c.name] = ran.record
        if rec.outcome in ("ok", "oom") and not c.methods.get("compile"):
            walls.append(rec.wall_s)
        print(summary_line(ran, t), flush=True)
    for c in checks:
        rec = records.get(c.name)
        ok = rec is not None and rec.ok
        rows.append(judge(c, rec, records, predicted_gib(trial_of(base, c)) if ok else None))
    apps = gpu_apps()
    row = Row("launcher holds no GPU memory", "ok", {"message": f"compute apps: {apps}"})
    if apps is None:
        row.verdicts["launcher"] = "FAIL: nvidia-smi cannot list the processes on the GPU"
    else:
        row.verdicts["launcher"] = "pass" if apps == [] else f"FAIL: nvidia-smi lists {apps} after the trials"
    rows.append(row)
    finish(out, rows)


if __name__ == "__main__":
    main()
