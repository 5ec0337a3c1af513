"""What the GPU check runs, in which order, and how its time budget admits each check.

The checks are listed most informative first (`plan`); that order decides what a short budget
leaves out. Trials that need none of DeepSpeed's JIT-compiled ops (FSDP2's) run while those ops
build, on the CPU beside them (`next_check`); the rest wait for the build. A check is admitted
only while the time left, less what the checks ranked above it still need, holds its estimate
(`Budget.room`), and its trial's timeout is cut to that room: a trial the cut stops is reported
as not run, never as failed. `timeline` lays the plan out without running it (the dry run).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from suite.config import Trial
from suite.config.compose import trial

MODEL = "pythia-160m"
MICRO_BATCH = 16  # 16 x 2048 tokens per micro-step: enough work per kernel for a meaningful MFU
MEASURE = {"warmup_steps": 2, "timed_steps": 3, "max_micro_steps": 2, "param_stats": True}
SMALL_MICRO_BATCH = 4  # a quarter of MICRO_BATCH: ZeRO-3's collectives with a quarter of the compute
OOM_MICRO_BATCH = 512  # activations of ~300 GiB at 2048 tokens: out of memory on any GPU today
BUDGET_S = 300.0  # the device session's 15 minutes hold a machine start, this check and a rerun of it
STARTUP_S = 15.0  # script, wheels, imports, environment check: the estimate for an H200 machine (issue 26)
OPS_BUILD_S = 75.0  # FusedAdam (nvcc) and CPU Adam compiled side by side: 60-90 s estimated on 16 cores
OPS_TIMEOUT_S = 150.0  # twice the estimate: a build still running then is stuck (a stale lock, a hung nvcc)
TRIAL_START_S = 15.0  # process start, imports, model build and engine set-up before a step: 10-20 s on an H200
TIMEOUT_FACTOR = 3.0  # a trial's own timeout, over its estimate: a first run on a new machine may take twice as long
MIN_TIMEOUT_S = 60.0  # the shortest own timeout: a trial's start alone may vary by tens of seconds
# DeepSpeed's ops a trial loads (suite.engines.JIT_OPS less the CPU accelerator's collectives),
# each with the folder name torch's JIT build gives it (op_builder NAME).
OPS = {"FusedAdamBuilder": "fused_adam", "CPUAdamBuilder": "cpu_adam"}
TIMED = ("mfu", "skipped", "memory", "profile")
"""The verdicts of every trial that runs its timed window."""


@dataclass(frozen=True)
class Check:
    """One trial of the check: its methods over the base trial's, its verdicts and its estimate."""

    name: str
    methods: dict[str, Any]
    verdicts: tuple[str, ...]
    est_s: float
    """Wall seconds on one H200: TRIAL_START_S and its steps (estimates, until a GPU run measures them)."""

    @property
    def timeout_s(self) -> float:
        return max(MIN_TIMEOUT_S, TIMEOUT_FACTOR * self.est_s)


REFERENCE = "ZeRO-0 bf16"
"""The check every other is compared with: DeepSpeed's plain data parallel, the simplest build."""


def plan() -> list[Check]:
    """The checks, most informative first. Seconds beyond TRIAL_START_S: 5 steps of 2 micro-steps of
    ~0.09 s (the predictor's t_micro), the speed probe and parameter statistics, plus each method's own."""
    bf16 = {"precision": "bf16"}
    fsdp = {"engine": "fsdp2", "reshard_after_forward": True, **bf16}
    sharded = (*TIMED, "weights", "loss")  # a build of its own, and training from it
    s = TRIAL_START_S
    return [
        Check(REFERENCE, {"zero_stage": 0, **bf16}, TIMED, s + 3),
        Check("ZeRO-3 bf16", {"zero_stage": 3, **bf16}, sharded, s + 7),  # zero.Init, gathers per module
        Check("FSDP2 full_shard bf16", fsdp, sharded, s + 5),
        # Pinned host shards, and torch's AdamW over 160M fp32 parameters on the host each step.
        Check("FSDP2 offload bf16", {**fsdp, "offload": "optimizer+params"}, sharded, s + 15),
        Check("ZeRO-2 offload bf16", {"zero_stage": 2, "offload": "optimizer", **bf16}, (*TIMED, "loss"), s + 15),
        Check("forced OOM", {"zero_stage": 0, "micro_batch": OOM_MICRO_BATCH, **bf16}, ("oom",), s),
        # torch.compile of each block: about a minute on the first run (no cache on a fresh machine).
        # No memory verdict: the predictor does not model compile's fusions, which save activations.
        Check("compile", {**fsdp, "compile": True}, ("mfu", "skipped", "profile", "recompiles"), s + 65),
        # Whether ZeRO-3's host cost per collective (predict.gpu.ZERO3_HOOK_S, measured at
        # MICRO_BATCH) adds to the compute or overlaps it.
        Check(
            f"ZeRO-3 bf16 micro-batch {SMALL_MICRO_BATCH}",
            {"zero_stage": 3, "micro_batch": SMALL_MICRO_BATCH, **bf16},
            TIMED,
            s + 8,
        ),
        Check("flash_attention_2", {"zero_stage": 0, "attention": "flash_attention_2", **bf16}, TIMED, s + 3),
        # fp16: a few more warm-up steps while the loss scale settles.
        Check("ZeRO-0 fp16", {"zero_stage": 0, "precision": "fp16"}, TIMED, s + 5),
    ]


