"""Communication in a predicted step: collectives by the ring model, DeepSpeed's buckets, and what
each engine's communication costs beside its compute (`suite.predict.timing`'s docstring has the
model and its sources; `timing.step_parts` puts these together with the compute)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from suite import methods
from suite.config import Trial
from suite.predict import gpu
from suite.predict.machine import NCCL_STEP_LATENCY_S, Machine
from suite.predict.memory import REUSE_DISTANCE, bytes_per_element
from suite.predict.nvme import swapped
from suite.predict.trace import Trace

COLLECTIVE_STEPS = {
    "all_reduce": lambda n: 2 * (n - 1),
    "all_gather": lambda n: n - 1,
    "reduce_scatter": lambda n: n - 1,
}
# Operators DeepSpeed issues per gradient and per bucket while reducing (copy into the bucket,
# narrow and view; flatten, divide, copy back): dispatch costs like any operator's.
OPS_PER_GRADIENT = 3
OPS_PER_BUCKET = 4


@dataclass(frozen=True)
class Network:
    """Between nodes (conf/cluster): bandwidth per node and its description."""

    gbps: float = 200.0
    name: str = "InfiniBand HDR, one 200 Gb/s NIC per node"


DEFAULT_NETWORK = Network()


def first_touch_seconds(m: Machine, sizes: list[float]) -> float:
    """What the fresh allocations of `sizes` bytes cost beyond their writing: each at the
    measured cost per byte of the largest measured size not above it (`Machine.first_touch`;
    the cost steps up at the allocator's mmap threshold rather than growing smoothly)."""
    total = 0.0
    for s in sizes:
        below = [p for p in m.first_touch if p[0] <= s]
        if below:
            total += s * max(below, key=lambda p: p[0])[1]
    return total


def collective_seconds(
    m: Machine, kind: str, nbytes: float, n: int, nodes: int = 1, net: Network = DEFAULT_NETWORK
) -> float:
    """One collective of `nbytes` (the whole buffer) among `n` ranks over `nodes` nodes."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    latency, bus = m.collectives[kind]
    steps = COLLECTIVE_STEPS[kind](n)
    if nodes > 1:
        bus = min(bus, net.gbps * 1e9 / 8 * (gpu.NETWORK_EFFICIENCY if m.kind == "cuda" else 1.0))
        inter = (2 if kind == "all_reduce" else 1) * (nodes - 1)
        latency += inter * NCCL_STEP_LATENCY_S["net"]
    if m.kind == "cuda":
        latency += (steps - (2 if kind == "all_reduce" else 1) * (nodes - 1)) * NCCL_STEP_LATENCY_S[m.link or "pcie"]
    return latency + nbytes * steps / (n * bus)


def bucket_flushes(numels: list[int], bucket: int) -> list[int]:
    """Sizes (elements) of DeepSpeed's reductions of gradients arriving in `numels` order."""
    out, current = [], 0
    for x in numels:
        if bucket and current + x > bucket:
            if current:
                out.append(current)
            current = 0
        if bucket and x > bucket:
            out.append(x)
            continue
        current += x
    if current:
        out.append(current)
    return out


@dataclass
class Comm:
    """What one trial's collectives cost on a machine: the engines' communication is built from these."""

    t: Trial
    tr: Trace
    m: Machine
    nodes: int
    net: Network

    def coll(self, kind: str, sizes: list[float]) -> float:
        return sum(collective_seconds(self.m, kind, s, self.t.devices, self.nodes, self.net) for s in sizes)

    def copies(self, nbytes: float) -> float:  # a copy reads and writes every byte
        return 2 * nbytes / self.m.memory_bps if self.m.memory_bps else 0.0

    def fresh(self, sizes: list[float]) -> float:  # buffers the engine allocates anew (CPU: page faults)
        return first_touch_seconds(self.m, sizes)

    def overhead(self, ops: float) -> float:
        return ops * self.m.op_overhead_s


Traffic = tuple[float, float, float, float]
"""(seconds in every micro-step, seconds added at the boundary, collectives in every micro-step,
collectives added at the boundary), before the loop's scales."""


def ddp(c: Comm) -> Traffic:
    """ZeRO-0: flattened into one new buffer (up to allreduce_bucket_size elements), reduced, copied back."""
    w, p = bytes_per_element(c.t.precision), c.tr.n_params
    boundary = c.coll("all_reduce", [w * p]) + c.copies(2 * w * p) + c.fresh([w * p]) + c.overhead(OPS_PER_BUCKET)
    return 0.0, boundary, 0, 1


DDP_BUCKET_BYTES = 25 * 2**20
"""torch DistributedDataParallel's bucket_cap_mb default (25 MiB; torch/nn/parallel/distributed.py)."""


def torch_ddp(c: Comm, backward: float, grad_bytes: int) -> Traffic:
    """torch's DistributedDataParallel: gradients copied into 25 MiB buckets as the backward makes
    them, each bucket all-reduced while the backward goes on (its reducer's hooks), and copied
    back; on a GPU only the last bucket and what outlasts the backward wait (`hidden`)."""
    total = grad_bytes * c.tr.n_params
    full, rest = divmod(total, DDP_BUCKET_BYTES)
    sizes = [DDP_BUCKET_BYTES] * int(full) + ([rest] if rest else [])
    times = [c.coll("all_reduce", [x]) for x in sizes]
    comm = c.copies(2 * total) + c.overhead(OPS_PER_BUCKET * len(sizes))
    if c.m.kind == "cuda" and c.m.link != "shm":
        comm += hidden(times[-1], sum(times[:-1]), backward)
    else:  # through host memory (no peer-to-peer) NCCL's copies run on the CPU's proxy threads
        comm += sum(times)
    return 0.0, comm, 0, len(sizes)


def zero12(c: Comm, detail: dict[str, float]) -> Traffic:
    """ZeRO-1 reduces its buckets at the boundary, ZeRO-2 at every micro-step."""
    w, p, numels = bytes_per_element(c.t.precision), c.tr.n_params, c.tr.param_numels
    bucket = methods.bucket_sizes(c.t)["reduce_bucket_size"]
    flushes = bucket_flushes(list(reversed(numels)), bucket)  # backward produces gradients last layer first
    reduce = c.coll("all_reduce", [w * x for x in flushes]) + c.fresh([w * x for x in flushes])
    reduce += c.copies(2 * w * p) + c.overhead(OPS_PER_BUCKET * len(flushes) + OPS_PER_GRADIENT * len(numels))
    detail["reductions"] = len(flushes)
    return (0.0, reduce, 0, len(flushes)) if c.t.methods.zero_stage == 1 else (reduce, 0.0, len(flushes), 0)


def gathered(t: Trial, tr: Trace) -> tuple[list[int], float]:
    """ZeRO-3's gathered units (each module's parameters above the persistence threshold) and how
    many times a micro-step gathers them: once, and again in backward beyond the reuse distance."""
    threshold = methods.bucket_sizes(t).get("stage3_param_persistence_threshold", 0)
    units = [u for u in (sum(x for x in mod if x >= threshold) for mod in tr.module_params) if u]
    sharded = sum(units)
    return units, (1 + max(0.0, 1 - REUSE_DISTANCE / sharded) if sharded else 0)


def zero3(c: Comm, compute: float, detail: dict[str, float], host: float = 0.0) -> Traffic:
    """ZeRO-3: each module's parameters gathered in forward (and in backward what the reuse
    distance let go), gradients reduce-scattered in buckets at every micro-step. On a GPU the
    engine's hooks add `gpu.ZERO3_HOOK_S` of host time per collective to the host's dispatch
    (`host`), and the micro-step lasts the longer of the host's time and the GPU's.

    Under optimizer+params on a GPU each gathered partition first comes up the host link, which
    DeepSpeed prefetches with the gathers (hidden as they are); under the NVMe tier it is read
    from the drive first, unprefetched (`suite.methods.deepspeed_config` turns prefetch off
    there), so the drive's read and the link's copy add to the micro-step on any device."""
    w = bytes_per_element(c.t.precision)
    buckets = methods.bucket_sizes(c.t)
    threshold = buckets.get("stage3_param_persistence_threshold", 0)
    units, passes = gathered(c.t, c.tr)
    sharded = sum(units)
    # each gather fills a new full-size buffer
    gathers = passes * (c.coll("all_gather", [w * u for u in units]) + c.fresh([w * u for u in units]))
    order = [x for mod in reversed(c.tr.module_params) for x in reversed(mod) if x >= threshold]
    flushes = bucket_flushes(order, buckets.get("reduce_bucket_size", 0))
    scatter = c.coll("reduce_scatter", [w * x for x in flushes]) + c.fresh([w * x for x in flushes])
    detail["all_gathers"] = passes * len(units)
    comm, n = gathers + scatter, passes * len(units) + len(flushes)
    uplink = passes * w * sharded / c.t.devices / c.m.host_bps if c.m.host_bps else 0.0
    offloaded = c.m.kind == "cuda" and c.t.methods.offload == "optimizer+params"
    nvme = methods.on_nvme(c.t)
    if offloaded and not nvme:
        comm += uplink
    micro = (max(0.0, comm - compute) if c.m.kind == "cuda" else comm) + c.overhead(
        passes * len(units) + OPS_PER_BUCKET * len(flushes)
    )
    if nvme and c.t.methods.offload == "optimizer+params":
        _, par = swapped(c.t, c.tr)
        read = passes * w * par * c.t.hardware.count
        micro += read / c.m.nvme_read_bps if c.m.nvme_read_bps else math.nan
        micro += uplink if offloaded else 0.0
        detail["nvme_param_read_s"] = read / c.m.nvme_read_bps if c.m.nvme_read_bps else math.nan
    if c.m.kind == "cuda" and "sync" not in c.m.step_scale.get("zero3", {}):  # a datasheet GPU: no loop measured
        detail["zero3_host_s"] = host + n * gpu.ZERO3_HOOK_S
        micro += max(0.0, detail["zero3_host_s"] - compute - micro)
    return micro, 0.0, n, 0


def hidden(first: float, rest: float, compute: float) -> float:
    """What a GPU waits for of collectives overlapped with `compute`: the first (or last) one,
    which nothing runs beside, and whatever of the rest outlasts the compute."""
    return first + max(0.0, rest - compute)


def fsdp2(c: Comm, fwd: float, bwd: float, reduce_bytes: int) -> Traffic:
    """FSDP2: each unit gathered before its forward, and again before its backward when resharded
    after forward (the recomputed forward runs inside the backward's gather); gradients
    reduce-scattered in `reduce_bytes` per element (fp32 in the suite's engine) at the boundary,
    or at every micro-step with `methods.reduce_every_micro_step`.

    On a GPU the gathers are prefetched behind the forward's compute, the backward's gathers and
    reduce-scatters behind the backward's, as far as that compute lasts; the root's gather (the
    embeddings, before any block runs) and its reduce-scatter (after the last) are never hidden."""
    w, p, n, cuda = bytes_per_element(c.t.precision), c.tr.n_params, c.t.devices, c.m.kind == "cuda"
    root = p - sum(c.tr.block_numels)
    units = [root, *c.tr.block_numels]
    reshard = methods.reshards_after_forward(c.t.methods)
    every = c.t.methods.reduce_every_micro_step
    gather = [c.coll("all_gather", [w * u]) + c.fresh([w * u]) for u in units]
    # the gradients are copied into a new flat input, and each rank's shard is a new output
    scatter = [c.coll("reduce_scatter", [reduce_bytes * u]) + c.fresh([reduce_bytes * u * (1 + 1 / n)]) for u in units]
    back_gather = sum(gather) if reshard else 0.0
    if not cuda:
        micro = sum(gather) + back_gather + (sum(scatter) if every else 0.0)
        boundary = 0.0 if every else sum(scatter)
    else:
        forward = hidden(gather[0], sum(gather[1:]), fwd)
        without = hidden(gather[0] if reshard else 0.0, back_gather - (gather[0] if reshard else 0.0), bwd)
        with_scatter = hidden(scatter[0], back_gather + sum(scatter[1:]), bwd)
        micro = forward + (with_scatter if every else without)
        boundary = 0.0 if every else with_scatter - without
    ops = c.overhead(len(units) * OPS_PER_BUCKET)
    passes = 2 if reshard else 1
    if every:
        return micro + ops, boundary, (passes + 1) * len(units), 0
    return micro, boundary + ops, passes * len(units), len(units)
