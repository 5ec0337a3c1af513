"""Memory per rank of a trial, predicted: the model states each engine keeps, laid out as the
engine really lays them out, plus the activations traced from the real model.

    timed peak = steady states + max(backward: activations + transients alive with them,
                                     boundary: gradient-reduction transients,
                                     optimizer step: its transients)
    build peak = what building the model and initialising the engine hold at once

`steady` is what stays allocated through every micro-step of the timed window: parameters,
gradients an engine keeps between micro-steps, fp32 master weights, optimizer moments. The
activation term comes from `suite.predict.trace` (the micro-step's live bytes beyond the
model states, at the recipe's micro-batch). Nothing here depends on the architecture: only
parameter counts (all, per block, the largest) enter.

Notation: P parameters, N ranks sharing the states (`Trial.devices`), w bytes per element of
the trial's dtype (2 under bf16/fp16, 4 under fp32), B_r and B_a the reduce and all-gather
bucket sizes in elements (`suite.methods.bucket_sizes`). Every term cites the DeepSpeed 0.19.8
or PyTorch 2.13 source line it reads (paths below site-packages/), or the layout
`suite/engines.py` documents for FSDP2.

DeepSpeed ZeRO-0 (plain data parallel), fp32: parameters 4P; gradients 4P, which autograd
accumulates in p.grad across micro-steps (engine.py:3084-3095: no reduction before the
boundary); AdamW moments 8P; at the boundary `buffered_allreduce_fallback` flattens the
gradients into one buffer of up to 5e8 elements (engine.py:3073, 3921-3933). Under bf16/fp16
the engine wraps the optimizer in `FP16_Optimizer` (engine.py:2313-2321, 2555-2608): the
16-bit parameters become one flat buffer (fp16/fused_optimizer.py:94-96), an fp32 flat master
copy 4P (:100), and at the step an fp32 flat copy of the gradients 4P (:286-291).

DeepSpeed ZeRO-1/2 (`DeepSpeedZeroOptimizer`): the parameters become views of one flat
buffer wP, flattened while the originals still exist, so 2wP at init (stage_1_and_2.py:432,
503-507, 889-899); an fp32 master partition 4P/N, a copy even under fp32 (:556-557);
moments 8P/N. Reduce bucket wB_r allocated at each backward (:3256-3270). ZeRO-1 leaves the
gradients to autograd until the boundary (wP, :2284-2295), then reduces them through the
bucket into a partition buffer wP/N (:2175-2187). ZeRO-2 reduces every gradient as it is
produced (:2289-2291, :1414-1460) into the partition buffer wP/N, which lives through the
step. At the step the partition's gradients are flattened (wP/N, while the buffer still
holds them) and converted to fp32 (4P/N; `.to` of the same dtype is no copy) (:3108-3139),
and the updated parameters all-gathered into the flat buffer in place (:3155-3159).

DeepSpeed ZeRO-3 (stage3.py): parameter partitions wP/N (partition_parameters.py), whole
parameters below `stage3_param_persistence_threshold` elements on every rank, an fp32
master partition 4P/N (a copy, stage3.py:1168-1172), moments 8P/N, a gradient partition
buffer wP/N (:791-793), the reduce bucket wB_r (:780-784), the partition's gradient
flattened and converted to fp32 at the step (:2686-2687), and the gathered parameters: a module's parameters
are released after it runs only if no module within the next `stage3_max_reuse_distance`
elements (1e9 by default) uses them again (partitioned_param_coordinator.py:634-664), and
every parameter of the forward is used again in the backward, so up to 1e9 elements (the
whole model below that size) stay gathered from forward into backward.

Offload (`offload_optimizer`, ZeRO >= 1): master weights, moments and fp32 gradient
partitions live in the host's memory (pinned on a GPU); `optimizer+params` (ZeRO-3) moves the
parameter partitions there too. On a CPU worker host and device are the same memory.

The NVMe tier (`methods.offload_device=nvme`, ZeRO-3, DeepSpeed's swappers): each optimizer
sub-group (`suite.methods.sub_groups`) of at least 1 MiB of fp32 keeps its fp32 parameter, two
moments and fp32 gradient on the drive, 16 bytes an element (stage3.py:1117-1128,
optimizer_utils.py `swap_out_gradients`), through 4 pinned host buffers of the largest sub-group
(partitioned_optimizer_swapper.py:79-110); under optimizer+params each parameter partition of at
least 1 MiB too (partition_parameters.py:1820-1826, `max_in_cpu` 0), through 5 pinned buffers
(`offload_param.buffer_size`) and one of the largest sub-group's 16-bit parameters for their
swap-out after the step (stage3.py:1005-1018). What is smaller stays in host memory.

FSDP2 (suite/engines.py's layout): fp32 parameter shards 4P/N and moments 8P/N (torch's fused
AdamW, no temporaries) through the window; fp32 gradient shards 4P/N only from the boundary's
reduce-scatter, which makes them unit by unit as it frees the unsharded gradients it reduces
(_fsdp_collectives.py:605-606, 704-754), to `zero_grad(set_to_none=True)` after the step: none
exists at the start of a backward, when the activations peak (from the first micro-step on when
every micro-step reduces); while computing, a unit's parameters
are gathered whole in the compute dtype, about two units at a time with
reshard_after_forward, every unit from its forward to its backward without; before the
boundary each rank accumulates unsharded fp32 gradients (4P) when gas > 1, unless gradients are
reduce-scattered at every micro-step (`methods.reduce_every_micro_step`: one unit's unsharded
gradients at a time). On a GPU the fp32 model is built in the host's memory (not the device's);
the device holds the shards placed so far and the unit being cut.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from suite import methods
from suite.config import Trial
from suite.predict.trace import Trace, traced

ALLREDUCE_BUCKET = 500_000_000
"""Elements of ZeRO-0's gradient all-reduce buffer (MEMORY_OPT_ALLREDUCE_SIZE, engine.py:3073)."""
REUSE_DISTANCE = 1_000_000_000
"""ZeRO-3's stage3_max_reuse_distance default, in elements (zero/config.py:251)."""


