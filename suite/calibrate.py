"""Measure this machine's constants for one hardware profile (`suite-predict calibrate`), with
microbenchmarks and trials of calibration models only, never with the trials the predictor is
scored against. It runs processes and trials, so it lives beside the runner, not in the
predictor (`suite.predict` only reads what it stores).

The microbenchmarks run in as many processes as the profile has devices, each started like a
trial's rank (`suite.launch.worker_env`: the same thread counts and allocator settings), all at
once, so that they share the machine as a trial's ranks do; each figure is the slowest rank's:

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
                   4 KiB to 16 MiB, fitted as latency + bytes * steps / (N * bus_bps)
    adam           parameters per second of torch's AdamW (foreach; fused) and DeepSpeed's own
                   (FusedAdam; on a CPU, DeepSpeedCPUAdam, which offload steps with)

and, on a CPU worker, its runtime memory: real trials (`suite.launch`) of a model of almost no
parameters under each engine give the resident memory a trial holds beyond its tensors; one
bisection of the memory budget on the same trial gives how much more of the RLIMIT_DATA budget
than resident memory a worker uses. Last, real trials of a calibration model (never a
scored one) under each engine, timed and compared with what the microbenchmarks predict for
them, give `step_scale`: how much longer a real loop's compute, communication and optimizer
step take than their operators and collectives measured alone (`reference_trial`,
`step_scales`). `--quick` measures fewer points and one engine (for tests).

The result is stored as results/calibration/<host>/<hardware>.json (`suite.predict.machine`).
Run as `python -m suite.calibrate --worker SPEC OUT`, it is one rank of the microbenchmarks.
"""

from __future__ import annotations

import json
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from dataclasses import replace
from datetime import datetime, timezone

from suite.config.schema import ModelConfig, Trial
from suite.metrics import best_time, speed_probe
from suite.predict.machine import Machine

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
COLLECTIVE_BYTES = {"full": [4096 * 4**i for i in range(7)], "quick": [4096, 262144, 4 * 2**20]}


def _bench(mode: str, device: str, dtypes: list[str], world: int, tf32: bool = False) -> dict:
    """The microbenchmarks of one rank; collective figures need every rank running them."""
    import torch
    import torch.distributed as dist

    from suite.methods import DTYPES

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
                    a = torch.randn(m, k, device=dev, dtype=DTYPES[dtype])
                    b = torch.randn(k, n, device=dev, dtype=DTYPES[dtype])
                    barrier()
                    s = best_time(lambda a=a, b=b: torch.mm(a, b), sync)
                    rows.append([m, n, k, 2 * m * n * k / s])
        out["matmul"][dtype] = rows
    seqs, dims = ATTENTION[mode]
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    for s in seqs:
        for d in dims:
            shape = (1, 8, s, d)
            q, k, v = (torch.randn(shape, device=dev, dtype=DTYPES[dtypes[0]], requires_grad=True) for _ in range(3))
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
    return out


