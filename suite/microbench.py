"""The microbenchmarks a rank runs: the speed probe every run records (`speed_probe`, in
`suite.worker`), and the figures a calibration measures on this machine (`suite.calibrate`
starts one process per device, `python -m suite.microbench SPEC OUT`, each like a trial's rank:
the same thread counts and allocator settings, all at once, so that they share the machine as a
trial's ranks do). The calibration keeps each figure from its slowest rank:

    matmul         FLOP/s of torch.mm on a grid of shapes (M, N, K), per dtype
    attention      FLOP/s of scaled_dot_product_attention, forward and backward, causal, by
                   (sequence, head dim)
    memory         bytes/s of an elementwise add (two reads, one write, into a tensor that
                   exists), from sizes that stay in cache to sizes that stream from memory; on a
                   GPU also the copies between pinned host memory and the device (offload)
    operators      CPU: bytes/s of the operators whose pace is their own (softmax, GELU, norms,
                   ...), results allocated as in a trial, by size (`_op_calls`)
    first touch    CPU: seconds per byte a fresh allocation costs beyond its writing, by size
    op overhead    seconds per operator of a tiny module's forward and backward, over the
                   operators it dispatches: what an operator costs beyond its work
    collectives    gloo (CPU) or NCCL (GPU) all_reduce, all_gather, reduce_scatter at sizes from
                   4 KiB to 16 MiB (`suite.calibrate.fit_collective` fits them)
    adam           parameters per second of torch's AdamW (foreach; fused) and DeepSpeed's own
                   (FusedAdam; DeepSpeedCPUAdam on the host, which offload steps with)
    nvme           bytes/s DeepSpeed's async I/O writes and reads a file of pinned memory on the
                   NVMe drive (O_DIRECT), with the settings an NVMe trial's swap runs with
"""

from __future__ import annotations

import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

from suite.methods import torch_dtype
from suite.ops import preload_built_ops
from suite.predict.recorder import tensor_bytes

GRID = {"full": [16, 128, 1024, 4096], "quick": [32, 512]}
"""Matrix sides measured (M, N and K each); a 16-bit CPU grid stops at 1024 (no matrix unit:
a 4096-cube takes minutes)."""
ATTENTION = {"full": ([64, 256, 1024], [32, 64, 128]), "quick": ([64, 256], [32, 64])}
MEMORY_ELEMENTS = {"full": [2**14, 2**17, 2**20, 2**24], "quick": [2**16, 2**24]}
"""Elementwise sizes: from cache-resident to memory-bound (the last one is `memory_bps`)."""
OP_ELEMENTS = {"full": [2**16, 2**22], "quick": [2**22]}
"""Input sizes of `_op_curves`: cache-resident, and past the caches. Each call allocates its
results as the trial's operators do, so their first touch is in the pace measured."""
OP_ROW = 4096
"""Row length of `_op_curves`' inputs (a softmax or a norm runs along rows)."""
FIRST_TOUCH_BYTES = {"full": [2**16, 2**18, 2**20, 2**24, 2**26], "quick": [2**18, 2**24]}
"""Allocation sizes of `_first_touch`: either side of the workers' mmap threshold (128 KiB,
`suite.launch.worker_env`) up to memory-bound sizes."""
NVME_BYTES = {"full": 256 * 2**20, "quick": 32 * 2**20}
"""Bytes each rank writes to and reads from the NVMe drive: one swap file of a sub-group's size."""
COLLECTIVE_BYTES = {"full": [4096 * 4**i for i in range(7)], "quick": [4096, 262144, 4 * 2**20]}


def best_time(fn, sync, min_s: float = 0.05, reps: int = 3, calls: int = 0) -> float:
    """Seconds per call of a microbenchmark (calibration, speed probe): the best of `reps` rounds
    of enough calls to last `min_s` (or of `calls` calls: a collective needs the same count on
    every rank)."""
    t0 = time.perf_counter()
    fn()
    sync()
    one = time.perf_counter() - t0  # the first call warms up; a long one is its own sample
    best = math.inf if calls or one < min_s else one
    n = calls or max(1, int(min_s / max(one, 1e-9)))
    reps = reps if best == math.inf else reps - 1
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t0) / n)
    return best


PROBE = {"cpu": (512, "fp32"), "cuda": (4096, "bf16")}
"""The speed probe's matrix side and dtype per device kind."""