@dataclass(frozen=True)
class Term:
    name: str
    bytes: float
    source: str


@dataclass
class Layout:
    """Where the bytes of one rank are, by when they are alive."""

    steady: list[Term] = field(default_factory=list)
    """Allocated through the timed window."""
    backward: list[Term] = field(default_factory=list)
    """Alive together with the activations (buckets filled during backward)."""
    boundary: list[Term] = field(default_factory=list)
    """Alive while gradients are reduced after the boundary backward, activations freed."""
    optimizer: list[Term] = field(default_factory=list)
    """Alive during the optimizer step."""
    build: list[Term] = field(default_factory=list)
    """The peak of building the model and initialising the engine."""
    host: list[Term] = field(default_factory=list)
    """Offloaded to the host's memory (a GPU's host; counted on the device for a CPU worker)."""
    nvme: list[Term] = field(default_factory=list)
    """Swapped to the NVMe drive (the NVMe tier), per rank."""
    grads_accumulate: bool = False
    """Gradients stay in p.grad between micro-steps (counted in `steady`); the first
    micro-step of a step then holds them as they are produced instead."""
    activations: float = 0.0

    @staticmethod
    def total(terms: list[Term]) -> float:
        return sum(t.bytes for t in terms)

    def timed_peak(self) -> float:
        return self.total(self.steady) + max(
            self.activations + self.total(self.backward), self.total(self.boundary), self.total(self.optimizer)
        )

    def build_peak(self) -> float:
        return self.total(self.build)

    def states(self) -> float:
        """The bytes no micro-batch changes: a lower bound of either peak."""
        return self.total(self.steady)


def bytes_per_element(precision: str) -> int:
    return 4 if precision in ("fp32", "tf32") else 2


def _partition_step(part: float, w: int, buffer: list[Term]) -> list[Term]:
    """The larger of the step's two moments (stage_1_and_2.py:3108-3139): the partition's
    gradients are flattened (a copy, while the buffer they come from is still held) and
    converted to fp32 (a copy unless they are fp32 already: `.to` of the same dtype is the
    tensor itself); then the buffer is freed and AdamW runs on the fp32 gradient."""
    flat = Term("flattened gradient partition", w * part, "stage_1_and_2.py:3110-3117")
    fp32 = [Term("fp32 gradient partition", 4 * part, "stage_1_and_2.py:3118")] if w != 4 else []
    convert = buffer + [flat] + fp32
    update = fp32 or [flat]  # every AdamW the worker steps with is fused: one pass, in place
    return convert if Layout.total(convert) >= Layout.total(update) else update


