"""Memory per rank of a trial, predicted: the model states each engine keeps, laid out as the
engine really lays them out (`suite.predict.peaks.Layout`: timed and build peaks), plus the
activations traced from the real model.

`steady` is what stays allocated through every micro-step of the timed window: parameters,
gradients an engine keeps between micro-steps, fp32 master weights, optimizer moments. The
activation term comes from `suite.predict.trace` (the micro-step's live bytes beyond the
model states, at the recipe's micro-batch). What an engine holds during a micro-step changes as
the backward goes: ZeRO-2 fills its gradient partition, ZeRO-3 and FSDP2 release the parameters
of the modules done, FSDP2 gathers each unit as the forward and the backward reach it. The trace
gives the activations at each such moment (`Trace.moments`: the largest live bytes while exactly
the first k gradients exist, and those of the forward), and the micro-step's peak is the
largest of activations plus engine at the same moment, not the sum of their separate peaks
(`suite.predict.peaks.at_peak`). Nothing here depends on the architecture: only parameter counts (all, per block,
per unit, the order their gradients appear) enter.

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
moments 8P/N. Rank r owns the elements [r, r+1) x P/N of the flat buffer (:589-590,
`get_partition_info` :2579-2611), but its gradient buffer `grads_in_partition` holds every
parameter that overlaps them whole (`copy_grads_in_partition` :2183-2198): S_r elements, up to
about P on the rank whose partition cuts through a large embedding. Reduce bucket wB_r
allocated at each backward (:3256-3270). ZeRO-2 reduces every gradient as it is produced
(:2289-2291, :1414-1460) and copies the rank's own into that buffer as they come; at the end of
the micro-step's backward it becomes the accumulated gradients (`all_grad_tensors`,
:1040-1046) and a later micro-step's buffer is added into them (:1042-1045) and freed: from
the second micro-step of a step on, wS_r accumulated plus the current buffer as it fills (on a
CPU worker resident as it is written, a fresh mmap of 128 KiB and more; on a GPU allocated
whole at the first copy). ZeRO-1 leaves the gradients to autograd until the boundary (wP,
:2284-2295), reduces them there through the bucket and moves the rank's own into the same
buffer (:2277-2279), and the epilogue clears every p.grad (:1058, 2630-2639), so at the step
only wS_r of gradients remain. The step (:3013-3160) first takes the gradients' norm, each of
the partition's pieces converted to fp64 in turn (`get_grad_norm_direct` :2684, utils.py:59-63:
fp64 where the device has it), then flattens the partition (wP/N, while the buffer still holds
them) and converts it to fp32 (4P/N; `.to` of the same dtype is no copy) (:3108-3139), and
all-gathers the updated parameters into the flat buffer in place (:3155-3159). Every rank is
laid out and the largest peak taken: the worker reports the largest rank's.

DeepSpeed ZeRO-3 (stage3.py): parameter partitions wP/N (partition_parameters.py), whole
parameters below `stage3_param_persistence_threshold` elements on every rank, an fp32
master partition 4P/N (a copy, stage3.py:1168-1172), moments 8P/N, a gradient partition
buffer wP/N (:791-793), the reduce bucket wB_r (:780-784), the norm's fp64 copy of each
parameter's partition in turn (:2457), the partition's gradient flattened and converted to fp32
at the step (:2686-2687), and the gathered parameters: a module's parameters are released after
it runs only if no module within the next `stage3_max_reuse_distance` elements (1e9 by
default) uses them again (partitioned_param_coordinator.py:634-664), and every parameter of the
forward is used again in the backward, so up to 1e9 elements (the whole model below that size)
stay gathered from forward into backward, each until its module's backward is done (counted as
released once its gradient exists; a tied embedding's comes last).

Offload (`offload_optimizer`, ZeRO >= 1): master weights, moments and fp32 gradient
partitions live in the host's memory (pinned on a GPU); `optimizer+params` (ZeRO-3) moves the
parameter partitions there too. On a CPU worker host and device are the same memory.

The NVMe tier: `suite.predict.nvme`.

FSDP2 (suite/engines.py's layout): fp32 parameter shards 4P/N and moments 8P/N (torch's fused
AdamW, no temporaries) through the window; fp32 gradient shards 4P/N only from the boundary's
reduce-scatter, which makes them unit by unit as it frees the unsharded gradients it reduces
(_fsdp_collectives.py:605-606, 704-754), to `zero_grad(set_to_none=True)` after the step: none
exists at the start of a backward, when the activations peak (from the first micro-step on when
every micro-step reduces). A unit's all-gather writes into one buffer of the whole unit and
copies it out into the unsharded parameters (`foreach_all_gather`,
`foreach_all_gather_copy_out`, _fsdp_collectives.py), and the buffer is freed only when the
next unit's all-gather is issued: gathering a unit holds twice its bytes, and the forward starts
with the root (embeddings, final norm, head) and the first block so held (measured: a 64k-vocabulary
root held twice, then the first block's). While computing, a unit's parameters are gathered
whole in the compute dtype: under reshard_after_forward the root for the forward and again from
the start of the backward (gathered twice then, with the forward's activations) to its end,
and about two blocks at a time; without it every unit from its forward to its backward. Before
the boundary each rank accumulates unsharded fp32 gradients (4P) when gas > 1, unless gradients
are reduce-scattered at every micro-step (`methods.reduce_every_micro_step`: one unit's unsharded
gradients at a time). On a GPU the fp32 model is built in the host's memory (not the device's);
the device holds the shards placed so far and the unit being cut.
"""