def speed_probe(dev, sync) -> float:
    """FLOP/s of one fixed matrix multiply (512-cube fp32 on a CPU, 4096-cube bf16 on a GPU):
    the machine's speed at the time. Every run records it (suite.worker) and so does every
    calibration (suite.calibrate), so a shared machine's drift between the two is seen,
    not taken for an error of the model: a shared machine's speed drifts by tens of percent
    over hours."""
    side, dtype = PROBE[dev.type]
    a, b = (torch.randn(side, side, device=dev, dtype=torch_dtype(dtype)) for _ in range(2))
    return 2 * side**3 / best_time(lambda: torch.mm(a, b), sync, min_s=0.1)


def _nvme(mode: str, folder: str, aio: dict, barrier) -> dict[str, float]:
    """Bytes/s of DeepSpeed's async I/O writing, then reading, one file of pinned host memory in
    `folder` (the drive's own pace: O_DIRECT, past the page cache), every rank at once."""
    from deepspeed.ops.op_builder import AsyncIOBuilder  # deferred: the op is built for NVMe trials only

    handle = AsyncIOBuilder().load(verbose=False).aio_handle(**aio)
    n = NVME_BYTES[mode]
    buffer = handle.new_cpu_locked_tensor(n, torch.empty(0, dtype=torch.uint8))
    path = os.path.join(folder, f"calibrate-rank{os.environ.get('RANK', '0')}.swp")
    try:
        barrier()
        write = best_time(lambda: handle.sync_pwrite(buffer, path), lambda: None, min_s=0.2)
        barrier()
        read = best_time(lambda: handle.sync_pread(buffer, path), lambda: None, min_s=0.2)
    finally:
        handle.free_cpu_locked_tensor(buffer)
        if os.path.exists(path):
            os.remove(path)
    return {"nvme_read_bps": n / read, "nvme_write_bps": n / write}


def _bench(mode: str, device: str, dtypes: list[str], world: int, tf32: bool = False, nvme: dict | None = None) -> dict:
    """The microbenchmarks of one rank; collective figures need every rank running them; the NVMe
    drive's where `nvme` names its folder and async I/O settings ({"dir", "aio"})."""
    cuda = device == "cuda"
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:  # as the worker sets them: fp32 matmuls run on tensor cores where the profile says tf32
        torch.cuda.set_device(dev)
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def barrier():
        if world > 1:
            dist.barrier()

    out: dict = {"matmul": {}, "attention": [], "collectives": {}, "adam": {}}
    barrier()
    out["probe_flops"] = speed_probe(dev, sync)
    for dtype in dtypes:
        rows = []
        sides = GRID[mode] if cuda or dtype == "fp32" else [x for x in GRID[mode] if x <= 1024]
        for m in sides:
            for n in sides:
                for k in sides:
                    a = torch.randn(m, k, device=dev, dtype=torch_dtype(dtype))
                    b = torch.randn(k, n, device=dev, dtype=torch_dtype(dtype))
                    barrier()
                    s = best_time(lambda a=a, b=b: torch.mm(a, b), sync)
                    rows.append([m, n, k, 2 * m * n * k / s])
        out["matmul"][dtype] = rows
    seqs, dims = ATTENTION[mode]
    attention_dtype = torch_dtype(dtypes[0])
    for s in seqs:
        for d in dims:
            shape = (1, 8, s, d)
            q, k, v = (torch.randn(shape, device=dev, dtype=attention_dtype, requires_grad=True) for _ in range(3))
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            g = torch.randn_like(o)
            barrier()
            fwd = best_time(
                lambda q=q, k=k, v=v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True), sync
            )
            barrier()
            bwd = best_time(
                lambda o=o, q=q, k=k, v=v, g=g: torch.autograd.grad(o, (q, k, v), g, retain_graph=True), sync
            )
            # A causal kernel does half the FLOPs counted for it (timing.py applies the same half).
            f = 0.5 * sdpa_flop_count(shape, shape, shape)
            bwd_f = 0.5 * sdpa_backward_flop_count(shape, shape, shape, shape)
            out["attention"].append([s, d, f / fwd, bwd_f / bwd])
    curve = []
    for size in MEMORY_ELEMENTS[mode]:
        x, y, z = (torch.randn(size, device=dev) for _ in range(3))
        barrier()
        curve.append([3 * 4 * size, 3 * 4 * size / best_time(lambda x=x, y=y, z=z: torch.add(x, y, out=z), sync)])
    out["memory_curve"], out["memory_bps"] = curve, curve[-1][1]
    out["op_overhead_s"] = _op_overhead(dev, sync)
    out["op_curves"] = {} if cuda else _op_curves(mode, dev, sync, barrier)
    out["first_touch"] = [] if cuda else _first_touch(mode, sync, barrier)
    if cuda:  # offload's copies: pinned host memory to the device and back
        host = torch.empty(size, pin_memory=True)
        barrier()
        down = best_time(lambda: x.copy_(host, non_blocking=True), sync)
        up = best_time(lambda: host.copy_(x, non_blocking=True), sync)
        out["host_bps"] = 4 * size / max(down, up)
    if world > 1:
        for kind in ("all_reduce", "all_gather", "reduce_scatter"):
            points = _collective(kind, mode, dev, world, sync)
            if points:
                out["collectives"][kind] = points
    out["adam"] = _adam(mode, dev, sync, barrier)
    if nvme:
        out.update(_nvme(mode, nvme["dir"], nvme["aio"], barrier))
    return out