def _op_calls(x, g) -> dict:
    """aten operators whose pace is not a plain copy's, with arguments on x (rows x OP_ROW)
    and a gradient g of its shape: name as the trace records it -> (operator, arguments)."""
    import torch

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
    trace counts them (`suite.predict.trace._bytes` of every tensor argument and result)."""
    import torch
    from torch.utils._pytree import tree_flatten

    from suite.predict.recorder import tensor_bytes as _bytes

    out: dict[str, list[list[float]]] = {}
    for n in OP_ELEMENTS[mode]:
        x = torch.randn(n // OP_ROW, OP_ROW, device=dev)
        g = torch.randn_like(x)
        for name, (op, args) in _op_calls(x, g).items():
            res = op(*args)
            tensors = [t for t in tree_flatten((args, res))[0] if isinstance(t, torch.Tensor)]
            moved = sum(_bytes(t) for t in tensors)
            barrier()
            out.setdefault(name, []).append([moved, moved / best_time(lambda op=op, args=args: op(*args), sync)])
    return out


def _first_touch(mode: str, sync, barrier) -> list[list[float]]:
    """[bytes, seconds per byte]: a fresh tensor written once, less the same write into a
    tensor that exists: the page faults of memory the allocator takes from the kernel anew
    (every block from the mmap threshold up, in a worker) and gives back on free."""
    import torch

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
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

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
    import torch
    import torch.distributed as dist

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
    import torch

    n = 2**20 if mode == "quick" else 2**22
    params = [torch.nn.Parameter(torch.randn(n // 16, device=dev)) for _ in range(16)]
    for p in params:
        p.grad = torch.randn_like(p)
    from deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam

    makers = {
        "torch": lambda ps: torch.optim.AdamW(ps, lr=1e-4, foreach=True),
        "deepspeed": lambda ps: FusedAdam(ps, lr=1e-4),  # every ZeRO stage's optimizer (suite.methods)
    }
    if dev.type == "cuda" or mode == "full":
        makers["torch_fused"] = lambda ps: torch.optim.AdamW(ps, lr=1e-4, fused=True)  # FSDP2's
    if dev.type == "cpu":
        makers["deepspeed_cpu"] = lambda ps: DeepSpeedCPUAdam(ps, lr=1e-4)  # the optimizer of offload
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
    """One rank of the microbenchmarks (run by `calibrate`, like a trial's rank)."""
    import torch.distributed as dist

    from suite.ops import preload_built_ops

    preload_built_ops()  # DeepSpeed's Adams, without the JIT lock a killed rank could leave behind
    with open(spec_path) as f:
        spec = json.load(f)
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    if world > 1:
        dist.init_process_group("nccl" if spec["device"] == "cuda" else "gloo")
    res = _bench(spec["mode"], spec["device"], spec["dtypes"], world, spec.get("tf32", False))
    if world > 1:
        gathered = [None] * world
        dist.all_gather_object(gathered, res)
    else:
        gathered = [res]
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(gathered, f)
    os._exit(0)


def _curve(curves: list[list[list[float]]], pick) -> list[list[float]]:
    """One [size, value] curve from every rank's: at each size, `pick` (min or max) of the values."""
    return [[p[0], pick(c[i][1] for c in curves)] for i, p in enumerate(curves[0])]


def _slowest(results: list[dict]) -> dict:
    """Each figure from the slowest rank: throughputs at their minimum, times at their maximum."""
    first = results[0]
    out = {"matmul": {}, "attention": [], "collectives": {}, "adam": {}}
    for dtype, rows in first["matmul"].items():
        out["matmul"][dtype] = [
            row[:3] + [min(r["matmul"][dtype][i][3] for r in results)] for i, row in enumerate(rows)
        ]
    out["attention"] = [
        row[:2] + [min(r["attention"][i][2] for r in results), min(r["attention"][i][3] for r in results)]
        for i, row in enumerate(first["attention"])
    ]
    out["probe_flops"] = min(r["probe_flops"] for r in results)
    out["memory_bps"] = min(r["memory_bps"] for r in results)
    out["memory_curve"] = _curve([r["memory_curve"] for r in results], min)
    out["host_bps"] = min(r.get("host_bps", math.inf) for r in results)
    out["op_overhead_s"] = max(r["op_overhead_s"] for r in results)
    out["op_curves"] = {name: _curve([r["op_curves"][name] for r in results], min) for name in first["op_curves"]}
    out["first_touch"] = _curve([r["first_touch"] for r in results], max)
    for kind in first["collectives"]:
        out["collectives"][kind] = _curve([r["collectives"][kind] for r in results], max)
    for name in first["adam"]:
        out["adam"][name] = min(r["adam"].get(name, math.inf) for r in results)
    return out


def fit_collective(points: list[list[float]], world: int, kind: str) -> list[float]:
    """[latency, bus bytes/s] by least squares of t = latency + x / bus, x = bytes * steps / N."""
    from suite.predict.timing import COLLECTIVE_STEPS

    steps = COLLECTIVE_STEPS[kind](world)
    xs = [p[0] * steps / world for p in points]
    ts = [p[1] for p in points]
    n = len(xs)
    mx, mt = sum(xs) / n, sum(ts) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (t - mt) for x, t in zip(xs, ts, strict=True)) / sxx if sxx else 0.0
    latency = max(mt - slope * mx, min(ts) * 0.5)
    slope = slope if slope > 0 else max(ts) / max(xs)
    return [latency, 1.0 / slope]