def deepspeed_layout(t: Trial, tr: Trace) -> Layout:
    """DeepSpeed ZeRO 0-3 as suite/engines.py sets it up (suite.methods.deepspeed_config)."""
    z = t.methods.zero_stage
    lay = Layout(grads_accumulate=z in (0, 1))
    {0: _zero0, 1: _zero12, 2: _zero12, 3: _zero3}[z](lay, t, tr)
    return lay


def _zero0(lay: Layout, t: Trial, tr: Trace) -> None:
    w, p, built = bytes_per_element(t.precision), tr.n_params, _built_bytes(t, tr)
    lay.steady.append(Term("parameters", w * p, "engine.py:2080-2094 (module cast to the training dtype)"))
    lay.steady.append(Term("gradients (p.grad, accumulated by autograd)", w * p, "engine.py:3084-3095"))
    lay.steady.append(Term("AdamW moments", 8 * p, "torch AdamW / FusedAdam: exp_avg, exp_avg_sq in fp32"))
    flat = min(p, ALLREDUCE_BUCKET)
    lay.boundary.append(Term("all-reduce flat buffer", w * flat, "engine.py:3921-3933 buffered_allreduce_fallback"))
    lay.build.append(Term("parameters as built", built, "suite/worker.py, suite.models.build"))
    if t.precision != "fp32":
        lay.steady.append(Term("fp32 master weights", 4 * p, "fp16/fused_optimizer.py:100"))
        lay.optimizer.append(Term("fp32 flat gradients at the step", 4 * p, "fp16/fused_optimizer.py:286-291"))
        lay.build.append(Term("16-bit clones flattened", 2 * w * p, "fp16/fused_optimizer.py:94-96"))
        lay.build.append(Term("fp32 master weights", 4 * p, "fp16/fused_optimizer.py:100"))


def _offloads(t: Trial) -> tuple[bool, bool]:
    """(optimizer offloaded, parameters offloaded): on a GPU only (a CPU budget has no device to spare)."""
    gpu = t.hardware.device != "cpu"
    return gpu and t.methods.offload in (
        "optimizer",
        "optimizer+params",
    ), gpu and t.methods.offload == "optimizer+params"


def _zero12(lay: Layout, t: Trial, tr: Trace) -> None:
    w, p, z = bytes_per_element(t.precision), tr.n_params, t.methods.zero_stage
    part, b_r = p / t.devices, methods.bucket_sizes(t)["reduce_bucket_size"]
    off_opt, _ = _offloads(t)
    lay.steady.append(Term("parameters, one flat buffer", w * p, "stage_1_and_2.py:503-507, 889-899"))
    opt_terms = [
        Term("fp32 master partition", 4 * part, "stage_1_and_2.py:556-557"),
        Term("AdamW moments of the partition", 8 * part, "fp32 exp_avg, exp_avg_sq"),
    ]
    (lay.host if off_opt else lay.steady).extend(opt_terms)
    lay.backward.append(Term("reduce bucket", w * b_r, "stage_1_and_2.py:3256-3270"))
    buffer = Term("gradient partition buffer", w * part, "stage_1_and_2.py:2175-2187")
    if z == 1:
        lay.steady.append(Term("gradients (p.grad until the boundary)", w * p, "stage_1_and_2.py:2284-2295"))
        lay.boundary += [buffer, Term("reduce bucket", w * b_r, "stage_1_and_2.py:3256-3270")]
    elif t.gas_measured > 1:  # gradients of later micro-steps accumulate into it
        lay.steady.append(buffer)
    else:  # allocated by the backward's first reduction, after the activations' peak
        lay.boundary.append(buffer)
    if off_opt:
        lay.host.append(Term("fp32 gradient partition", 4 * part, "stage_1_and_2.py:936-941"))
        lay.host.append(Term("16-bit partition staging buffer", w * part, "stage_1_and_2.py:563-574"))
        largest = max(tr.param_numels)
        lay.steady.append(Term("gradient staging buffer (largest parameter)", w * largest, "stage_1_and_2.py:658-660"))
    else:
        lay.optimizer = _partition_step(part, w, [] if buffer in lay.steady else [buffer])
    lay.build.append(Term("parameters as built", _built_bytes(t, tr), "suite/worker.py, suite.models.build"))
    lay.build.append(Term("flat copy made while flattening", w * p, "stage_1_and_2.py:432, 503-507"))