def _op_calls(x, g) -> dict:
    """aten operators whose pace is not a plain copy's, with arguments on x (rows x OP_ROW)
    and a gradient g of its shape: name as the trace records it -> (operator, arguments)."""
    aten = torch.ops.aten
    rows, cols = x.shape
    w, bias = torch.ones(cols), torch.zeros(cols)
    _, mean, rstd = aten.native_layer_norm.default(x, [cols], w, bias, 1e-5)
    target = torch.randint(0, cols, (rows,))
    loss_grad, total = torch.tensor(1.0), torch.tensor(float(rows))
    return {
        "aten._log_softmax": (aten._log_softmax.default, (x, -1, False)),
        "aten._log_softmax_backward_data": (
            aten._log_softmax_backward_data.default,
            (g, aten._log_softmax.default(x, -1, False), -1, x.dtype),
        ),
        "aten._softmax": (aten._softmax.default, (x, -1, False)),
        "aten._softmax_backward_data": (
            aten._softmax_backward_data.default,
            (g, aten._softmax.default(x, -1, False), -1, x.dtype),
        ),
        "aten.nll_loss_backward": (aten.nll_loss_backward.default, (loss_grad, x, target, None, 1, -100, total)),
        "aten.gelu": (aten.gelu.default, (x,)),
        "aten.gelu_backward": (aten.gelu_backward.default, (g, x)),
        "aten.silu": (aten.silu.default, (x,)),
        "aten.silu_backward": (aten.silu_backward.default, (g, x)),
        "aten.native_layer_norm": (aten.native_layer_norm.default, (x, [cols], w, bias, 1e-5)),
        "aten.native_layer_norm_backward": (
            aten.native_layer_norm_backward.default,
            (g, x, [cols], mean, rstd, w, bias, [True, True, True]),
        ),
        "aten.exp": (aten.exp.default, (x,)),
        "aten.tanh": (aten.tanh.default, (x,)),
        "aten.pow": (aten.pow.Tensor_Scalar, (x, 2)),
        "aten.rsqrt": (aten.rsqrt.default, (x,)),
        "aten.mean": (aten.mean.dim, (x, [-1], True)),
        "aten.sum": (aten.sum.dim_IntList, (x, [-1], True)),
        "aten.mul": (aten.mul.Tensor, (x, g)),
        "aten.div": (aten.div.Tensor, (x, g)),
        "aten.cat": (aten.cat.default, ([x, g], -1)),
    }


def _op_curves(mode: str, dev, sync, barrier) -> dict[str, list[list[float]]]:
    """[bytes moved, bytes/s] of each operator of `_op_calls`, by size; bytes are counted as the
    trace counts them (`tensor_bytes` of every tensor argument and result)."""
    out: dict[str, list[list[float]]] = {}
    for n in OP_ELEMENTS[mode]:
        x = torch.randn(n // OP_ROW, OP_ROW, device=dev)
        g = torch.randn_like(x)
        for name, (op, args) in _op_calls(x, g).items():
            res = op(*args)
            tensors = [t for t in tree_flatten((args, res))[0] if isinstance(t, torch.Tensor)]
            moved = sum(tensor_bytes(t) for t in tensors)
            barrier()
            out.setdefault(name, []).append([moved, moved / best_time(lambda op=op, args=args: op(*args), sync)])
    return out


def _first_touch(mode: str, sync, barrier) -> list[list[float]]:
    """[bytes, seconds per byte]: a fresh tensor written once, less the same write into a
    tensor that exists: the page faults of memory the allocator takes from the kernel anew
    (every block from the mmap threshold up, in a worker) and gives back on free."""
    out = []
    for nbytes in FIRST_TOUCH_BYTES[mode]:
        n = nbytes // 4
        z = torch.empty(n)
        barrier()
        fresh = best_time(lambda n=n: torch.empty(n).fill_(1.0), sync)
        reuse = best_time(lambda z=z: z.fill_(1.0), sync)
        out.append([4 * n, max(0.0, fresh - reuse) / (4 * n)])
    return out


def _op_overhead(dev, sync) -> float:
    """Seconds per dispatched operator of a tiny module's forward and backward (work ~ 0)."""
    layers = [torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.GELU()) for _ in range(8)]
    net = torch.nn.Sequential(*layers).to(dev)
    x = torch.randn(2, 8, device=dev)

    def step():
        net(x).sum().backward()

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        step()
    return best_time(step, sync) / Count.n


