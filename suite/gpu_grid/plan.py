"""The GPU grid's plan: its cells and items in priority order, each trial's estimated seconds, and
what a time budget holds (`Plan.planned`, laid out by `suite.gpu_check.plan.timeline`).

A cell is a model under a memory: Pythia-160M, -410M or -1B (their recipes' shapes: batch 1024 x
2048 tokens; bf16) on the machine's GPUs with their own memory, or capped at 24 or 48 GiB
(`hardware.mem_gib`: a 24 GB or 48 GB card emulated). An item is a method in a cell: its
out-of-memory boundary, found by doubling the micro-batch from the predicted largest that fits
(a boundary), or one trial at the cell's micro-batch (a point: the predicted largest that fits
DDP, so that the engines compare at one size). The whole product (3 models x 3 memories x 5
engines x 3 recomputations x 2 offloads, each over its micro-batches) is hundreds of trials of
~20 s, which 480 s cannot hold. So cells come in rounds of three (`ROUNDS`: each model and each
memory once a round), and a round's core items (`CORE`) come before its extra ones (`EXTRA`) and
before the next round: a short budget leaves out the least informative. Each cell so gets its
fit/OOM boundaries and enough configurations for a rank correlation, and each engine trials in
several cells, rather than one cell getting all of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from suite.config import Trial, compose
from suite.detect import gpu_mem_gib
from suite.gpu_check.plan import OPS_BUILD_S, STARTUP_S, TRIAL_START_S, Check, Slot, timeline, trial_of
from suite.labels import memory_methods_label
from suite.predict import Predictor

BUDGET_S = 480.0  # of a 15-minute device session: the machine's start (minutes), the grid, packing, a margin
PLAN_S = 30.0  # tracing 3 models at 3 recomputations and predicting every ladder, beside the op build (estimate)
CAPS_GIB = (24.0, 48.0)  # 24 GB cards (RTX 3090, 4090), 48 GB ones (RTX A6000, L40S)
MEASURE = {"warmup_steps": 2, "timed_steps": 2, "max_micro_steps": 2}  # the GPU check's warm-up, a step fewer timed
PRECISION = "bf16"  # Pythia-1B's recipe; 160M's and 410M's fp16 would settle a loss scale in the warm-up first
MAX_MICRO_BATCH = 256  # Pythia-160M's largest that fits 140 GiB under recomputation is 128 (predicted)
BUILD_S_PER_BPARAM = 6.0  # building a model beyond TRIAL_START_S (Pythia-160M's): an estimate until a GPU run
HOST_ADAM_S_PER_BPARAM = 0.7  # offload's CPU Adam step: 0.07-0.11 s for 160M on the H200 machine (gpu-check rerun)
OOM_S = 2.0  # an out-of-memory trial ends in its first micro-step, or in its build
VERDICTS = ("run", "profile")
"""What a grid trial is judged on: it ran to a result (ok or oom: both are measurements), on its profile's GPU."""

DDP: dict[str, Any] = {"zero_stage": 0}
FSDP2: dict[str, Any] = {"engine": "fsdp2", "reshard_after_forward": True}
CORE: tuple[tuple[bool, dict[str, Any]], ...] = (
    (True, DDP),  # where the plain method runs out of memory
    (True, {"zero_stage": 3, "recompute": "full"}),  # the most memory-frugal without offload
    (False, FSDP2),  # runs beside DeepSpeed's op build
    (False, {"zero_stage": 2}),
    (False, {"zero_stage": 2, "offload": "optimizer"}),
)
"""Each cell's items first: (boundary?, methods over the cell's base trial)."""
EXTRA: tuple[tuple[bool, dict[str, Any]], ...] = (
    (False, {"zero_stage": 1}),
    (False, {"zero_stage": 0, "recompute": "selective"}),
    (True, {"zero_stage": 0, "recompute": "full"}),
    (True, {"zero_stage": 3}),
    (True, {"zero_stage": 2, "offload": "optimizer"}),
)
"""Each cell's items after every cell of its round has had its CORE ones."""
ROUNDS: tuple[tuple[tuple[str, float | None], ...], ...] = (
    (("pythia-1b", 24.0), ("pythia-410m", 48.0), ("pythia-160m", None)),
    (("pythia-410m", 24.0), ("pythia-160m", 48.0), ("pythia-1b", None)),
    (("pythia-160m", 24.0), ("pythia-1b", 48.0), ("pythia-410m", None)),
)
"""(model, cap in GiB or None: the device's own memory) by round, a Latin square: the first round
holds each model and each memory once."""