from __future__ import annotations

import math

from suite import methods
from suite.config import Trial
from suite.predict import nvme
from suite.predict.machine import GIB
from suite.predict.peaks import Layout, Term, arrived, at_peak, bytes_per_element, order
from suite.predict.trace import Trace

ALLREDUCE_BUCKET = 500_000_000
"""Elements of ZeRO-0's gradient all-reduce buffer (MEMORY_OPT_ALLREDUCE_SIZE, engine.py:3073)."""
REUSE_DISTANCE = 1_000_000_000
"""ZeRO-3's stage3_max_reuse_distance default, in elements (zero/config.py:251)."""
ALIGNMENT = 2
"""ZeRO-1/2's flat buffer is padded to a multiple of this times N before it is cut into N
partitions (nccl_start_alignment_factor, stage_1_and_2.py:387, 440-446)."""
NORM_BYTES = 8
"""ZeRO's gradient norm converts each gradient to fp64 first (zero/utils.py:59-63)."""


def _partition_step(part: float, w: int, buffer: list[Term], norm: float = 0.0) -> list[Term]:
    """The largest of the step's moments (stage_1_and_2.py:3013-3139): the norm converts each
    gradient piece to fp64 in turn (`norm`: the largest, while the buffer holds them all); the
    partition's gradients are flattened (a copy, while the buffer they come from is still held)
    and converted to fp32 (a copy unless they are fp32 already: `.to` of the same dtype is the
    tensor itself); then the buffer is freed and AdamW runs on the fp32 gradient."""
    flat = Term("flattened gradient partition", w * part, "stage_1_and_2.py:3110-3117")
    fp32 = [Term("fp32 gradient partition", 4 * part, "stage_1_and_2.py:3118")] if w != 4 else []
    fp64 = [Term("fp64 copy of the largest gradient piece (norm)", norm, "stage_1_and_2.py:2684")] if norm else []
    update = fp32 or [flat]  # every AdamW the worker steps with is fused: one pass, in place
    return max((buffer + fp64, buffer + [flat] + fp32, update), key=Layout.total)


def deepspeed_layout(t: Trial, tr: Trace, built: str = "fp32") -> Layout:
    """DeepSpeed ZeRO 0-3 as suite/engines.py sets it up (suite.methods.deepspeed_config); ZeRO-1/2
    at the rank whose peak is largest."""
    z = t.methods.zero_stage
    if z in (1, 2):
        return max((_zero12(t, tr, r, built) for r in range(t.devices)), key=Layout.timed_peak)
    lay = Layout()
    (_zero0 if z == 0 else _zero3)(lay, t, tr, built)
    return lay


