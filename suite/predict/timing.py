"""Step time of a trial, predicted in seconds from its parts, composed as the worker measures it:

    step_time = (GAS - 1) * t_micro + t_boundary + t_optimizer        (suite.metrics)

    t_micro    = compute(forward + backward, recomputed forward included) + per-micro-step
                 communication not hidden behind compute (ZeRO-2, ZeRO-3, FSDP2 gathers)
    t_boundary = the same micro-step + the reduction of gradients done at the boundary
                 (DDP and ZeRO-1 after backward; FSDP2's reduce-scatter)
    t_optimizer = the engine's step: gradient norm, the AdamW update over the states this rank
                 owns, and what follows it (ZeRO-1/2 all-gather the updated parameters)

Compute is a roofline over every operator of the traced micro-step (`suite.predict.trace`):

    t_op = max(flops / matmul_rate(shape), bytes / memory_rate(op, bytes)) + first_touch + op_overhead_s

and the machine's measured loop scales multiply each part (`suite.calibrate.step_scales`:
real trials of a calibration model, measured against their prediction from the microbenchmarks
alone; what a real loop costs beyond its operators and collectives measured one at a time):
compute and the communication of a micro-step and of the boundary by ZeRO-0's
`step_scale["zero0"]["compute"]` (the engine's own communication scale is recorded, not used:
`suite.predict.machine.loop_scale`), the optimizer's step by the engine's `["optimizer"]`, and
every collective adds the engine's `["sync"]` seconds: what one costs in a real loop beyond its
microbenchmark (the wait for the slower rank at each synchronization, the engine's hooks and
copies around it), measured on the same reference trial; a datasheet's scales are 1 and its
sync 0.

with matmul_rate measured by shape on a CPU (`suite.calibrate`) or the GPU's dense
peak times its matmul efficiency (`suite.predict.machine`), memory_rate measured by size (a
small tensor stays in cache) or the datasheet's bandwidth, on a CPU per operator where its
pace is its own (a softmax's exp and log, GELU's erf: `Machine.op_curves`), first_touch what
the operator's fresh allocations cost beyond their writing on a CPU (page faults above glibc's
mmap threshold: `Machine.first_touch`; counted for the operators paced by the add, which
writes into a tensor that exists, not for those whose measured pace includes their results'
allocation), and a causal attention kernel doing
half of the FLOPs counted for it (it skips the blocks above the diagonal). A collective of S
bytes among N ranks is the ring model NCCL's tuner uses (and gloo's ring algorithms follow):

    t = latency + S * steps / (N * bus_bps),  steps = 2(N-1) all-reduce, N-1 all-gather and reduce-scatter

with latency and bus bandwidth measured (CPU, or a calibrated GPU) or from the datasheet's link
(GPU); across nodes the bus bandwidth is the smaller of the link and the network per node
(`cluster.network_gbps`), and every ring step between nodes adds NCCL's network latency.
How many collectives run, and of which size, follows DeepSpeed's buckets: a bucket is flushed
when the next gradient would overflow it, and a gradient larger than the bucket goes alone
(stage_1_and_2.py:1414-1440); each is all-reduced whole (use_multi_rank_bucket_allreduce,
stage_1_and_2.py:1694-1716). ZeRO-3 all-gathers each module's parameters before its forward
and, since it keeps them for their reuse in backward up to `stage3_max_reuse_distance`
elements (partitioned_param_coordinator.py:634-664), again in backward only beyond that.
Overlap is what the engines do: DeepSpeed ZeRO 0-2 reduce on the compute stream (overlap_comm
is off below ZeRO-3, zero/config.py:384-386) and so never hide a collective; ZeRO-3
(overlap_comm on, parameter prefetch) and FSDP2 (prefetched all-gathers, reduce-scatter on its
own stream) hide communication behind compute on a GPU up to the compute time; a CPU worker
runs every collective in line. ZeRO-3's hooks cost each of its collectives host time on a GPU,
and its micro-step lasts the longer of the host's time and the GPU's (`gpu.ZERO3_HOOK_S`,
measured; a calibrated machine's loop has it in its `sync`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from suite import methods
from suite.config import Trial
from suite.predict import comm, gpu
from suite.predict.gpu import SUITE, Implementation
from suite.predict.machine import (
    Machine,
    interpolate,
    loop_scale,
    loop_sync,
)
from suite.predict.memory import bytes_per_element
from suite.predict.nvme import swapped
from suite.predict.operators import ATTENTION_PREFIX, MATMULS, VIEWS
from suite.predict.trace import Trace


@dataclass
class Parts:
    """A predicted step and its parts, in seconds; `detail` names what each part holds."""

    t_micro: float
    t_boundary: float
    t_optimizer: float
    gas: int
    detail: dict[str, float] = field(default_factory=dict)

    @property
    def step_time_s(self) -> float:
        return (self.gas - 1) * self.t_micro + self.t_boundary + self.t_optimizer


def compute_seconds(
    tr: Trace, b: int, m: Machine, dtype: str, impl: Implementation = SUITE, compiled: bool = False
) -> tuple[float, float, int]:
    """(forward seconds, backward seconds, operators) of one micro-step of b samples; on a GPU as
    `impl` runs it (`gpu_compute_seconds`)."""
    if m.kind == "cuda":
        return gpu_compute_seconds(tr, b, m, dtype, impl, compiled)
    out = {"forward": 0.0, "backward": 0.0}
    n_ops = 0
    for g in tr.groups:
        flops, moved = g.flops_at(b), g.bytes_at(b)
        work = 0.0
        if g.op in MATMULS and flops:
            work = flops / _matmul_rate(m, dtype, g.dims_at(b))
        elif g.op.startswith(ATTENTION_PREFIX) and flops:
            dims = g.dims_at(b)
            causal = dims[5] if len(dims) > 5 else 0
            work = flops * (0.5 if causal else 1.0) / _attention_rate(m, dtype, dims, g.phase)
        elif flops:
            work = flops / _matmul_rate(m, dtype, (1, 1024, 1024, 1024))
        stream = moved / stream_rate(m, moved, g.op) if m.memory_bps and moved and g.op not in VIEWS else 0.0
        # The pace of matmuls, attention and `op_curves`' operators was measured with their
        # results allocated anew; an add's (`memory_curve`) into a tensor that exists.
        paced = g.op in MATMULS or g.op.startswith(ATTENTION_PREFIX) or g.op in m.op_curves
        touch = comm.first_touch_seconds(m, g.allocs_at(b)) if m.first_touch and not paced else 0.0
        out[g.phase] += g.count * (max(work, stream) + touch + m.op_overhead_s)
        n_ops += g.count
    return out["forward"], out["backward"], n_ops


def gpu_compute_seconds(
    tr: Trace, b: int, m: Machine, dtype: str, impl: Implementation, compiled: bool, kinds: dict | None = None
) -> tuple[float, float, int]:
    """A GPU's forward and backward: each phase the larger of its kernels' time on the GPU and its
    operators' dispatch on the host, which runs ahead (`gpu.EAGER_DISPATCH_S`).

    GEMMs at the GPU's best rate plus their fixed time (`gpu.GEMM_FIXED_S`), or at memory speed
    where they move more than they compute; fused attention at its kernel's measured rate
    (`gpu.attention_fraction`); every other operator at memory speed, each kernel followed by a
    launch gap. With norms and activations fused (`Implementation.elementwise_fused`: by hand, or
    torch.compile) the operators between two GEMMs are one kernel reading and writing the GEMM's
    output once, and only kernels are dispatched. `kinds`, given, gets the device seconds of a
    micro-step by kind of kernel (gemm, attention, memory) and the host's (host)."""
    fused = impl.elementwise_fused(compiled)
    peak, w = _peak(m, dtype), bytes_per_element(dtype)
    kernel = impl.kernel("", m.gpu)
    device = {"forward": 0.0, "backward": 0.0}
    host = {"forward": 0.0, "backward": 0.0}
    n_ops = 0
    for g in tr.groups:
        flops, moved = g.flops_at(b), g.bytes_at(b)
        kind = "memory"
        if g.op in VIEWS:
            t = 0.0
        elif g.op in MATMULS and flops:
            kind = "gemm"
            dims = g.dims_at(b)
            rate = _matmul_rate(m, dtype, dims) * m.sustained
            t = max(flops / rate, moved / m.memory_bps) + gpu.GEMM_FIXED_S + gpu.LAUNCH_GAP_S
            if fused:  # the fused kernel after it: its output read, the result written
                t += 2 * dims[0] * dims[1] * dims[2] * w / m.memory_bps + gpu.LAUNCH_GAP_S
        elif g.op.startswith(ATTENTION_PREFIX) and flops:
            kind = "attention"
            dims = g.dims_at(b)
            causal = bool(dims[5]) if len(dims) > 5 else False
            rate = peak * gpu.attention_fraction(kernel, m.gpu, dims[2], dims[4], causal) * m.sustained
            t = flops * (0.5 if causal else 1.0) / rate + gpu.LAUNCH_GAP_S
        elif fused:
            t = 0.0
        else:  # a convolution's FLOPs at the GEMMs' rate, anything else at memory speed
            t = max(flops / (peak * m.gemm_best * m.sustained), moved / m.memory_bps) + gpu.LAUNCH_GAP_S
        device[g.phase] += g.count * t
        host[g.phase] += g.count * gpu.EAGER_DISPATCH_S * _dispatched(g, b, fused)
        n_ops += g.count
        if kinds is not None:
            kinds[kind] = kinds.get(kind, 0.0) + g.count * t
    fwd, bwd = (max(device[p], host[p]) for p in ("forward", "backward"))
    if kinds is not None:
        kinds["host"] = host["forward"] + host["backward"]
    return fwd, bwd, n_ops