def base_trial(gpu: str) -> Trial:
    """Pythia-160M with its recipe on one GPU of type `gpu`, measured briefly (MEASURE)."""

    measure = [f"measure.{k}={v}" for k, v in MEASURE.items()] + ["measure.rerun=true"]
    return trial([f"model={MODEL}", f"hardware={gpu}", "hardware.count=1", *measure])


def trial_of(base: Trial, c: Check, unbuilt: frozenset[str] = frozenset()) -> Trial:
    """The check's trial; with torch's fused AdamW where the DeepSpeed op it needs is `unbuilt`."""
    methods = {"micro_batch": MICRO_BATCH, "attention": "sdpa", **c.methods}
    t = dataclasses.replace(base, methods=dataclasses.replace(base.methods, **methods))
    if op_needed(t) in unbuilt:
        t = dataclasses.replace(t, methods=dataclasses.replace(t.methods, optimizer="torch_fused"))
    return dataclasses.replace(t, measure=dataclasses.replace(t.measure, timeout_s=c.timeout_s))


def op_needed(t: Trial) -> str | None:
    """The DeepSpeed op (an OPS key) the trial's optimizer loads, or None (FSDP2, torch's AdamW)."""
    if t.methods.engine != "deepspeed" or t.methods.optimizer != "engine":
        return None
    return "CPUAdamBuilder" if t.methods.offload != "none" else "FusedAdamBuilder"


def next_check(pending: list[tuple[Check, Trial]], building: bool) -> tuple[Check, Trial] | None:
    """The next check to run: the first pending one, or while DeepSpeed's ops build, the first that
    needs none of them (None when none can run before the build ends)."""
    for c, t in pending:
        if not building or op_needed(t) is None:
            return c, t
    return None


@dataclass
class Budget:
    """Seconds from the check's start (the script's, GPU_CHECK_START) and what each check may take."""

    total_s: float
    start: float
    clock: Callable[[], float] = time.time
    estimated_s: float = 0.0
    """The estimates of the checks run so far."""
    measured_s: float = 0.0
    """Their wall times."""
    rank: dict[str, int] = field(default_factory=lambda: {c.name: k for k, c in enumerate(plan())})

    def elapsed(self) -> float:
        return self.clock() - self.start

    def cost(self, c: Check) -> float:
        """A check's estimate, scaled up by how much slower than estimated the trials so far ran."""
        slower = self.measured_s / self.estimated_s if self.estimated_s else 1.0
        return c.est_s * max(1.0, slower)

    def room(self, c: Check, pending: list[Check]) -> float:
        """The seconds `c` may take: what is left, less what the pending checks ranked above it need."""
        above = sum(self.cost(p) for p in pending if self.rank.get(p.name, 0) < self.rank.get(c.name, 0))
        return self.total_s - self.elapsed() - above

    def ran(self, c: Check, wall_s: float) -> None:
        self.estimated_s += c.est_s
        self.measured_s += wall_s


@dataclass(frozen=True)
class Slot:
    """A check as the dry run lays it out: when it would start, for how long, beside what."""

    check: Check
    start_s: float
    beside_build: bool


def timeline(checks: list[tuple[Check, Trial]], build_s: float, start_s: float = STARTUP_S) -> tuple[list[Slot], float]:
    """The checks in the order they would run from `start_s` if each took its estimate and DeepSpeed's
    ops took `build_s` (from STARTUP_S); and when the last one would end."""
    now, built_at = start_s, STARTUP_S + build_s if any(op_needed(t) for _, t in checks) else start_s
    pending, slots = list(checks), []
    while pending:
        found = next_check(pending, building=now < built_at)
        if found is None:
            now = built_at
            continue
        pending.remove(found)
        slots.append(Slot(found[0], now, now < built_at))
        now += found[0].est_s
    return slots, max(now, built_at)
