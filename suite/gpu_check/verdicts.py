"""The GPU check's verdicts on its trials' records, its table and its exit code.

Each verdict is `pass`, `FAIL: why`, `skipped: why` (it could not be decided, and says why) or
`not run: why` (the time budget left it out); a row is FAIL if any of its verdicts failed, NOT RUN
if the budget left it out, SKIPPED if nothing in it could be decided, else PASS. What each judges:

- MFU (HFU under recomputation): at most MFU_CEILING, and at least MFU_FLOOR of the lower of two
  expectations, each named: the predictor's figure for the trial, and ZeRO-0's measured MFU
  scaled by the predicted ratio of the two step times (ZeRO-3's hooks and offload's host step cost
  what the predictor says they cost, not one floor for all);
- the weights of a build of its own (ZeRO-3's under zero.Init, FSDP2's): each parameter's element
  count, mean and std, gathered, against ZeRO-0's; and the loss after the warm-up's updates
  against ZeRO-0's, within half of what ZeRO-0's moved in them (`LOSS_SHARE`);
- peak memory against the predictor; no skipped (fp16 overflow) step in the timed window; the GPU
  against its profile; no recompilation in a compiled timed window; the forced out-of-memory
  named on its rank;
- after the trials, no GPU memory held by the launcher: asked of its own process (NVML by pid,
  with a probe process of its own showing that NVML sees this machine's pids).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from suite.config import Trial
from suite.gpu_check.plan import REFERENCE, Check
from suite.predict import Predictor
from suite.record import Record

MFU_CEILING = 0.75  # what Pythia-160M can plausibly reach on a data-centre GPU (HFU under recomputation)
MFU_FLOOR = 0.5  # the predictor's GPU figures are datasheet rooflines no GPU run has scored yet: half of
# what is expected is a fault (host syncs, kernels not the fused ones, a wrong peak), not a prediction error
MEMORY_RTOL = 0.25  # predicted peak memory against the measured one
WEIGHT_RTOL = 0.03  # a few %: bf16 rounding (2^-8) and another draw of the same distribution
WEIGHT_SE = 4.0  # standard errors of a sample's std (std/sqrt(2n)) and mean (std/sqrt(n)) allowed on top
WEIGHT_ATOL = 1e-6  # below bf16's resolution near the init's 0.02: a parameter set to a constant stays it
LOSS_SHARE = 0.5
"""How far the loss after the warm-up's updates may be from the reference's, as a share of how far the
reference's loss moved in them: a build that trains otherwise (no update applied, or twice the step) is
off by about all of it. Compared at the first timed step, not later: on the first GPU run (one H200,
2026-12-04, results/gpu-check/2026-12-04-h200) the bf16 runs were 0.011-0.038 from ZeRO-0's loss after 2
updates (0.07-0.23 of its 0.167 fall), while after 4, at the recipe's peak learning rate from a fresh
init with no warm-up, each draw of the init took its own path (11.06 and 11.10 from ZeRO-0's weights,
10.58 from ZeRO-3's, 10.51 from FSDP2's): a comparison there would fail sound builds."""


@dataclass(frozen=True)
class Expect:
    """The predictor's figures for one trial (None where it has none, `why` says why)."""

    peak_gib: float | None = None
    step_s: float | None = None
    micro_s: float | None = None
    boundary_s: float | None = None
    why: str = ""


def expect(t: Trial, predictor=None) -> Expect:
    """What `suite.predict` says of the trial, from the GPU's datasheet."""

    def finite(x: float | None) -> float | None:
        return x if x is not None and math.isfinite(x) else None

    try:
        p = (predictor or Predictor()).predict(t)
    except Exception as e:  # noqa: BLE001 - a figure the predictor cannot give is a verdict skipped, with why
        return Expect(why=f"the predictor failed: {type(e).__name__}: {e}")
    steps = (finite(p.step_time_s), finite(p.t_micro_s), finite(p.t_boundary_s))
    why = "" if steps[0] else "no step time predicted (offload: no calibration of this host's CPU Adam)"
    return Expect(finite(p.peak_mem_gib), *steps, why=why)