def _zero0(lay: Layout, t: Trial, tr: Trace, built_as: str) -> None:
    w, p, built = bytes_per_element(t.precision), tr.n_params, _built_bytes(t, tr, built_as)
    b = t.methods.micro_batch
    lay.steady.append(Term("parameters", w * p, "engine.py:2080-2094 (module cast to the training dtype)"))
    if t.gas_measured > 1:
        lay.steady.append(Term("gradients (p.grad, accumulated by autograd)", w * p, "engine.py:3084-3095"))
        lay.activations = tr.activation_bytes(b)
    else:  # born in p.grad during the one backward, after the activations' peak for most models
        lay.activations = tr.activation_bytes_with_grads(b)
    lay.steady.append(Term("AdamW moments", 8 * p, "torch AdamW / FusedAdam: exp_avg, exp_avg_sq in fp32"))
    flat = min(p, ALLREDUCE_BUCKET)
    lay.boundary.append(Term("all-reduce flat buffer", w * flat, "engine.py:3921-3933 buffered_allreduce_fallback"))
    if t.gas_measured == 1:
        lay.boundary.append(Term("gradients (p.grad)", w * p, "engine.py:3084-3095"))
        lay.optimizer.append(Term("gradients (p.grad)", w * p, "engine.py:3084-3095"))
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


def zero12_partition(numels: tuple[int, ...], n: int, r: int) -> tuple[list[int], int]:
    """The parameters (indices) that overlap rank r's partition of ZeRO-1/2's flat buffer, and the
    largest piece of one of them inside it, in elements (stage_1_and_2.py:440-446, 589-590,
    `get_partition_info` :2579-2611; one parameter group, no round-robin reordering)."""
    total = sum(numels)
    size = math.ceil(total / (ALIGNMENT * n)) * ALIGNMENT  # partition size, elements
    start, end = r * size, (r + 1) * size
    owned, largest, at = [], 0, 0
    for i, x in enumerate(numels):
        lo, hi = max(at, start), min(at + x, end)
        if lo < hi:
            owned.append(i)
            largest = max(largest, hi - lo)
        at += x
    return owned, largest