def _dispatched(g, b: int, fused: bool) -> bool:
    """Whether a GPU's host dispatches the operator group `g` as kernels of its own: every operator
    in eager mode; with norms and activations fused only the GEMMs and attention."""
    kernel = (g.op in MATMULS or g.op.startswith(ATTENTION_PREFIX)) and g.flops_at(b)
    return not fused or bool(kernel and g.op not in VIEWS)


def host_seconds(tr: Trace, b: int, impl: Implementation = SUITE, compiled: bool = False) -> float:
    """The host's time to dispatch one micro-step's operators on a GPU (forward and backward)."""
    fused = impl.elementwise_fused(compiled)
    return sum(g.count * gpu.EAGER_DISPATCH_S for g in tr.groups if _dispatched(g, b, fused))


def stream_rate(m: Machine, nbytes: float, op: str = "") -> float:
    """Bytes/s of a non-matmul operator moving `nbytes`: its own measured pace where calibrated
    (`Machine.op_curves`), else an elementwise add's, measured by size where calibrated."""
    if op in m.op_curves:
        return interpolate(m.op_curves[op], (nbytes,))
    return interpolate(m.memory_curve, (nbytes,)) if m.memory_curve else m.memory_bps


def math_dtype(t: Trial) -> str:
    """The dtype a trial's matmuls run in: its precision, or tf32 for fp32 on TF32 tensor cores (`Trial.tf32`)."""
    return "tf32" if t.precision == "fp32" and t.tf32 else t.precision