def expect_all(trials: dict[str, Trial]) -> dict[str, Expect]:
    """`expect` of each trial, by name, with one predictor (its constants loaded once)."""

    predictor = Predictor()
    return {name: expect(t, predictor) for name, t in trials.items()}


def predictions(trials: dict[str, Trial]) -> Callable[[], dict[str, Expect]]:
    """Start `expect_all` in a process of its own, beside the trials (the predictor's tracing sets
    torch's process-wide default dtype while it builds a model); the function returned waits for it."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    future = pool.submit(expect_all, trials)

    def result() -> dict[str, Expect]:
        try:
            return future.result()
        except Exception as e:  # noqa: BLE001 - the verdicts that need a prediction are skipped, saying why
            return dict.fromkeys(trials, Expect(why=f"the predictions failed: {type(e).__name__}: {e}"))
        finally:
            pool.shutdown()

    return result


@dataclass
class Row:
    name: str
    outcome: str
    figures: dict[str, Any] = field(default_factory=dict)
    verdicts: dict[str, str] = field(default_factory=dict)
    """verdict -> 'pass', 'FAIL: why', 'skipped: why' or 'not run: why'."""
    notes: list[str] = field(default_factory=list)
    """What the reader must know beside the verdicts (torch's AdamW standing in for DeepSpeed's, ...)."""

    @property
    def status(self) -> str:
        kinds = [v.split(":")[0] for v in self.verdicts.values()]
        if "FAIL" in kinds:
            return "FAIL"
        if "not run" in kinds:
            return "NOT RUN"
        if kinds and all(k == "skipped" for k in kinds):
            return "SKIPPED"
        return "PASS"


@dataclass
class Context:
    """What judging a check needs beyond its own record: the others' records and the predictions."""

    records: dict[str, Record]
    """By check name."""
    expects: dict[str, Expect]
    """By check name."""


def judge(c: Check, rec: Record, ctx: Context) -> Row:
    """The verdicts of one check's record (its `verdicts` names which apply)."""
    m, message = rec.metrics or {}, rec.message or ""
    row = Row(c.name, rec.outcome, figures(rec, ctx.expects.get(c.name)))
    v = row.verdicts
    if "oom" in c.verdicts:
        v["oom"] = "pass" if rec.outcome == "oom" and "rank 0" in message else f"FAIL: {rec.outcome}: {message}"
        return row
    if rec.outcome == "unsupported":  # decided before any launch: flash-attn not installed, ...
        v["run"] = f"skipped: {message}"
        return row
    if not rec.ok:
        v["run"] = f"FAIL: {rec.outcome}: {message}"
        return row
    ref = ctx.records.get(REFERENCE) if c.name != REFERENCE else None
    ref = ref if ref is not None and ref.ok else None
    if "mfu" in c.verdicts:
        key = "hfu" if rec.trial.methods.recompute != "none" else "mfu"
        v[key], row.figures["floor"] = mfu_verdict(rec, key, ctx.expects.get(c.name), ref, ctx.expects.get(REFERENCE))
    if "skipped" in c.verdicts:
        n = m.get("skipped_steps_discarded")
        v["skipped"] = "pass" if n == 0 else f"FAIL: {n if n is not None else 'no count'} skipped in the timed window"
    if "memory" in c.verdicts:
        v["memory"] = memory_verdict(m.get("peak_mem_gib"), ctx.expects.get(c.name))
    if "profile" in c.verdicts:
        wrong = m.get("profile_mismatch")
        v["profile"] = "pass" if wrong is None else f"FAIL: ran on {wrong['device_name']} (fits {wrong['detected']})"
    if "weights" in c.verdicts:
        v["weights"] = weights_verdict(m.get("param_stats"), ref.metrics.get("param_stats") if ref else None)
    if "loss" in c.verdicts:
        v["loss"] = loss_verdict(m, ref.metrics if ref else None)
    if "recompiles" in c.verdicts:
        n = m.get("recompiles_timed")
        v["recompiles"] = "pass" if n == 0 else f"FAIL: {n if n is not None else 'no count'} recompiles when timed"
    return row