def _zero12(t: Trial, tr: Trace, r: int, built_as: str) -> Layout:
    lay = Layout()
    w, p, z, n = bytes_per_element(t.precision), tr.n_params, t.methods.zero_stage, t.devices
    part, b_r = p / n, methods.bucket_sizes(t)["reduce_bucket_size"]
    b, gas, cpu = t.methods.micro_batch, t.gas_measured, t.hardware.device == "cpu"
    off_opt, _ = _offloads(t)
    owned, piece = zero12_partition(tr.param_numels, n, r)
    whole = w * sum(tr.param_numels[i] for i in owned)
    lay.steady.append(Term("parameters, one flat buffer", w * p, "stage_1_and_2.py:503-507, 889-899"))
    opt_terms = [
        Term("fp32 master partition", 4 * part, "stage_1_and_2.py:556-557"),
        Term("AdamW moments of the partition", 8 * part, "fp32 exp_avg, exp_avg_sq"),
    ]
    (lay.host if off_opt else lay.steady).extend(opt_terms)
    bucket = Term("reduce bucket", w * b_r, "stage_1_and_2.py:3256-3270")
    # The engine casts the model to the training dtype (the fp32 copy freed), then flattens it: on
    # the device where it has room for a second 16-bit copy, else on the host, moving it back
    # (stage_1_and_2.py:438-455 `flatten_on_accelerator`, 501-524); the larger of the two moments.
    cast = [Term("parameters in the training dtype", w * p, "engine.py:2080-2094")]
    if cpu or t.hardware.mem_gib * GIB >= 2 * w * p:
        cast.append(Term("flat copy made while flattening", w * p, "stage_1_and_2.py:438-455, 501-510"))
    as_built = [Term("parameters as built", _built_bytes(t, tr, built_as), "suite/worker.py, suite.models.build")]
    lay.build += max(as_built, cast, key=Layout.total)
    if off_opt:
        # Gradients go to the host partition as they are reduced (GPU only): `copy_grads_in_partition`
        # copies each one to the fp32 host partition (and accumulates later micro-steps' there through
        # the staging buffer) and returns before it would allocate a partition buffer on the device
        # (stage_1_and_2.py:2161-2177). Measured: a ZeRO-2 offload trial on an H200 (Pythia-160M,
        # results/gpu-check/2026-12-04-h200-rerun) peaked at 29.10 GiB, 0.30 GiB (one 16-bit
        # partition) below what a device buffer would have added.
        lay.host.append(Term("fp32 gradient partition", 4 * part, "stage_1_and_2.py:936-941"))
        lay.host.append(Term("16-bit partition staging buffer", w * part, "stage_1_and_2.py:563-574"))
        largest = max(tr.param_numels)
        lay.steady.append(Term("gradient staging buffer (largest parameter)", w * largest, "stage_1_and_2.py:658-660"))
        if z == 1:
            lay.backward.append(Term("gradients (p.grad until the boundary)", w * p, "stage_1_and_2.py:2284-2295"))
            lay.boundary.append(bucket)
        lay.backward.append(bucket)
        lay.activations = tr.activation_bytes(b)
        return lay
    source = "stage_1_and_2.py:2183-2198 (grads_in_partition: the partition's parameters whole)"
    held = Term("gradients of the partition's parameters, whole", whole, source)
    if z == 1:
        if gas > 1:  # p.grad from the first micro-step on: the activations of a later one beside them
            lay.backward.append(Term("gradients (p.grad until the boundary)", w * p, "stage_1_and_2.py:2284-2295"))
            lay.activations = tr.activation_bytes(b)
        else:  # born in p.grad during the one backward
            lay.activations = tr.activation_bytes_with_grads(b)
        lay.backward.append(bucket)
        # Reduced at the boundary: the rank's own moved into grads_in_partition (GPU: allocated
        # whole at the first; CPU: written one parameter at a time), the others kept to the epilogue.
        moving = whole if not cpu else w * max((tr.param_numels[i] for i in owned), default=0)
        lay.boundary += [
            Term("gradients (p.grad, being reduced)", w * p, "stage_1_and_2.py:958-977, 2277-2279"),
            Term("gradient partition buffer, being filled", moving, source),
            bucket,
        ]
        lay.optimizer = _partition_step(part, w, [held], NORM_BYTES * piece)
        return lay
    # ZeRO-2: reduced as produced; the rank's own copied into this micro-step's buffer.
    if gas > 1:  # the earlier micro-steps' gradients, accumulated (all_grad_tensors)
        lay.steady.append(
            Term("accumulated gradients of the partition's parameters, whole", whole, "stage_1_and_2.py:1040-1046")
        )
    own = set(owned)
    got = arrived(tr, lambda i: tr.param_numels[i] if i in own else 0)  # elements of the rank's own, by k

    def engine(k: int) -> list[Term]:
        filled = (w * got[max(k, 0)]) if cpu else (whole if got[max(k, 0)] else 0.0)
        return [bucket, Term("this micro-step's gradient partition buffer, as filled", filled, source)]

    at_peak(lay, tr, b, engine)
    lay.boundary += [Term("this micro-step's gradient partition buffer", whole, source), bucket]
    lay.optimizer = _partition_step(part, w, [] if gas > 1 else [held], NORM_BYTES * piece)
    return lay