def _peak(m: Machine, dtype: str) -> float:
    key = dtype if dtype in m.peak_flops else "fp32"
    return m.peak_flops.get(key) or m.peak_flops.get("fp32", 0.0)


def _matmul_rate(m: Machine, dtype: str, dims: tuple[int, ...]) -> float:
    """FLOP/s of a matrix multiply: measured by shape where calibrated, else the GPU's peak
    at its best GEMM fraction."""
    table = m.matmul.get(dtype) or (m.matmul.get("fp32") if m.kind == "cpu" else None)
    if not table:
        rate = _peak(m, dtype) * m.gemm_best_by.get(dtype, m.gemm_best)
        return rate if gpu.aligned(dims, dtype) else rate * gpu.MISALIGNED_RATE
    batch, rows, cols, inner = dims
    return interpolate(table, (batch * rows, cols, inner))


def _attention_rate(m: Machine, dtype: str, dims: tuple[int, ...], phase: str) -> float:
    if not m.attention:
        return _matmul_rate(m, dtype, (dims[0] * dims[1], dims[2], dims[3], dims[4]))
    column = 2 if phase == "forward" else 3
    return interpolate([[p[0], p[1], p[column]] for p in m.attention], (dims[2], dims[4]))


def step_parts(
    t: Trial,
    tr: Trace,
    m: Machine,
    nodes: int = 1,
    net: comm.Network = comm.DEFAULT_NETWORK,
    impl: Implementation = SUITE,
) -> Parts:
    """The step's parts: t_micro, t_boundary (compute and the engine's communication) and
    t_optimizer, as `impl` runs them on a GPU (the suite's own trial by default)."""
    me = t.methods
    kinds: dict[str, float] = {}
    if m.kind == "cuda":
        fwd, bwd, _ = gpu_compute_seconds(tr, me.micro_batch, m, math_dtype(t), impl, me.compile, kinds)
    else:
        fwd, bwd, _ = compute_seconds(tr, me.micro_batch, m, math_dtype(t), impl, me.compile)
    scale = loop_scale(m, me, "compute")
    fwd, bwd = fwd * scale, bwd * scale
    compute = fwd + bwd
    detail: dict[str, float] = {"forward_s": fwd, "backward_s": bwd, "compute_scale": scale}
    detail.update({f"{k}_s": v for k, v in kinds.items()})  # a GPU's micro-step by kind of kernel
    c = comm.Comm(t, tr, m, nodes, net)
    if me.engine == "fsdp2":
        micro_comm, boundary_comm, n_micro, n_boundary = comm.fsdp2(c, fwd, bwd, impl.grad_reduce_bytes)
    elif me.zero_stage == 0:
        if impl.torch_ddp:
            micro_comm, boundary_comm, n_micro, n_boundary = comm.torch_ddp(c, bwd, state_bytes(t, impl))
        else:
            micro_comm, boundary_comm, n_micro, n_boundary = comm.ddp(c)
    elif me.zero_stage in (1, 2):
        micro_comm, boundary_comm, n_micro, n_boundary = comm.zero12(c, detail)
    else:
        host = host_seconds(tr, me.micro_batch, impl, me.compile) if m.kind == "cuda" else 0.0
        micro_comm, boundary_comm, n_micro, n_boundary = comm.zero3(c, compute, detail, host)

    # Communication takes the compute scale (`loop_scale`: the engine's own proved unstable),
    # and each collective the engine's measured cost in a real loop (`loop_sync`).
    sync = loop_sync(m, me)
    t_micro = compute + micro_comm * scale + n_micro * sync
    t_boundary = compute + (micro_comm + boundary_comm) * scale + (n_micro + n_boundary) * sync
    detail.update(micro_comm_s=micro_comm, boundary_comm_s=boundary_comm, sync_s=sync)
    detail.update(collectives_micro=n_micro, collectives_boundary=n_boundary)

    if impl.states == "amp" and t.precision != "fp32" and m.memory_bps:
        # autocast casts each fp32 weight to 16 bits at the forward (read 4, write 2 bytes) and
        # autograd accumulates each 16-bit gradient into the fp32 one (read 2 + 4, write 4)
        cast = 16 * tr.n_params / m.memory_bps
        detail["autocast_s"] = cast
        t_micro, t_boundary = t_micro + cast, t_boundary + cast
    t_opt, opt_detail = optimizer_seconds(t, tr, m, nodes, net, impl)
    opt_scale = loop_scale(m, me, "optimizer")
    t_opt *= opt_scale
    detail.update(opt_detail, optimizer_scale=opt_scale)
    return Parts(t_micro, t_boundary, t_opt, t.gas, detail)