@dataclass(frozen=True)
class Item:
    """A method in a cell (model, memory): a boundary search or one timed point."""

    model: str
    cap_gib: float | None
    boundary: bool
    methods: tuple[tuple[str, Any], ...]
    """methods.* over the cell's base trial, as sorted pairs (an item is hashable)."""

    @property
    def cell(self) -> tuple[str, float | None]:
        return self.model, self.cap_gib


def items() -> list[Item]:
    """Every item of the grid, in priority order."""
    out = []
    for cells in ROUNDS:
        for methods in (CORE, EXTRA):
            for model, cap in cells:
                out += [Item(model, cap, b, tuple(sorted(m.items()))) for b, m in methods]
    return out


@dataclass(frozen=True)
class Forecast:
    """The predictor's figures for one trial, as the plan and the grid's rows use them."""

    fits: bool
    device_gib: float
    peak_gib: float
    step_s: float | None
    """None where the predictor has no optimizer step (offload: no calibration of the host's CPU Adam)."""
    micro_s: float
    boundary_s: float
    n_params: int


def forecast_all(trials: dict[str, Trial]) -> dict[str, Forecast]:
    """Each trial's Forecast, by its key in `trials`, with one predictor."""
    pred = Predictor()
    out = {}
    for key, t in trials.items():
        p = pred.predict(t)
        step = p.step_time_s if p.step_time_s is not None and math.isfinite(p.step_time_s) else None
        out[key] = Forecast(p.fits, p.device_gib, p.peak_mem_gib, step, p.t_micro_s, p.t_boundary_s, p.n_params)
    return out


def forecasts(trials: dict[str, Trial]) -> dict[str, Forecast]:
    """`forecast_all` in a process of its own: tracing a model sets torch's process-wide default dtype,
    and the launcher's torch stays as the trials' launcher needs it."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(forecast_all, trials).result()


def base_trial(model: str, gpu: str, count: int, cap_gib: float | None) -> Trial:
    """The model's recipe on `count` GPUs of type `gpu`, capped at `cap_gib` (None: their own memory)."""
    over = [f"model={model}", f"hardware={gpu}", f"hardware.count={count}", f"methods.precision={PRECISION}"]
    over += [f"measure.{k}={v}" for k, v in MEASURE.items()] + ["measure.rerun=true"]
    return compose.trial(over + ([f"hardware.mem_gib={cap_gib:g}"] if cap_gib else []))


def estimate_s(t: Trial, f: Forecast) -> float:
    """A trial's wall seconds: its start and its model's build, then its steps at the predictor's
    times (a host CPU Adam step where the predictor has none), or its end at out-of-memory."""
    start = TRIAL_START_S + BUILD_S_PER_BPARAM * f.n_params / 1e9
    if not f.fits:
        return start + OOM_S
    optimizer = HOST_ADAM_S_PER_BPARAM * f.n_params / 1e9 if f.step_s is None else 0.0
    step = (t.gas_measured - 1) * f.micro_s + f.boundary_s + optimizer
    return start + (t.measure.warmup_steps + t.measure.timed_steps) * step