def _zero3(lay: Layout, t: Trial, tr: Trace, built_as: str) -> None:
    w, p, n = bytes_per_element(t.precision), tr.n_params, t.devices
    part, buckets = p / n, methods.bucket_sizes(t)
    off_opt, off_par = _offloads(t)
    threshold = buckets.get("stage3_param_persistence_threshold", 0)
    persistent = sum(x for x in tr.param_numels if x < threshold)
    sharded = p - persistent
    swap_opt, swap_par = nvme.swapped(t, tr)
    lay.nvme.extend(nvme.terms(t, tr))
    lay.host.extend(nvme.buffers(t, tr))
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
    # backward, so up to that many stay gathered from forward into backward, each until its
    # module's backward is done (its gradient exists).
    released = arrived(tr, lambda i: tr.param_numels[i] if tr.param_numels[i] >= threshold else 0)

    def engine(k: int) -> list[Term]:
        left = sharded - released[max(k, 0)]
        source = "partitioned_param_coordinator.py:634-664, zero/config.py:245-251 (max_reuse_distance 1e9)"
        return [Term("gathered parameters kept for reuse in backward", w * min(left, REUSE_DISTANCE), source)]

    at_peak(lay, tr, t.methods.micro_batch, engine)
    largest = max(methods.sub_groups(t, tr.param_numels))  # elements of the largest optimizer sub-group
    if not off_opt:
        # The norm's fp64 copies one parameter's partition at a time; then each sub-group in turn is
        # flattened and converted to fp32, stepped and its fp32 gradient released (stage3.py:2910-2927,
        # `_prepare_fp32_grad_for_sub_group` :2683-2699, `_release_sub_group` :2731-2738): the largest one's.
        fp64 = Term(
            "fp64 copy of the largest parameter's partition (norm)",
            NORM_BYTES * max(tr.param_numels) / n,
            "stage3.py:2457",
        )
        flat = Term("flattened gradient of the largest sub-group", w * largest, "stage3.py:2686")
        fp32 = [Term("fp32 gradient of the largest sub-group", 4 * largest, "stage3.py:2686-2687")] if w != 4 else []
        lay.optimizer = max(([fp64], [flat] + fp32, fp32 or [flat]), key=Layout.total)
    if t.hardware.device == "cuda" and off_par:  # zero.Init moves each partition to the host as it is made
        lay.build.append(
            Term("one parameter whole while partitioned", w * max(tr.param_numels), "partition_parameters.py")
        )
    elif t.hardware.device == "cuda":
        lay.build.append(Term("partitions as built (zero.Init)", w * part, "suite/worker.py, partition_parameters.py"))
    else:
        lay.build.append(
            Term("parameters as built", _built_bytes(t, tr, built_as), "suite/worker.py, suite.models.build")
        )
    # the largest sub-group's fp32 gradient, on the optimizer's device (the host under offload, stage3.py:333)
    init = Term("optimizer init gradient buffer", 4 * largest, "stage3.py:1302-1306")
    (lay.host if off_opt else lay.build).append(init)