ADAM_PASSES = {"fused": 7, "foreach": 20, "loop": 20}
"""Tensor-sized reads and writes of one AdamW step: fused, parameter, gradient and both moments
read, parameter and moments written (multi_tensor_adam.cu); as separate operations (torch's
`_multi_tensor_adam` and `_single_tensor_adam`, torch/optim/adam.py: lerp, mul, addcmul, the
weight decay's mul, sqrt, div, add, addcdiv) 20."""
ADAM_OPS = 10
"""Operations of one AdamW step on one tensor as separate kernels (torch/optim/adam.py)."""


def state_bytes(t: Trial, impl: Implementation) -> int:
    """Bytes per element of a loop's parameters and gradients (`Implementation.states`): fp32 under
    autocast, else the training dtype (16-bit parameters, also under an engine's own layout)."""
    return 4 if impl.states == "amp" else bytes_per_element(t.precision)


def loop_optimizer_seconds(t: Trial, tr: Trace, m: Machine, impl: Implementation) -> tuple[float, dict[str, float]]:
    """A plain loop's step (`Implementation.states` amp or pure): the gradients' norm for
    clipping (read, then scaled: `clip_grad_norm_`) and AdamW as `impl.optimizer` runs it, each
    operation at memory speed; a per-tensor loop also dispatches its operations one tensor at a
    time, on the host."""
    ws, p = state_bytes(t, impl), tr.n_params
    device = (ADAM_PASSES[impl.optimizer] + 3) * ws * p / m.memory_bps
    host = len(tr.param_numels) * ADAM_OPS * gpu.EAGER_DISPATCH_S if impl.optimizer == "loop" else 0.0
    return max(device, host), {"adam_s": device, "adam_host_s": host}


