"""Measure this machine's constants for one hardware profile (`suite-predict calibrate`), with
microbenchmarks and trials of calibration models only, never with the trials the predictor is
scored against. It runs processes and trials, so it lives beside the runner, not in the
predictor (`suite.predict` only reads what it stores).

The microbenchmarks (`suite.microbench`) run in as many processes as the profile has devices,
each started like a trial's rank (`suite.launch.worker_env`: the same thread counts and
allocator settings), all at once, so that they share the machine as a trial's ranks do; each
figure is the slowest rank's (`_slowest`), collectives fitted as latency + bytes * steps /
(N * bus_bps) (`fit_collective`).

Then, on a CPU worker, its runtime memory: real trials (`suite.launch`) of a model of almost no
parameters under each engine give the resident memory a trial holds beyond its tensors; one
bisection of the memory budget on the same trial gives how much more of the RLIMIT_DATA budget
than resident memory a worker uses. Last, real trials of a calibration model (never a
scored one) under each engine, timed and compared with what the microbenchmarks predict for
them, give `step_scale`: how much longer a real loop's compute, communication and optimizer
step take than their operators and collectives measured alone (`reference_trial`,
`step_scales`). `--quick` measures fewer points and one engine (for tests).

The result is stored as results/calibration/<host>/<hardware>.json (`suite.predict.machine`).
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
from suite.launch import free_port, run_trial, worker_env
from suite.methods import aio_config
from suite.ops import aio_problem
from suite.predict import kernels_of, timing
from suite.predict.comm import COLLECTIVE_STEPS
from suite.predict.machine import Machine
from suite.predict.trace import traced
from suite.warm import small_thread_stacks


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
    for key in ("nvme_read_bps", "nvme_write_bps"):  # every rank on the one drive at once: the node's
        out[key] = min(r.get(key, 0.0) for r in results) * len(results)
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


def _run_ranks(t: Trial, mode: str, dtypes: list[str], nvme_dir: str = "") -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="calibrate-") as d:
        spec, out = os.path.join(d, "spec.json"), os.path.join(d, "out.json")
        with open(spec, "w") as f:
            aio = aio_config(t) if nvme_dir else {}
            json.dump(
                {
                    "mode": mode,
                    "device": t.hardware.device,
                    "dtypes": dtypes,
                    "tf32": t.hardware.tf32,
                    "nvme_dir": nvme_dir,
                    "aio": aio,
                },
                f,
            )
        port = free_port()
        procs = []
        for rank in range(t.hardware.count):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "suite.microbench", spec, out],
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
    engines = engines_measured(mode)
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
    assert next(iter(engines)) == "zero0", "ZeRO-0 gives the compute scale the others use"
    bare = replace(m, step_scale={})
    refs, predicted = {}, {}  # predicted: (compute, communication, optimizer) seconds at scales of 1
    collectives: dict[str, float] = {}  # in the boundary micro-step
    for key, engine in engines.items():
        refs[key] = ref = reference_trial(t, engine)
        me = ref.methods
        p = timing.step_parts(
            ref, traced(ref.model, me.attention, me.recompute, ref.precision, device=kernels_of(ref)), bare
        )
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


def engines_measured(mode: str) -> dict[str, dict]:
    """The engines a calibration measures its runtime memory and loop scales under."""
    zero = [0] if mode == "quick" else [0, 1, 2, 3]
    engines = {f"zero{z}": {"engine": "deepspeed", "zero_stage": z, "reshard_after_forward": None} for z in zero}
    if mode == "full":
        # FSDP2's default mode written out, as `Trial.from_json` resolves it for the worker: the
        # prediction `step_scales` compares the run with is of the mode that runs (full_shard).
        engines["fsdp2"] = {"engine": "fsdp2", "zero_stage": 0, "reshard_after_forward": True}
    return engines


def calibrate(t: Trial, quick: bool = False, log=print, nvme_dir: str = "") -> Machine:
    """Measure the constants of `t.hardware` on this machine; the NVMe drive's through DeepSpeed's
    async I/O (the settings an NVMe trial runs with, `suite.methods.aio_config`) in `nvme_dir`,
    where one is given and this machine has the op (`suite.ops.aio_problem`)."""
    if nvme_dir and aio_problem():
        log(f"calibrate: the NVMe drive is not measured: {aio_problem()}")
        nvme_dir = ""
    mode = "quick" if quick else "full"
    if t.hardware.device == "cuda":
        dtypes = ["bf16"] if quick else ["bf16", "fp16", "fp32"]
    else:
        dtypes = ["fp32"] if quick else ["fp32", "bf16"]
    log(f"calibrate: microbenchmarks in {t.hardware.count} process(es) ({mode})")
    os.makedirs(nvme_dir, exist_ok=True) if nvme_dir else None
    res = _slowest(_run_ranks(t, mode, dtypes, nvme_dir))
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
        nvme_read_bps=res["nvme_read_bps"],
        nvme_write_bps=res["nvme_write_bps"],
        runtime_bytes=runtime,
        data_margin_bytes=margin,
        probe_flops=res["probe_flops"],
        notes=notes,
    )
    if t.hardware.device == "cpu":  # a GPU's reference needs the datasheet's constants merged first
        m.step_scale = step_scales(t, m, engines_measured(mode), log, REFERENCE_RUNS[mode])
    return m