def _run_ranks(t: Trial, mode: str, dtypes: list[str]) -> list[dict]:
    from suite.launch import free_port, small_thread_stacks, worker_env

    with tempfile.TemporaryDirectory(prefix="calibrate-") as d:
        spec, out = os.path.join(d, "spec.json"), os.path.join(d, "out.json")
        with open(spec, "w") as f:
            json.dump({"mode": mode, "device": t.hardware.device, "dtypes": dtypes, "tf32": t.hardware.tf32}, f)
        port = free_port()
        procs = []
        for rank in range(t.hardware.count):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "suite.calibrate", "--worker", spec, out],
                    env=worker_env(t, rank, port),
                    preexec_fn=small_thread_stacks if t.hardware.device == "cpu" else None,
                )
            )
        codes = [p.wait() for p in procs]
        if any(codes) or not os.path.exists(out):
            raise RuntimeError(f"calibration ranks failed (exit codes {codes})")
        with open(out) as f:
            return json.load(f)


def calibration_trial(t: Trial, engine: dict, name: str, shape: dict, batch: int, seq_len: int, **how) -> Trial:
    """A real trial of a calibration model (GPT-NeoX of `shape`; no scored model has such a
    shape) on `t`'s hardware under `engine`, fp32, no offload, recomputation or compile: `batch`
    samples of `seq_len` tokens per device, and `how`: micro_batch, the measure settings,
    mem_gib (the memory budget)."""
    config = {"max_position_embeddings": seq_len, **shape}
    recipe = replace(t.model.recipe, global_batch=batch * t.devices, seq_len=seq_len, image_size=0, precision="fp32")
    m = ModelConfig(name=name, task="causal-lm", model_type="gpt_neox", config=config, recipe=recipe)
    methods = replace(
        t.methods, offload="none", recompute="none", compile=False, precision="recipe", micro_batch=how["micro_batch"]
    )
    measure = replace(t.measure, timeout_s=300, **how["measure"])
    hardware = replace(t.hardware, mem_gib=how.get("mem_gib", 0.0))
    return replace(t, model=m, methods=replace(methods, **engine), measure=measure, hardware=hardware)