def optimizer_seconds(
    t: Trial, tr: Trace, m: Machine, nodes: int, net: comm.Network, impl: Implementation = SUITE
) -> tuple[float, dict[str, float]]:
    """The engine's step after the boundary micro-step: norm, update, and what follows.

    Under offload on a GPU the update is DeepSpeed's CPU Adam on the host, every rank of a node
    stepping its partition at once on the node's cores (`Machine.host_adam_elements_per_s`),
    after its gradients come down the host link (16-bit under ZeRO-1/2, converted to fp32 on the
    device under ZeRO-3: stage3.py `_offload_grad_partition_at_boundary`) and before the updated
    16-bit parameters go back up (not under optimizer+params, whose parameters stay on the host);
    the step waits for both (`offload_seconds`). Under the NVMe tier the optimizer's sub-groups
    are read from the drive and written back around their update (`nvme_seconds`)."""
    me = t.methods
    n, w, p = t.devices, bytes_per_element(t.precision), tr.n_params
    if impl.states != "engine" and m.kind == "cuda" and me.engine == "deepspeed" and me.zero_stage == 0:
        return loop_optimizer_seconds(t, tr, m, impl)
    z = me.zero_stage if me.engine == "deepspeed" else None
    owned = p if z == 0 else p / n
    offload = me.offload != "none" and m.kind == "cuda"
    kind = _adam_kind(t)
    rate = m.adam_elements_per_s.get(kind)
    detail: dict[str, float] = {}
    if offload:
        update, transfers = offload_seconds(t, m, owned)
        if math.isnan(update):
            return math.nan, {"host_adam_s": math.nan}
        detail.update(host_adam_s=update, host_transfer_s=transfers)
        update += transfers
    else:
        if not rate:
            return math.nan, {}
        update = owned / rate
    swap = nvme_seconds(t, tr, m, detail)
    update += swap
    norm = 2 * w * owned / m.memory_bps if m.memory_bps else 0.0  # read for the norm, scale for clipping
    norm += comm.collective_seconds(m, "all_reduce", 4, n, nodes, net)
    after = 0.0
    if z in (1, 2):
        after = comm.collective_seconds(m, "all_gather", w * p, n, nodes, net)
        after += 2 * (w + 4) * owned / m.memory_bps if m.memory_bps else 0.0  # flatten, to fp32, copy back
    elif z == 0 and t.precision != "fp32":
        after = 2 * (w + 4) * p / m.memory_bps if m.memory_bps else 0.0  # FP16_Optimizer's flatten and copy back
    detail.update(adam_s=update, norm_s=norm, after_step_s=after)
    return update + norm + after, detail