def swapped(t: Trial, tr: Trace) -> tuple[float, float]:
    """(optimizer elements, parameter elements) one rank swaps to the NVMe drive: the sub-groups
    and the partitions of at least `methods.MIN_SWAP_BYTES` (fp32 and the trial's dtype)."""
    if not methods.on_nvme(t):
        return 0.0, 0.0
    opt = sum(g for g in methods.sub_groups(t, tr.param_numels) if 4 * g >= methods.MIN_SWAP_BYTES)
    if t.methods.offload != "optimizer+params":
        return opt, 0.0
    w = bytes_per_element(t.precision)
    return opt, sum(x for x in methods.partitions(t, tr.param_numels) if w * x >= methods.MIN_SWAP_BYTES)


def nvme_terms(t: Trial, tr: Trace) -> list[Term]:
    """What one rank keeps on the NVMe drive (the module's docstring)."""
    opt, par = swapped(t, tr)
    out = []
    if opt:
        states = "fp32 parameters, moments and gradients of the swapped sub-groups"
        out.append(Term(states, 16 * opt, "stage3.py:1117-1128"))
    if par:
        w = bytes_per_element(t.precision)
        out.append(Term("swapped parameter partitions", w * par, "partition_parameters.py:1820-1826"))
    return out


def nvme_bytes(t: Trial) -> float:
    """Bytes one rank of an NVMe trial swaps to the drive (0 for any other trial): what the drive
    must have free (`suite.config.validate.nvme_problems`)."""
    if not methods.on_nvme(t):
        return 0.0
    tr = traced(t.model, t.methods.attention, "none", t.precision)
    return Layout.total(nvme_terms(t, tr))


def _nvme_buffers(t: Trial, tr: Trace) -> list[Term]:
    """The NVMe tier's pinned host buffers, per rank (the module's docstring)."""
    if not methods.on_nvme(t):
        return []
    sizes = methods.nvme_sizes(t, tr.param_numels)
    out = [
        Term(
            "optimizer swap buffers (pinned, fp32)",
            4 * methods.OPTIMIZER_SWAP_BUFFERS * sizes.largest_sub_group,
            "partitioned_optimizer_swapper.py:79-110",
        )
    ]
    if t.methods.offload == "optimizer+params":
        w = bytes_per_element(t.precision)
        out.append(
            Term(
                "parameter swap buffers (pinned)",
                w * methods.PARAM_SWAP_BUFFERS * sizes.param_buffer,
                "partitioned_param_swapper.py:104-130",
            )
        )
        out.append(Term("parameter swap-out buffer (pinned)", w * sizes.largest_sub_group, "stage3.py:1005-1018"))
    return out