def minimal_trial(t: Trial, engine: dict, mem_gib: float = 0.0) -> Trial:
    """A trial of a model with almost no parameters: what the worker's runtime holds, with
    nearly no tensors."""
    tiny = {"hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1, "intermediate_size": 8}
    tiny.update(vocab_size=16, max_position_embeddings=16)
    measure = {"warmup_steps": 1, "timed_steps": 2, "max_micro_steps": 1}
    return calibration_trial(
        t, engine, "calibration-minimal", tiny, 1, 8, micro_batch=1, measure=measure, mem_gib=mem_gib
    )


def runtime_memory(t: Trial, mode: str, log) -> tuple[dict[str, float], float]:
    """(resident bytes of the runtime per engine, budget margin bytes), from real minimal trials."""
    from suite.launch import run_trial

    engines = engines_measured(t, mode)
    runtime: dict[str, float] = {}
    for key, engine in engines.items():
        o = run_trial(minimal_trial(t, engine))
        if o.outcome != "ok":
            raise RuntimeError(f"the minimal {key} trial ended {o.outcome}: {o.message}")
        runtime[key] = o.metrics["peak_mem_gib"] * 2**30
        log(f"calibrate: runtime memory under {key}: {runtime[key] / 2**20:.1f} MiB")
    if mode == "quick" or t.hardware.device != "cpu":
        return runtime, 0.0
    # The smallest budget the minimal ZeRO-0 trial fits in, to 4 MiB: bisection on real outcomes.
    lo, hi = runtime["zero0"], runtime["zero0"] + 256 * 2**20
    zero0 = engines["zero0"]
    if run_trial(minimal_trial(t, zero0, hi / 2**30)).outcome != "ok":
        raise RuntimeError("the minimal trial does not fit 256 MiB above its resident memory")
    while hi - lo > 4 * 2**20:
        mid = (lo + hi) / 2
        if run_trial(minimal_trial(t, zero0, mid / 2**30)).outcome == "ok":
            hi = mid
        else:
            lo = mid
    margin = hi - runtime["zero0"]
    log(f"calibrate: memory budget beyond resident memory: {margin / 2**20:.1f} MiB")
    return runtime, margin


REFERENCE_RUNS = {"full": 4, "quick": 2}
"""Rounds of the reference trials, each run in fresh workers: on a shared machine one run's
scales vary by a third within an hour, so each scale is a median over rounds (a quick
calibration, for tests, takes the mean of two)."""


def reference_trial(t: Trial, engine: dict) -> Trial:
    """The loop whose parts `step_scales` compares with their prediction: a GPT-NeoX of 3
    layers, 192 wide, 16k vocabulary, 128 tokens, two micro-steps a step."""
    shape = {"hidden_size": 192, "num_hidden_layers": 3, "num_attention_heads": 4, "intermediate_size": 768}
    shape["vocab_size"] = 16384
    measure = {"warmup_steps": 2, "timed_steps": 4, "max_micro_steps": 2, "repeats": 1}
    return calibration_trial(t, engine, "calibration-reference", shape, 4, 128, micro_batch=2, measure=measure)


def step_scales(t: Trial, m: Machine, engines: dict[str, dict], log, rounds_n: int) -> dict[str, dict[str, float]]:
    """Per engine (ZeRO-0 first), the reference trial measured against its prediction from `m`'s
    microbenchmarks alone (scales of 1). The engines run in turn, `rounds_n` rounds, each
    run in fresh workers; each scale is the median over rounds of its value in one round, so
    that a scale compares runs made minutes apart in the same state of the machine:

        compute    ZeRO-0 only: its micro-step, which holds no collective, over predicted compute
        comm       the boundary micro-step less compute at the round's ZeRO-0 scale, over the
                   communication predicted in it (ZeRO-0's all-reduce, ZeRO-2's reductions, ...);
                   recorded for diagnosis, not used (`machine.loop_scale` says why)
        sync       the boundary micro-step less its compute and communication, both at the
                   round's ZeRO-0 scale, per collective in it (at least 0): what each collective
                   of this engine costs in a real loop beyond its microbenchmark
                   (`machine.loop_sync`)
        optimizer  the engine's step over its prediction

    Compute is ZeRO-0's for every engine: an engine's compute scale measured on this small model
    carried its hooks and bookkeeping into the compute of larger models (larger step-time errors
    in benchmarks/prediction_accuracy.py); that cost comes with the engine's collectives, one per
    bucket or module, and so goes with them."""
    from suite.launch import run_trial
    from suite.predict import timing
    from suite.predict.trace import traced

    assert next(iter(engines)) == "zero0", "ZeRO-0 gives the compute scale the others use"
    bare = replace(m, step_scale={})
    refs, predicted = {}, {}  # predicted: (compute, communication, optimizer) seconds at scales of 1
    collectives: dict[str, float] = {}  # in the boundary micro-step
    for key, engine in engines.items():
        refs[key] = ref = reference_trial(t, engine)
        me = ref.methods
        p = timing.step_parts(ref, traced(ref.model, me.attention, me.recompute, ref.precision), bare)
        d = p.detail
        predicted[key] = (d["forward_s"] + d["backward_s"], d["micro_comm_s"] + d["boundary_comm_s"], p.t_optimizer)
        collectives[key] = d["collectives_micro"] + d["collectives_boundary"]
    rounds: list[dict[str, dict[str, float]]] = []
    boundaries: dict[str, list[float]] = {key: [] for key in refs}
    for _ in range(rounds_n):
        scales: dict[str, dict[str, float]] = {}
        for key, ref in refs.items():
            o = run_trial(ref)
            if o.outcome != "ok" or not o.metrics.get("micro_time_s"):
                raise RuntimeError(f"the {key} reference trial ended {o.outcome}: {o.message}")
            x, (compute, comm, opt) = o.metrics, predicted[key]
            boundaries[key].append(x["boundary_time_s"])
            scales[key] = {"optimizer": x["optimizer_time_s"] / opt}
            if key == "zero0":  # its micro-step holds no collective
                scales[key]["compute"] = max(x["micro_time_s"], 0.5 * compute) / compute
            if comm > 0:
                c0 = scales["zero0"]["compute"]
                scales[key]["comm"] = max(x["boundary_time_s"] - c0 * compute, 0.25 * comm) / comm
            if collectives[key]:
                beyond = x["boundary_time_s"] - scales["zero0"]["compute"] * (compute + comm)
                scales[key]["sync"] = max(0.0, beyond) / collectives[key]
        rounds.append(scales)
    out = {key: {k: statistics.median(r[key][k] for r in rounds) for k in rounds[0][key]} for key in refs}
    for key, (compute, comm, opt) in predicted.items():
        seen = ", ".join(f"{b * 1e3:.0f}" for b in boundaries[key])
        log(
            f"calibrate: {key} reference trial ({rounds_n} rounds; boundary micro-steps {seen} ms): "
            f"compute {compute * 1e3:.1f} ms predicted (x{out['zero0']['compute']:.2f}), communication "
            f"{comm * 1e3:.1f} ms (x{out[key].get('comm', 1.0):.2f}, not used; {collectives[key]:.0f} collectives, "
            f"{out[key].get('sync', 0.0) * 1e3:.2f} ms each beyond), optimizer {opt * 1e3:.1f} ms "
            f"(x{out[key]['optimizer']:.2f})"
        )
    return out


def engines_measured(t: Trial, mode: str) -> dict[str, dict]:
    """The engines a calibration measures its runtime memory and loop scales under."""
    engines = {f"zero{z}": {"zero_stage": z} for z in ([0] if mode == "quick" else [0, 1, 2, 3])}
    if mode == "full" and hasattr(t.methods, "engine"):  # the schema has a second engine
        engines["fsdp2"] = {"engine": "fsdp2", "zero_stage": 0}
    if hasattr(t.methods, "engine"):
        for e in engines.values():
            e.setdefault("engine", "deepspeed")
    return engines


def calibrate(t: Trial, quick: bool = False, log=print) -> Machine:
    """Measure the constants of `t.hardware` on this machine."""
    mode = "quick" if quick else "full"
    if t.hardware.device == "cuda":
        dtypes = ["bf16"] if quick else ["bf16", "fp16", "fp32"]
    else:
        dtypes = ["fp32"] if quick else ["fp32", "bf16"]
    log(f"calibrate: microbenchmarks in {t.hardware.count} process(es) ({mode})")
    res = _slowest(_run_ranks(t, mode, dtypes))
    colls = {k: fit_collective(v, t.hardware.count, k) for k, v in res["collectives"].items()}
    if colls and "reduce_scatter" not in colls:
        colls["reduce_scatter"] = colls["all_gather"] if "all_gather" in colls else colls["all_reduce"]
    if colls and "all_gather" not in colls:
        colls["all_gather"] = colls["all_reduce"]
    notes = [f"collectives measured: {', '.join(sorted(res['collectives']))}"] if colls else []
    runtime, margin = ({}, 0.0)
    if t.hardware.device == "cpu":
        runtime, margin = runtime_memory(t, mode, log)
    if quick:
        notes.append("quick calibration: few points, the runtime memory of ZeRO-0 only; for tests, not for figures")
    host = socket.gethostname()
    date = datetime.now(timezone.utc).isoformat(timespec="seconds")
    threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, len(os.sched_getaffinity(0)) // t.hardware.count))
    m = Machine(
        kind=t.hardware.device,
        source=f"calibrated on {host} at {date} ({mode}, {t.hardware.count} ranks, {threads} threads each)",
        ranks=t.hardware.count,
        matmul=res["matmul"],
        attention=res["attention"],
        memory_bps=res["memory_bps"],
        memory_curve=res["memory_curve"],
        op_overhead_s=res["op_overhead_s"],
        op_curves=res["op_curves"],
        first_touch=res["first_touch"],
        collectives=colls,
        adam_elements_per_s=res["adam"],
        host_bps=res["host_bps"] if math.isfinite(res["host_bps"]) else 0.0,
        runtime_bytes=runtime,
        data_margin_bytes=margin,
        probe_flops=res["probe_flops"],
        notes=notes,
    )
    if t.hardware.device == "cpu":  # a GPU's reference needs the datasheet's constants merged first
        m.step_scale = step_scales(t, m, engines_measured(t, mode), log, REFERENCE_RUNS[mode])
    return m


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker_main(sys.argv[2], sys.argv[3])