@dataclass
class Plan:
    """The grid on `count` GPUs of type `gpu`: its items, their cells' trials and the forecasts."""

    gpu: str
    count: int
    gpu_mem_gib: float
    items: list[Item]
    bases: dict[tuple[str, float | None], Trial]
    forecast: dict[str, Forecast] = field(default_factory=dict)
    """By trial id: every item's trial at every micro-batch of its ladder."""
    _probes: dict[tuple[Item, int], tuple[Check, Trial]] = field(default_factory=dict, repr=False)
    _starts: dict[Item, int] = field(default_factory=dict, repr=False)

    @classmethod
    def make(cls, gpu: str, count: int, predict=forecasts) -> Plan:
        """The plan's trials composed here and predicted by `predict` (a process of its own)."""
        all_items = items()
        bases = {cell: base_trial(cell[0], gpu, count, cell[1]) for cell in dict.fromkeys(i.cell for i in all_items)}
        plan = cls(gpu, count, gpu_mem_gib(next(iter(bases.values())).hardware), all_items, bases)
        every = {}
        for item in all_items:
            for mb in plan.ladder(item.cell):
                t = plan.trial(item, mb)
                every[t.id] = t
        plan.forecast = predict(every)
        return plan

    def memory(self, cap_gib: float | None) -> str:
        return f"{cap_gib or self.gpu_mem_gib:g}GiB"

    def ladder(self, cell: tuple[str, float | None]) -> list[int]:
        """The micro-batches a cell's items may take: powers of 2 that divide the per-device batch."""
        per_device = self.bases[cell].per_device_batch
        return [2**k for k in range(12) if 2**k <= min(per_device, MAX_MICRO_BATCH) and per_device % 2**k == 0]

    def trial(self, item: Item, mb: int, unbuilt: frozenset[str] = frozenset()) -> Trial:
        return self.probe(item, mb, unbuilt)[1]

    def probe(self, item: Item, mb: int, unbuilt: frozenset[str] = frozenset()) -> tuple[Check, Trial]:
        """The item's trial at micro-batch `mb` and its Check (name, estimate, timeout); with torch's
        fused AdamW where the DeepSpeed op it needs is `unbuilt` (gpu_check.plan.trial_of)."""
        key = (item, mb)
        if key not in self._probes or unbuilt:
            base, methods = self.bases[item.cell], {**dict(item.methods), "micro_batch": mb}
            first = trial_of(base, Check("", methods, VERDICTS, 0.0), unbuilt)
            name = f"{item.model}@{self.memory(item.cap_gib)} {memory_methods_label(first)} mb {mb}"
            f = self.forecast.get(first.id)
            c = Check(name, methods, VERDICTS, estimate_s(first, f) if f else 0.0)
            if unbuilt:
                return c, trial_of(base, c, unbuilt)
            if f is None:  # before the forecasts: not kept, its estimate is still to come
                return c, trial_of(base, c)
            self._probes[key] = c, trial_of(base, c)
        return self._probes[key]

    def start(self, item: Item) -> int:
        """Where a boundary's doubling starts: the largest micro-batch predicted to fit (the smallest
        when none is); a point's micro-batch: the cell's DDP's start."""
        if not item.boundary:
            return self.start(Item(item.model, item.cap_gib, True, tuple(sorted(DDP.items()))))
        if item not in self._starts:
            ladder = self.ladder(item.cell)
            fits = [mb for mb in ladder if self.forecast[self.trial(item, mb).id].fits]
            self._starts[item] = max(fits) if fits else ladder[0]
        return self._starts[item]

    def expected(self, item: Item) -> list[int]:
        """The micro-batches an item is expected to run if the predictor is right: a point's one; a
        boundary's start and, where it fits and the ladder goes on, its double (predicted OOM)."""
        mb = self.start(item)
        if not item.boundary or not self.forecast[self.trial(item, mb).id].fits or 2 * mb not in self.ladder(item.cell):
            return [mb]
        return [mb, 2 * mb]

    def checks(self, chosen: list[Item]) -> list[tuple[Check, Trial]]:
        return [self.probe(i, mb) for i in chosen for mb in self.expected(i)]

    def planned(
        self, budget_s: float, build_s: float = OPS_BUILD_S
    ) -> tuple[list[Item], list[Item], list[Slot], float]:
        """The items admitted in priority order while the timeline of their expected trials ends within
        `budget_s` (FSDP2's beside DeepSpeed's op build of `build_s`); those left out; the timeline."""
        admitted, left = [], []
        for item in self.items:
            _, end = timeline(self.checks([*admitted, item]), build_s, STARTUP_S + PLAN_S)
            (admitted if end <= budget_s else left).append(item)
        slots, end = timeline(self.checks(admitted), build_s, STARTUP_S + PLAN_S)
        return admitted, left, slots, end


def describe(plan: Plan, item: Item) -> str:
    """An item in words: "pythia-1b@24GiB DDP boundary from mb 2"."""
    mb = plan.start(item)
    c, _ = plan.probe(item, mb)
    return c.name.rsplit(" mb ", 1)[0] + (f" boundary from mb {mb}" if item.boundary else f" at mb {mb}")