def _zero3(lay: Layout, t: Trial, tr: Trace) -> None:
    w, p, n = bytes_per_element(t.precision), tr.n_params, t.devices
    part, buckets = p / n, methods.bucket_sizes(t)
    off_opt, off_par = _offloads(t)
    threshold = buckets.get("stage3_param_persistence_threshold", 0)
    persistent = sum(x for x in tr.param_numels if x < threshold)
    sharded = p - persistent
    swap_opt, swap_par = swapped(t, tr)
    lay.nvme.extend(nvme_terms(t, tr))
    lay.host.extend(_nvme_buffers(t, tr))
    where = lay.host if off_par else lay.steady
    where.append(
        Term("parameter partitions", w * (sharded / n - swap_par), "runtime/zero/partition_parameters.py (ds_tensor)")
    )
    lay.steady.append(
        Term(
            "persistent parameters (below the threshold), whole",
            w * persistent,
            "stage3.py param_persistence_threshold",
        )
    )
    kept = part - swap_opt  # the optimizer's elements not swapped to the drive
    master = [Term("fp32 master partition (a copy, under fp32 too)", 4 * kept, "stage3.py:1168-1172")]
    opt_terms = master + [Term("AdamW moments of the partition", 8 * kept, "fp32 exp_avg, exp_avg_sq")]
    (lay.host if off_opt else lay.steady).extend(opt_terms)
    grads = Term("gradient partition buffer", w * part, "stage3.py:791-793")
    (lay.host if off_opt else lay.steady).append(grads)
    lay.steady.append(Term("reduce bucket", w * buckets.get("reduce_bucket_size", 0), "stage3.py:780-784"))
    # A gathered parameter is released only if the modules run within the next
    # max_reuse_distance elements do not use it again; forward's parameters are used again in
    # backward, so up to that many stay gathered from forward into backward.
    live = min(sharded, REUSE_DISTANCE)
    lay.backward.append(
        Term(
            "gathered parameters kept for reuse in backward",
            w * live,
            "partitioned_param_coordinator.py:634-664, zero/config.py:245-251 (max_reuse_distance 1e9)",
        )
    )
    if not off_opt:  # flattened, then converted to fp32 (a copy unless fp32 already)
        flat = Term("flattened gradient of the partition", w * part, "stage3.py:2686")
        fp32 = [Term("fp32 gradient of the partition", 4 * part, "stage3.py:2686-2687")] if w != 4 else []
        convert, update = [flat] + fp32, fp32 or [flat]
        lay.optimizer = convert if Layout.total(convert) >= Layout.total(update) else update
    if t.hardware.device == "cuda" and off_par:  # zero.Init moves each partition to the host as it is made
        lay.build.append(
            Term("one parameter whole while partitioned", w * max(tr.param_numels), "partition_parameters.py")
        )
    elif t.hardware.device == "cuda":
        lay.build.append(Term("partitions as built (zero.Init)", w * part, "suite/worker.py, partition_parameters.py"))
    else:
        lay.build.append(Term("parameters as built", _built_bytes(t, tr), "suite/worker.py, suite.models.build"))
    # the largest sub-group's fp32 gradient, on the optimizer's device (the host under offload, stage3.py:333)
    largest = max(methods.sub_groups(t, tr.param_numels))
    init = Term("optimizer init gradient buffer", 4 * largest, "stage3.py:1302-1306")
    (lay.host if off_opt else lay.build).append(init)


def fsdp2_layout(t: Trial, tr: Trace) -> Layout:
    """FSDP2 as suite/engines.py lays it out (fully_shard per block, then the root)."""
    me = t.methods
    n = t.devices
    w = bytes_per_element(t.precision)
    p = tr.n_params
    part = p / n
    lay = Layout(grads_accumulate=False)
    cpu_offload = me.offload != "none" and t.hardware.device == "cuda"
    shards = [
        Term("fp32 parameter shards", 4 * part, "suite/engines.py (fully_shard, fp32 sharded parameters)"),
        Term("AdamW moments of the shards", 8 * part, "suite/engines.py (torch fused AdamW)"),
    ]
    (lay.host if cpu_offload else lay.steady).extend(shards)
    # Made by the first reduce-scatter of a step, freed by zero_grad(set_to_none=True) after it:
    # at the step only, unless every micro-step reduces (later ones accumulate into them).
    grad_shards = Term("fp32 gradient shards", 4 * part, "_fsdp_collectives.py:704-754, suite/engines.py (step)")
    kept = me.reduce_every_micro_step and t.gas_measured > 1
    (lay.host if cpu_offload else lay.steady if kept else lay.optimizer).append(grad_shards)
    blocks = list(tr.block_numels)
    root = p - sum(blocks)
    units = blocks + [root]
    if methods.reshards_after_forward(me):
        two = sorted(units)[-2:]
        lay.backward.append(Term("two units gathered whole", w * sum(two), "suite/engines.py (reshard_after_forward)"))
    else:
        lay.backward.append(Term("every unit gathered from forward to backward", w * p, "suite/engines.py"))
    largest = max(units)
    if me.reduce_every_micro_step:
        lay.backward.append(
            Term("one unit's unsharded gradients, being reduced", 4 * largest, "_fsdp_param_group.py (post_backward)")
        )
    elif t.gas_measured > 1:  # reduce-scattered, and freed, by the boundary's backward: never at the step
        lay.backward.append(
            Term("unsharded fp32 gradients (no_sync)", 4 * p, "suite/engines.py, _fsdp_collectives.py:605-606")
        )
    if t.hardware.device == "cuda":  # built on the host, each unit moved to the device and cut there
        lay.host.append(Term("fp32 model as built on the host", 4 * p, "suite/engines.py (FSDP2.build)"))
        lay.build.append(Term("fp32 shards placed so far", 4 * part, "_fsdp_init.py:369-401"))
        lay.build.append(Term("the unit being cut, whole on the device", 4 * largest, "_fsdp_init.py:369-401"))
    else:  # a CPU worker's host is its device
        lay.build.append(Term("fp32 model as built on the host", 4 * p, "suite/engines.py (FSDP2.build)"))
    return lay