def fsdp2_layout(t: Trial, tr: Trace, built: str = "fp32") -> Layout:
    """FSDP2 as suite/engines.py lays it out (fully_shard per block, then the root)."""
    me = t.methods
    n = t.devices
    w = bytes_per_element(t.precision)
    p = tr.n_params
    part = p / n
    lay = Layout()
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
    first = blocks[0] if blocks else 0
    largest = max(blocks + [root])
    resharded = methods.reshards_after_forward(me)
    no_sync = t.gas_measured > 1 and not me.reduce_every_micro_step
    grads: list[Term] = []
    if no_sync:  # reduce-scattered, and freed, by the boundary's backward: never at the step
        grads.append(
            Term("unsharded fp32 gradients (no_sync)", 4 * p, "suite/engines.py, _fsdp_collectives.py:605-606")
        )
    gather = "_fsdp_collectives.py (foreach_all_gather, copy-out; the buffer freed at the next unit's)"
    units = [(u, x) for u, x in enumerate(blocks)]

    progress = _units_done(tr)

    def reducing(k: int) -> list[Term]:
        """Without no_sync each unit's unsharded gradients live from their birth to the unit's
        post-backward reduce-scatter (_fsdp_param_group.py post_backward)."""
        if no_sync:
            return []
        source = "_fsdp_param_group.py (post_backward), _fsdp_collectives.py:704-754"
        if not tr.unit_of:  # a trace without units (synthetic): the largest unit's, reducing every micro-step
            return (
                [Term("one unit's unsharded gradients, being reduced", 4 * largest, source)]
                if me.reduce_every_micro_step
                else []
            )
        live = progress[max(k, 0)][2]
        return [Term("unsharded gradients of the units not yet reduced", 4 * live, source)]

    def more(forward: float) -> list[tuple[float, list[Term]]]:
        # The forward's start: the root and the first block, each with its all-gather buffer.
        start = [Term("root and first block gathered, each with its all-gather buffer", 2 * w * (root + first), gather)]
        moments = [(0.0, grads + start)]
        if resharded:  # the root gathered again at the backward's start, with the forward's activations
            again = Term("root gathered again for the backward, with its all-gather buffer", 2 * w * root, gather)
            moments.append((forward, grads + [again]))
        return moments

    def engine(k: int) -> list[Term]:
        over, root_over, _ = progress[max(k, 0)]  # a unit is resharded when its backward is done
        root_left = 0 if root_over else root
        if resharded:
            two = sorted(x for u, x in units if u not in over)[-2:]
            source = "suite/engines.py (reshard_after_forward)"
            held = Term("root and about two blocks gathered whole", w * (root_left + sum(two)), source)
        else:
            left = root_left + sum(x for u, x in units if u not in over)
            held = Term("every unit gathered from forward to its backward", w * left, "suite/engines.py")
        return grads + reducing(k) + [held]

    at_peak(lay, tr, me.micro_batch, engine, more, held=not no_sync and bool(tr.unit_of))
    if built == "meta":  # built without storage, each shard made on its device (`BUILT`)
        lay.build.append(Term("fp32 shards made on the device", 4 * part, "memory.BUILT (meta)"))
    elif t.hardware.device == "cuda":  # built on the host, each unit moved to the device and cut there
        lay.host.append(Term("fp32 model as built on the host", 4 * p, "suite/engines.py (FSDP2.build)"))
        lay.build.append(Term("fp32 shards placed so far", 4 * part, "_fsdp_init.py:369-401"))
        lay.build.append(Term("the unit being cut, whole on the device", 4 * largest, "_fsdp_init.py:369-401"))
    else:  # a CPU worker's host is its device
        lay.build.append(Term("fp32 model as built on the host", 4 * p, "suite/engines.py (FSDP2.build)"))
    return lay


def _units_done(tr: Trace) -> list[tuple[frozenset[int], bool, int]]:
    """For k = 0 up to every gradient, after the first k: the blocks whose backward is done (every
    gradient of theirs exists), whether the root's is, and the elements of the gradients of the
    units not yet done. A trace without units (synthetic): none ever done."""
    if not tr.unit_of:
        return [(frozenset(), False, 0)] * (len(order(tr)) + 1)
    left = {u: tr.unit_of.count(u) for u in set(tr.unit_of)}
    born = dict.fromkeys(left, 0)
    over: set[int] = set()
    live = 0
    states = [(frozenset(), False, 0)]
    for i in order(tr):
        u = tr.unit_of[i]
        left[u] -= 1
        born[u] += tr.param_numels[i]
        live += tr.param_numels[i]
        if left[u] == 0:
            over.add(u)
            live -= born[u]
        states.append((frozenset(over - {-1}), -1 in over, live))
    return states