def figures(rec: Record, e: Expect | None) -> dict[str, Any]:
    m = rec.metrics or {}
    losses = m.get("loss_per_step") or []
    return {
        "step_time_s": m.get("step_time_s"),
        "mfu": m.get("mfu"),
        "hfu": m.get("hfu"),
        "peak_mem_gib": m.get("peak_mem_gib"),
        "predicted_gib": e.peak_gib if e else None,
        "skipped": m.get("skipped_steps_discarded"),
        "first_loss": m.get("first_loss"),
        "last_loss": losses[-1] if losses else None,
        "optimizer": m.get("optimizer"),
        "wall_s": rec.wall_s,
        "trial_id": rec.trial_id,
        "message": (rec.message or "")[:300],
    }


def expected_step(e: Expect | None, m: dict[str, Any]) -> tuple[float | None, str]:
    """The step time the predictor expects of a record's trial, and what it stands on. Where it has no
    optimizer step (offload: no calibration of the host's CPU Adam here), the measured one stands in."""
    if e is None:
        return None, "no prediction"
    if e.step_s:
        return e.step_s, "the predictor's"
    if e.micro_s and e.boundary_s and m.get("optimizer_time_s") is not None:
        step = (m["gas"] - 1) * e.micro_s + e.boundary_s + m["optimizer_time_s"]
        return step, "the predictor's, with the host's optimizer step as measured"
    return None, e.why or "no step time predicted"


def mfu_verdict(
    rec: Record, key: str, e: Expect | None, ref: Record | None, ref_e: Expect | None
) -> tuple[str, float | None]:
    """The MFU (or HFU) verdict and its floor: MFU_FLOOR of the lower expectation. Utilization is
    inversely proportional to the step time, so each expected step time gives an expected MFU."""
    m = rec.metrics
    x, step = m.get(key), m.get("step_time_s")
    if x is None:
        return f"FAIL: no {key} (no peak FLOP/s for this precision in the profile?)", None
    if x > MFU_CEILING:
        return f"FAIL: {key} {x:.1%} above {MFU_CEILING:.0%}: the timing or the FLOP count is wrong", None
    expected: list[tuple[float, str]] = []
    mine, source = expected_step(e, m)
    if mine:
        expected.append((x * step / mine, source))
    ref_step = expected_step(ref_e, ref.metrics)[0] if ref is not None else None
    if mine and ref_step:
        scaled = ref.step_time_s * mine / ref_step  # ZeRO-0's measured step, times the predicted ratio
        expected.append((x * step / scaled, f"{REFERENCE}'s measured x the predicted ratio {mine / ref_step:.2f}"))
    if not expected:
        return f"skipped: no floor ({source}); {key} {x:.1%} is below the {MFU_CEILING:.0%} ceiling", None
    low, _ = min(expected)
    floor = MFU_FLOOR * low
    said = "; ".join(f"{value:.1%}, {what}" for value, what in expected)
    if x < floor:
        return f"FAIL: {key} {x:.1%} below its floor {floor:.1%} ({MFU_FLOOR:g} of the lower of: {said})", floor
    return "pass", floor


def memory_verdict(peak: float | None, e: Expect | None) -> str:
    if e is None or e.peak_gib is None:
        return f"skipped: no predicted peak ({e.why if e else 'no prediction'})"
    if not peak:
        return "FAIL: no measured peak memory"
    ratio = e.peak_gib / peak
    return "pass" if abs(ratio - 1) <= MEMORY_RTOL else f"FAIL: predicted/measured {ratio:.2f}"


def weight_problem(name: str, got: list[float], ref: list[float]) -> tuple[float, str] | None:
    """How far a parameter's [count, mean, std] is from the reference's (in tolerances), or None."""
    n, mean, std = got
    n0, mean0, std0 = ref
    if n != n0:
        return math.inf, f"{name}: {n:.0f} elements against {n0:.0f}"
    se = WEIGHT_SE / math.sqrt(max(n, 1))
    std_tol = (WEIGHT_RTOL + se) * std0 + WEIGHT_ATOL
    mean_tol = WEIGHT_RTOL * abs(mean0) + se * max(std, std0) + WEIGHT_ATOL
    off = max(abs(std - std0) / std_tol, abs(mean - mean0) / mean_tol)
    if off <= 1:
        return None
    return off, f"{name}: std {std:.4g} mean {mean:.4g}, against {std0:.4g} and {mean0:.4g}"