def offload_seconds(t: Trial, m: Machine, owned: float) -> tuple[float, float]:
    """(CPU Adam seconds, host-link seconds) of one rank's step under offload on a GPU: its
    partition of `owned` parameters at its share of the node's CPU Adam, and its gradients down and
    updated parameters up the host link (`Machine.host_bps`, each rank its own x16 link). NaN
    where the host's CPU Adam is not known."""
    if not m.host_adam_elements_per_s:
        return math.nan, 0.0
    w = bytes_per_element(t.precision)
    update = owned * t.hardware.count / m.host_adam_elements_per_s
    grads = (4 if t.methods.zero_stage == 3 else w) * owned
    params = 0.0 if t.methods.offload == "optimizer+params" else w * owned
    return update, (grads + params) / m.host_bps


def nvme_traffic(t: Trial, tr: Trace) -> tuple[float, float]:
    """(bytes read, bytes written) of one rank's NVMe drive traffic per step under the NVMe tier
    (`suite.predict.nvme.swapped`): the swapped optimizer sub-groups read whole (fp32 parameter,
    two moments and gradient: 16 bytes an element) and written back (the gradients at the
    boundary, the three states after the update: 16); under optimizer+params each swapped
    parameter partition read at every gather of every micro-step (`comm.gathered`), and written once
    after the step. The worker measures the same on each rank (`suite.worker.io_bytes`)."""
    opt, par = swapped(t, tr)
    w = bytes_per_element(t.precision)
    read = 16 * opt + w * par * comm.gathered(t, tr)[1] * t.gas
    written = 16 * opt + w * par
    return read, written


def nvme_seconds(t: Trial, tr: Trace, m: Machine, detail: dict[str, float]) -> float:
    """Seconds of the NVMe tier's swap in a step of one rank, at its share of the node's drive:
    DeepSpeed's optimizer swapper reads a sub-group, steps it and writes it back while reading the
    next (partitioned_optimizer_swapper.py), all on one drive, so reads and writes add up; the
    parameters' reads are in the micro-steps (`comm.zero3`). NaN where the drive's pace is unknown."""
    if not methods.on_nvme(t):
        return 0.0
    opt, par = swapped(t, tr)
    read, written = nvme_traffic(t, tr)
    detail.update(nvme_read_bytes=read * t.devices, nvme_write_bytes=written * t.devices)
    if not (m.nvme_read_bps and m.nvme_write_bps):
        detail["nvme_s"] = math.nan
        return math.nan
    share = t.hardware.count  # the node's ranks swap to one drive at once
    w = bytes_per_element(t.precision)
    seconds = share * (16 * opt / m.nvme_read_bps + (16 * opt + w * par) / m.nvme_write_bps)
    detail["nvme_s"] = seconds
    return seconds


def _adam_kind(t: Trial) -> str:
    """Which AdamW the worker steps with: DeepSpeed's own when its config names an optimizer
    (suite.methods.deepspeed_config), else torch's fused AdamW (FSDP2's, and the one handed to
    DeepSpeed under methods.optimizer=torch_fused)."""
    if t.methods.engine == "fsdp2":
        return "torch_fused"
    if t.methods.optimizer == "engine":  # the config names an optimizer: DeepSpeed builds its own
        return "deepspeed_cpu" if t.methods.offload != "none" else "deepspeed"
    return "torch_fused"