def loop_layout(t: Trial, tr: Trace, states: str, optimizer: str, torch_ddp: bool, built: str = "fp32") -> Layout:
    """A plain PyTorch loop's states (a published run outside DeepSpeed and FSDP; `suite.predict.gpu.
    Implementation`): under "amp" fp32 parameters, gradients and AdamW moments, and the 16-bit
    copies of the weights autocast makes at the forward and keeps to the backward
    (torch.autocast(cache_enabled=True): the casts of leaf tensors that require gradients are
    cached until the autocast region ends); under "pure" all of them in the 16-bit dtype (torch's
    AdamW keeps its moments in each parameter's dtype: `torch.zeros_like(p)`, torch/optim/adamw.py).
    torch's DistributedDataParallel keeps its gradient buckets beside the gradients
    (gradient_as_bucket_view=False, its default; torch/nn/parallel/distributed.py). A foreach AdamW
    makes one temporary of the states' size at the step (`torch._foreach_sqrt(exp_avg_sqs)`,
    torch/optim/adam.py `_multi_tensor_adam`); a per-tensor loop one of the largest tensor's.
    Gradients live in p.grad from the first micro-step's backward to the step: beside a later
    micro-step's activations, or born among the activations of the one backward (gas 1)."""
    w, p = bytes_per_element(t.precision), tr.n_params
    ws = w if states == "pure" else 4
    lay = Layout()
    lay.steady.append(Term("parameters", ws * p, f"{states}: the model's parameters"))
    grads = Term("gradients (p.grad, accumulated by autograd)", ws * p, "autograd AccumulateGrad")
    if t.gas_measured > 1:
        lay.steady.append(grads)
        lay.activations = tr.activation_bytes(t.methods.micro_batch)
    else:
        lay.activations = tr.activation_bytes_with_grads(t.methods.micro_batch)
    lay.steady.append(Term("AdamW moments", 2 * ws * p, "torch AdamW: exp_avg, exp_avg_sq like each parameter"))
    if states == "amp" and w == 2:
        lay.backward.append(Term("16-bit weight copies cached by autocast", w * p, "torch.autocast cache_enabled"))
    if torch_ddp and t.devices > 1:
        lay.steady.append(Term("DDP gradient buckets", ws * p, "torch DistributedDataParallel (reducer buckets)"))
    temp = {"foreach": ws * p, "loop": ws * max(tr.param_numels)}.get(optimizer, 0.0)
    if temp:
        lay.optimizer.append(Term(f"{optimizer} AdamW temporary", temp, "torch/optim/adam.py (exp_avg_sq's sqrt)"))
    lay.build.append(Term("parameters as built", _built_bytes(t, tr, built), "memory.BUILT, then cast"))
    return lay


def layout(t: Trial, tr: Trace, loop: tuple[str, str, bool] | None = None, built: str = "fp32") -> Layout:
    """The trial's layout: its engine's, or a plain loop's (`loop_layout`: states, optimizer, torch
    DDP); the model built as `built` says (`BUILT`)."""
    if built not in BUILT:
        raise ValueError(f"built {built!r}: allowed {', '.join(BUILT)}")
    if loop is not None:
        return loop_layout(t, tr, *loop, built)
    return fsdp2_layout(t, tr, built) if t.methods.engine == "fsdp2" else deepspeed_layout(t, tr, built)


BUILT = ("fp32", "16-bit", "meta")
"""How a run's code builds its model before the engine takes it: "fp32" on its device, cast to the
training dtype by the engine (suite/worker.py; FSDP2: on the host, each unit moved to the device);
"16-bit" cast on the host before it is moved to the device (Megatron-LM's `get_model`:
`model.half()` before `model.cuda()`, "to prevent OOM for model sizes that cannot fit in GPU
memory in full precision"); "meta" with no storage, each shard initialised on its device after
sharding (torchtitan; llm-foundry's `init_device: meta`; `low_cpu_fsdp`, which llama-recipes
gives for a 70B model that "would consume 2+TB cpu mem (70 * 4 * 8)" built in fp32 by 8 ranks)."""


def _built_bytes(t: Trial, tr: Trace, built: str = "fp32") -> float:
    """The model as built on the device (`BUILT`): suite/worker.py's in fp32 (the engine casts it
    to the training dtype afterwards)."""
    return {"fp32": 4.0, "16-bit": float(bytes_per_element(t.precision)), "meta": 0.0}[built] * tr.n_params