def weights_verdict(got: dict | None, ref: dict | None) -> str:
    """Each parameter as built, against the reference's: the same names, counts, means and stds."""
    if not ref:
        return f"skipped: no parameter statistics of {REFERENCE} to compare with"
    if not got:
        return "FAIL: no parameter statistics recorded (measure.param_stats)"
    if set(got) != set(ref):
        odd = sorted(set(got) ^ set(ref))
        return f"FAIL: {len(odd)} parameters not in both builds, e.g. {', '.join(odd[:3])}"
    found = sorted((p for name in ref if (p := weight_problem(name, got[name], ref[name]))), reverse=True)
    if not found:
        return "pass"
    return f"FAIL: {len(found)} of {len(ref)} parameters built otherwise than {REFERENCE}'s, e.g. " + "; ".join(
        text for _, text in found[:3]
    )


def updates_before(m: dict[str, Any], k: int) -> int:
    """The optimizer updates applied before timed step `k`'s loss was taken."""
    return m["warmup_steps_run"] - m["skipped_steps_warmup"] + k


def loss_verdict(m: dict[str, Any], ref: dict[str, Any] | None) -> str:
    """The loss after the warm-up's updates (the first timed step's, the same batches) against the
    reference's: within LOSS_SHARE of what the reference's loss moved from its first value."""
    if not ref:
        return f"skipped: {REFERENCE} did not run to compare with"
    n, n0 = updates_before(m, 0), updates_before(ref, 0)
    if n != n0:
        return f"skipped: the first timed losses come after {n} and {n0} updates"
    a, b, start = m["loss_per_step"][0], ref["loss_per_step"][0], ref["first_loss"]
    moved = abs(b - start)
    if not (moved > 0 and math.isfinite(moved)):
        return f"skipped: {REFERENCE}'s loss did not move in {n} updates ({start} to {b})"
    off = abs(a - b)
    if off <= LOSS_SHARE * moved:
        return "pass"
    return (
        f"FAIL: loss {a:.4f} after {n} updates against {REFERENCE}'s {b:.4f}: {off:.3f} apart, more than "
        f"{LOSS_SHARE:g} of the {moved:.3f} {REFERENCE}'s moved from its first loss {start:.4f}"
    )