def _collective(kind: str, mode: str, dev, world: int, sync) -> list[list[float]]:
    points = []
    for nbytes in COLLECTIVE_BYTES[mode]:
        n = nbytes // 4
        n -= n % world
        buf = torch.ones(n, device=dev)
        if kind == "all_reduce":
            fn = lambda buf=buf: dist.all_reduce(buf)  # noqa: E731
        elif kind == "all_gather":
            part = torch.ones(n // world, device=dev)
            fn = lambda buf=buf, part=part: dist.all_gather_into_tensor(buf, part)  # noqa: E731
        else:
            part = torch.ones(n // world, device=dev)
            fn = lambda buf=buf, part=part: dist.reduce_scatter_tensor(part, buf)  # noqa: E731
        try:
            dist.barrier()
            s = best_time(fn, sync, calls=max(2, min(50, 2**22 // nbytes)))
        except (RuntimeError, NotImplementedError, ValueError):  # not supported by this backend
            return []
        points.append([4 * n, s])
    return points


def _adam(mode: str, dev, sync, barrier) -> dict[str, float]:
    """Parameters per second of each AdamW the worker may step with."""
    n = 2**20 if mode == "quick" else 2**22
    params = [torch.nn.Parameter(torch.randn(n // 16, device=dev)) for _ in range(16)]
    for p in params:
        p.grad = torch.randn_like(p)
    from deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam  # deferred: seconds to import, not for the probe

    makers = {
        "torch": lambda ps: torch.optim.AdamW(ps, lr=1e-4, foreach=True),
        "deepspeed": lambda ps: FusedAdam(ps, lr=1e-4),  # every ZeRO stage's optimizer (suite.methods)
    }
    if dev.type == "cuda" or mode == "full":
        makers["torch_fused"] = lambda ps: torch.optim.AdamW(ps, lr=1e-4, fused=True)  # FSDP2's
    host = [torch.nn.Parameter(p.detach().cpu()) for p in params]  # offload's optimizer steps on the host
    for p, q in zip(params, host, strict=True):
        q.grad = p.grad.detach().cpu()
    makers["deepspeed_cpu"] = lambda ps: DeepSpeedCPUAdam(host, lr=1e-4)
    out = {}
    for name, make in makers.items():
        try:
            opt = make(params)
        except Exception as e:  # noqa: BLE001 - an op that cannot be built here is left out
            print(f"calibrate: {name} AdamW unavailable: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        barrier()
        out[name] = n / best_time(opt.step, sync, min_s=0.1)
    return out


def worker_main(spec_path: str, out_path: str) -> None:
    """One rank of a calibration's microbenchmarks (`suite.calibrate` starts each like a trial's rank)."""
    with open(spec_path) as f:
        spec = json.load(f)
    # DeepSpeed's Adams (and its async I/O), without the JIT lock a killed rank could leave behind
    preload_built_ops(nvme=bool(spec.get("nvme_dir")))
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    if world > 1:
        dist.init_process_group("nccl" if spec["device"] == "cuda" else "gloo")
    nvme = {"dir": spec["nvme_dir"], "aio": spec["aio"]} if spec.get("nvme_dir") else None
    res = _bench(spec["mode"], spec["device"], spec["dtypes"], world, spec.get("tf32", False), nvme)
    if world > 1:
        gathered = [None] * world
        dist.all_gather_object(gathered, res)
    else:
        gathered = [res]
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(gathered, f)
    os._exit(0)


if __name__ == "__main__":
    worker_main(sys.argv[1], sys.argv[2])