def loop_layout(t: Trial, tr: Trace, states: str, optimizer: str, torch_ddp: bool) -> Layout:
    """A plain PyTorch loop's states (a published run outside DeepSpeed and FSDP; `suite.predict.gpu.
    Implementation`): under "amp" fp32 parameters, gradients and AdamW moments, and the 16-bit
    copies of the weights autocast makes at the forward and keeps to the backward
    (torch.autocast(cache_enabled=True): the casts of leaf tensors that require gradients are
    cached until the autocast region ends); under "pure" all of them in the 16-bit dtype (torch's
    AdamW keeps its moments in each parameter's dtype: `torch.zeros_like(p)`, torch/optim/adamw.py).
    torch's DistributedDataParallel keeps its gradient buckets beside the gradients
    (gradient_as_bucket_view=False, its default; torch/nn/parallel/distributed.py). A foreach AdamW
    makes one temporary of the states' size at the step (`torch._foreach_sqrt(exp_avg_sqs)`,
    torch/optim/adam.py `_multi_tensor_adam`); a per-tensor loop one of the largest tensor's."""
    w, p = bytes_per_element(t.precision), tr.n_params
    ws = w if states == "pure" else 4
    lay = Layout(grads_accumulate=True)
    lay.steady.append(Term("parameters", ws * p, f"{states}: the model's parameters"))
    lay.steady.append(Term("gradients (p.grad, accumulated by autograd)", ws * p, "autograd AccumulateGrad"))
    lay.steady.append(Term("AdamW moments", 2 * ws * p, "torch AdamW: exp_avg, exp_avg_sq like each parameter"))
    if states == "amp" and w == 2:
        lay.backward.append(Term("16-bit weight copies cached by autocast", w * p, "torch.autocast cache_enabled"))
    if torch_ddp and t.devices > 1:
        lay.steady.append(Term("DDP gradient buckets", ws * p, "torch DistributedDataParallel (reducer buckets)"))
    temp = {"foreach": ws * p, "loop": ws * max(tr.param_numels)}.get(optimizer, 0.0)
    if temp:
        lay.optimizer.append(Term(f"{optimizer} AdamW temporary", temp, "torch/optim/adam.py (exp_avg_sq's sqrt)"))
    lay.build.append(Term("parameters as built", 4 * p, "fp32, then cast"))
    return lay


def layout(t: Trial, tr: Trace, loop: tuple[str, str, bool] | None = None) -> Layout:
    """The trial's layout: its engine's, or a plain loop's (`loop_layout`: states, optimizer, torch DDP)."""
    if loop is not None:
        lay = loop_layout(t, tr, *loop)
    else:
        lay = fsdp2_layout(t, tr) if t.methods.engine == "fsdp2" else deepspeed_layout(t, tr)
    b = t.methods.micro_batch
    if lay.grads_accumulate and t.gas_measured == 1:
        grads = next(x for x in lay.steady if x.name.startswith("gradients"))
        lay.steady.remove(grads)
        lay.activations = tr.activation_bytes_with_grads(b)
    else:
        lay.activations = tr.activation_bytes(b)
    return lay


def _built_bytes(t: Trial, tr: Trace) -> float:
    """The model as suite/worker.py builds it: in fp32 on its device (the engine casts it to the
    training dtype afterwards), under ZeRO-3 on CUDA inside deepspeed.zero.Init (partitioned)."""
    return 4 * tr.n_params