def nvml_processes() -> list[tuple[int, int | None]]:
    """(pid, GPU memory in bytes or None) of every process NVML lists on any GPU."""
    import pynvml

    pynvml.nvmlInit()
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        return [(p.pid, p.usedGpuMemory) for h in handles for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
    finally:
        pynvml.nvmlShutdown()


def launcher_verdict(
    initialized: bool,
    processes: Callable[[], list[tuple[int, int | None]]],
    probe: Callable[[], AbstractContextManager[int]],
    pid: int | None = None,
) -> tuple[str, str]:
    """(verdict, what was seen): does this process (the launcher) hold GPU memory after the trials?
    Asked of the process itself: torch never initialized CUDA here, or NVML's account of this pid,
    read while `probe` (a process of ours holding GPU memory) proves that NVML lists our pids."""
    pid = os.getpid() if pid is None else pid
    if not initialized:
        return "pass", "torch never initialized CUDA in the launcher: it has no context, so no GPU memory"
    try:
        with probe() as probe_pid:
            listed = dict(processes())
    except Exception as e:  # noqa: BLE001 - NVML absent or failing: the verdict cannot be decided
        return f"skipped: cannot ask NVML ({type(e).__name__}: {e})", ""
    seen = f"NVML lists {sorted(listed)}; launcher {pid}, probe {probe_pid}"
    if pid in listed:
        used = listed[pid]
        if used is None:
            return "skipped: NVML lists the launcher without its memory", seen
        return ("pass" if used == 0 else f"FAIL: the launcher holds {used / 2**20:.0f} MiB of GPU memory"), seen
    if probe_pid in listed:
        return "pass", seen + ": NVML sees our processes, and not the launcher"
    return "skipped: NVML does not list our processes by their pids (a container's own pid namespace)", seen


def table(rows: list[Row], columns: list | None = None) -> str:
    """The verdict table: one line per check, its figures (`columns`, default COLUMNS), its status and why."""
    columns = columns or COLUMNS
    head = "  ".join(f"{name:<{w}}" for name, w, _ in columns) + "  why"
    lines = [head, "-" * len(head)]
    for r in rows:
        cells = "  ".join(f"{get(r):<{w}}"[:w] for _, w, get in columns)
        lines.append(f"{cells}  {why(r)}".rstrip())
    counts = {s: sum(r.status == s for r in rows) for s in ("PASS", "FAIL", "SKIPPED", "NOT RUN")}
    lines.append(", ".join(f"{n} {s}" for s, n in counts.items()) + f" of {len(rows)} checks")
    return "\n".join(lines)


def why(r: Row) -> str:
    """What the reader must know of a row: what failed; else why it was not run or skipped; notes."""
    told = [(k, v) for k, v in r.verdicts.items() if v != "pass"]
    if r.status == "FAIL":
        told = [(k, v) for k, v in told if v.startswith("FAIL")]
    return "; ".join([f"{k}: {v.split(': ', 1)[1]}" for k, v in told] + r.notes)


def fmt(x: Any, spec: str) -> str:
    """A table cell: the value in `spec`, "-" where there is none (the check's and the grid's tables)."""
    return "-" if x is None else format(x, spec)


COLUMNS = [
    ("check", 22, lambda r: r.name),
    ("status", 7, lambda r: r.status),
    ("outcome", 11, lambda r: r.outcome),
    ("step s", 7, lambda r: fmt(r.figures.get("step_time_s"), ".3f")),
    ("MFU", 6, lambda r: fmt(r.figures.get("mfu"), ".1%")),
    ("floor", 6, lambda r: fmt(r.figures.get("floor"), ".1%")),
    ("peak GiB", 8, lambda r: fmt(r.figures.get("peak_mem_gib"), ".2f")),
    ("pred GiB", 8, lambda r: fmt(r.figures.get("predicted_gib"), ".2f")),
    ("loss 1st>last", 13, lambda r: _losses(r.figures)),
    ("wall s", 6, lambda r: fmt(r.figures.get("wall_s"), ".0f")),
]


def _losses(f: dict[str, Any]) -> str:
    first, last = f.get("first_loss"), f.get("last_loss")
    return "-" if first is None else f"{first:.3f}>{fmt(last, '.3f')}"


def exit_code(rows: list[Row]) -> int:
    """0: every row passed or was skipped; 1: a verdict failed; 4: none failed, but the budget left some out."""
    statuses = {r.status for r in rows}
    return 1 if "FAIL" in statuses else 4 if "NOT RUN" in statuses else 0


def write(out: Path, rows: list[Row], extra: dict[str, Any], columns: list | None = None, name="verdicts") -> str:
    """The table (printed and OUT/table.txt) and OUT/<name>.json (the rows and `extra`)."""
    text = table(rows, columns)
    (out / "table.txt").write_text(text + "\n")
    doc = {"rows": [{**dataclasses.asdict(r), "status": r.status} for r in rows], **extra}
    (out / f"{name}.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    return text


def probe_process() -> AbstractContextManager[int]:
    """A process of ours holding GPU memory while the context lasts; yields its pid."""
    import contextlib
    import subprocess
    import sys

    code = "import sys, torch; x = torch.ones(1, device='cuda'); print('ready', flush=True); sys.stdin.read()"

    @contextlib.contextmanager
    def running() -> Iterator[int]:
        p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError("the probe process could not allocate GPU memory")
            yield p.pid
        finally:
            p.stdin.close()
            p.wait(timeout=60)

    return running()
