"""The constants a prediction for one hardware profile uses, each with where it comes from.

A GPU profile's constants come from its datasheet (`conf/hardware/<gpu>.yaml`: peak FLOP/s, memory,
link and host bandwidths) and from the published defaults of the libraries the worker runs
(below); a machine that ran `suite-predict calibrate` uses what it measured instead. A CPU
worker has no datasheet: its constants are always measured (`suite.calibrate`), and
stored per machine under `results/calibration/<host>/<key>.json` (`calibration_key`).

GPU defaults and their sources:

    GEMM, attention,       by GPU architecture and size (`suite.predict.gpu`, each constant with
    launches, dispatch     its source): `gemm_best` is the MAMF fraction of the peak
    collective latency     NCCL's own model (src/graph/tuning.cc, ncclTunerConstantsDefaults,
                           as carried in torch/_inductor/comm_analysis.py): ring, Simple
                           protocol, 8.4 us base + 3.4 us (NVLink) / 5.7 us (PCIe) per step,
                           14 us per step between nodes
    CUDA context           0.47 GiB with lazy module loading, PyTorch's default since 1.13
                           (A100, torch 2.1: ml-engineering training/performance/README.md,
                           "Preloaded CUDA kernels memory usage"; 274 MiB in pytorch/pytorch#86509)
    cuBLAS workspaces      cuBLASLt 1 MiB, 4 MiB on Ampere with >= 24 GB, 32 MiB on Hopper;
                           cuBLAS 8.0 MiB (":4096:2:16:8"), 32 MiB on Hopper (":4096:8")
                           (aten/src/ATen/cuda/CUDABlas.cpp, CublasHandlePool.cpp; allocated
                           through the caching allocator, so in memory_allocated)
    NCCL communicator      1.45 GiB per GPU once a process group of several GPUs communicates
                           (ml-engineering training/performance/README.md, "torch.distributed
                           memory usage": 0.55 -> 2.00 GiB at the first barrier; not in
                           memory_reserved)
    allocator slack        reserved over allocated memory: 1.107, the median of the suite's own
                           GPU records (results/gpu-check/2026-12-04-h200*: 1.06-1.31 over 8
                           trials of Pythia-160M); the caching allocator rounds blocks above
                           10 MiB to 2 MiB (c10/cuda/CUDACachingAllocator.cpp)

A prediction gives memory as each figure is published: allocated (`torch.cuda.max_memory_allocated`:
tensors and cuBLAS workspaces), reserved (the allocator's: allocated x slack) and the device's
(nvidia-smi: reserved + CUDA context + NCCL), which is also what must fit.

A GPU profile's host (offload, the NVMe tier) is its `host:` block (conf/hardware, each figure
with its source): CPU Adam's pace over the node's cores, the NVMe drive's read and write
bandwidth; a calibration of that profile on its own node measures both instead (`suite.calibrate`).
"""

from __future__ import annotations

import itertools
import json
import math
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path

from suite import paths
from suite.config import Trial
from suite.detect import gpu_mem_gib
from suite.files import write_json
from suite.predict import gpu as gpu_model

GIB = 2**30
MIB = 2**20
GPU_OP_OVERHEAD_S = 10e-6
NCCL_BASE_LATENCY_S = 8.4e-6
NCCL_STEP_LATENCY_S = {"nvlink": 3.4e-6, "pcie": 5.7e-6, "shm": 5.7e-6, "net": 14e-6}  # shm: as pcie (assumed)
CUDA_CONTEXT_BYTES = int(0.47 * GIB)
NCCL_COMMUNICATOR_BYTES = int(1.45 * GIB)
RESERVED_RATIO = 1.107


@dataclass
class Machine:
    """What one hardware profile computes, moves and keeps, as a prediction needs it."""

    kind: str
    """cpu or cuda."""
    source: str
    """Datasheet, or the calibration (host, date) these constants come from."""
    ranks: int
    """Processes the constants were measured with (hardware.count)."""
    peak_flops: dict[str, float] = field(default_factory=dict)
    """GPU: dense peak FLOP/s per dtype (datasheet)."""
    gpu: str = ""
    """GPU: the datasheet name (`suite.predict.gpu.arch` picks its measured rates)."""
    gemm_best: float = 0.0
    """GPU: the largest fraction of the dense 16-bit peak its GEMMs reach (`suite.predict.gpu.GEMM_BEST`)."""
    gemm_best_by: dict[str, float] = field(default_factory=dict)
    """GPU: the same for tf32 and fp32 GEMMs, as fractions of their own peaks, where measured."""
    sustained: float = 1.0
    """GPU: the fraction of that (and of fused attention's rate) kept through a training run
    (`suite.predict.gpu.fitted_sustained`)."""
    matmul: dict[str, list[list[float]]] = field(default_factory=dict)
    """CPU: measured [M, N, K, FLOP/s] per dtype."""
    attention: list[list[float]] = field(default_factory=list)
    """CPU: measured [seq, head_dim, forward FLOP/s, backward FLOP/s] of scaled_dot_product_attention."""
    memory_bps: float = 0.0
    """Bytes per second an elementwise operator streams from memory."""
    memory_curve: list[list[float]] = field(default_factory=list)
    """Measured [bytes moved, bytes/s] of elementwise operators by size (cache effects); empty:
    `memory_bps` at every size."""
    op_curves: dict[str, list[list[float]]] = field(default_factory=dict)
    """CPU: measured [bytes moved, bytes/s] by size of the operators whose pace is their own
    (softmax, GELU, layer norm: exp, erf and reductions, not only reads and writes), keyed by
    aten name as the trace names them; every other operator streams at `memory_curve`."""
    first_touch: list[list[float]] = field(default_factory=list)
    """CPU: measured [bytes, seconds per byte] a fresh allocation of that size costs beyond its
    writing: glibc serves allocations from its mmap threshold up (128 KiB in a worker,
    `suite.launch.worker_env`) with fresh pages from the kernel, each of which faults on first
    touch, and returns them on free; empty: none."""
    op_overhead_s: float = GPU_OP_OVERHEAD_S
    """Seconds each operator costs beyond its work (dispatch, Python)."""
    collectives: dict[str, list[float]] = field(default_factory=dict)
    """[latency s, bus bytes/s] of all_reduce, all_gather and reduce_scatter among `ranks`."""
    link: str = ""
    adam_elements_per_s: dict[str, float] = field(default_factory=dict)
    """Optimizer step throughput: "torch" (torch AdamW, foreach), "deepspeed" (FusedAdam, or
    DeepSpeedCPUAdam on the host), "torch_fused" (torch AdamW fused=True)."""
    host_bps: float = 0.0
    """Device-host copy bandwidth (offload), bytes/s."""
    host_adam_elements_per_s: float = 0.0
    """GPU: the node's host stepping DeepSpeedCPUAdam with all its cores, parameters/s (offload):
    the profile's `host.adam_elements_per_s`, or a calibration's per-rank rate times its ranks."""
    nvme_read_bps: float = 0.0
    """The node's NVMe drive as DeepSpeed's async I/O reads it, bytes/s (the NVMe tier): the
    profile's `host.nvme_read_gbps`, or measured by `suite-predict calibrate`; 0: not known."""
    nvme_write_bps: float = 0.0
    """The same, writing."""
    runtime_bytes: dict[str, float] = field(default_factory=dict)
    """CPU: the worker's resident memory above its imported runtime with a model of almost no
    parameters, per engine ("zero0".."zero3", "fsdp2"): what a trial holds beyond its tensors."""
    data_margin_bytes: float = 0.0
    """CPU: how much more of the RLIMIT_DATA budget than resident memory a worker uses
    (thread stacks, allocator arenas): fit/oom is decided on the budget."""
    step_scale: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per engine ("zero0".."zero3", "fsdp2"; `engine_key`): measured time / predicted time of
    one reference trial's parts: "compute", ZeRO-0's micro-step (it multiplies a micro-step's
    compute and communication), "optimizer", the engine's step, and "sync", seconds per
    collective (`loop_sync`; "comm": recorded, not used, see `loop_scale`). What a real
    training loop costs beyond the microbenchmarks (autograd, the engine's hooks and
    bookkeeping; fresh memory's first touch is modelled, `first_touch`). The reference is a
    calibration model, never a scored one (`suite.calibrate.reference_trial`);
    calibrate measures zero0's compute and optimizer scales, which stand for an engine not
    measured; empty: 1.0 (the datasheet's constants)."""
    probe_flops: float = 0.0
    """The speed probe measured with these constants (`suite.metrics.speed_probe`, the
    slowest rank's); every run records its own, so drift between them shows; 0: not measured."""
    overhead: dict[str, list] = field(default_factory=dict)
    """GPU: fixed per-device memory beyond tensors: name -> [bytes, source, counted in memory_allocated]."""
    reserved_ratio: float = RESERVED_RATIO
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> Machine:
        retired = ("matmul_efficiency",)  # one flat GPU GEMM efficiency: now `gemm_best` and its curve
        return cls(**{k: v for k, v in d.items() if k not in retired})


def _gpu_overhead(t: Trial) -> dict[str, list]:
    hw = t.hardware
    hopper = any(k in hw.gpu for k in ("H100", "H200", "GH200"))
    mem_gib = gpu_mem_gib(hw) or hw.mem_gib  # the GPU's own, whatever cap a trial sets
    ampere_big = any(k in hw.gpu for k in ("A100", "A6000", "3090", "A40", "L40", "4090")) and mem_gib >= 24
    lt = 32 * MIB if hopper else 4 * MIB if ampere_big else MIB
    blas = 32 * MIB if hopper else 4 * MIB * 2 + 16 * 1024 * 8
    return {
        "CUDA context": [CUDA_CONTEXT_BYTES, "ml-engineering, A100 torch 2.1 lazy loading (0.47 GiB)", False],
        "cuBLAS workspaces": [lt + blas, "aten/src/ATen/cuda/CUDABlas.cpp, CublasHandlePool.cpp", True],
        "NCCL communicator": [
            NCCL_COMMUNICATOR_BYTES if t.devices > 1 else 0,
            "ml-engineering, torch.distributed memory usage (1.45 GiB at the first collective)",
            False,
        ],
    }


def datasheet(t: Trial) -> Machine:
    """A GPU profile's constants from its datasheet and the libraries' published defaults."""
    hw = t.hardware
    if hw.device != "cuda":
        raise ValueError(f"{hw.name} is not a GPU profile: calibrate it (suite-predict calibrate hardware={hw.name})")
    missing = [k for k in ("memory_gbps", "link_gbps", "host_gbps") if not getattr(hw, k)]
    if missing or not hw.peak_tflops:
        raise ValueError(f"{hw.name} lacks {', '.join(missing or ['peak_tflops'])} in its conf/hardware profile")
    link = "nvlink" if hw.link.startswith("nvlink") else "shm" if hw.link.endswith("-shm") else "pcie"
    latency = NCCL_BASE_LATENCY_S
    # A link through host memory (no peer-to-peer: "-shm") is given as the rate measured through
    # it; a direct link as its datasheet rate, of which NCCL's ring reaches LINK_EFFICIENCY.
    bus = hw.link_gbps * 1e9 * (1.0 if hw.link.endswith("-shm") else gpu_model.LINK_EFFICIENCY)
    colls = {name: [latency, bus] for name in ("all_reduce", "all_gather", "reduce_scatter")}
    peak = {k: v * 1e12 for k, v in hw.peak_tflops.items()}
    mem, mem_source = gpu_model.memory_best(hw.gpu)
    bandwidth = hw.memory_gbps * 1e9 * mem
    # FusedAdam over fp32 master, grad, exp_avg, exp_avg_sq: read 16 bytes, write 12 (multi_tensor_adam.cu).
    fused = bandwidth / 28
    best, best_source = gpu_model.gemm_best(hw.gpu)
    by = {d: gpu_model.gemm_best(hw.gpu, d)[0] for d in ("tf32", "fp32")}
    kept, kept_source = gpu_model.sustained(hw.gpu)
    return Machine(
        kind="cuda",
        source=f"{hw.datasheet}; {hw.bandwidth_source}; GEMM {best:.3f} of peak ({best_source}); "
        f"memory {mem:.2f} of its bandwidth ({mem_source}); sustained {kept:.2f} ({kept_source})",
        gpu=hw.gpu,
        gemm_best=best,
        gemm_best_by=by,
        sustained=kept,
        ranks=hw.count,
        peak_flops=peak,
        memory_bps=bandwidth,
        collectives=colls,
        link=link,
        adam_elements_per_s={"deepspeed": fused, "torch_fused": fused, "torch": fused},
        host_bps=hw.host_gbps * 1e9,
        host_adam_elements_per_s=host_adam(hw.host),
        nvme_read_bps=hw.host.nvme_read_gbps * 1e9,
        nvme_write_bps=hw.host.nvme_write_gbps * 1e9,
        overhead=_gpu_overhead(t),
    )


CPU_ADAM_BYTES = 28
"""Bytes DeepSpeedCPUAdam streams per parameter: it reads the fp32 parameter, gradient and two
moments and writes the parameter and moments back (csrc/adam/cpu_adam_impl.cpp)."""


def host_adam(host) -> float:
    """The node's CPU Adam in parameters/s: as its profile cites it, else the most its memory
    bandwidth can stream (`CPU_ADAM_BYTES` a parameter); 0 where neither is known."""
    return host.adam_elements_per_s or host.mem_gbps * 1e9 / CPU_ADAM_BYTES


def calibration_key(hw) -> str:
    """What a calibration is of: a GPU profile by name; CPU workers by their count only (a
    memory budget changes no constant: cpu-x2 and cpu-x2-1gb share one calibration)."""
    return f"cpu-x{hw.count}" if hw.device == "cpu" else hw.name


def calibration_path(key: str, host: str | None = None) -> Path:
    return paths.calibration_dir() / (host or socket.gethostname()) / f"{key}.json"


def load_calibration(key: str, host: str | None = None) -> Machine | None:
    path = calibration_path(key, host)
    if not path.exists():
        return None
    return Machine.from_json(json.loads(path.read_text()))


def save_calibration(m: Machine, key: str) -> Path:
    return write_json(calibration_path(key), m.to_json(), indent=1)


def engine_key(methods) -> str:
    """The engine a trial runs, as calibrations key what they measure per engine."""
    return "fsdp2" if methods.engine == "fsdp2" else f"zero{methods.zero_stage}"


def loop_scale(m: Machine, methods, part: str) -> float:
    """`m.step_scale` of this engine's `part` ("compute" or "optimizer"): zero0's where the
    engine's was not measured; 1.0 where nothing was. Communication takes the compute scale.

    A calibration also records each engine's own communication scale ("comm"), for diagnosis
    only: it varies several-fold between calibrations of one machine, and predicting with it
    scored worse than with the compute scale (`benchmarks/prediction_accuracy.py --rescore`;
    the figures: results/benchmarks/README.md)."""
    assert part in ("compute", "optimizer"), part
    for key in (engine_key(methods), "zero0"):
        if part in m.step_scale.get(key, {}):
            return m.step_scale[key][part]
    return 1.0


def loop_sync(m: Machine, methods) -> float:
    """Seconds each collective of this engine costs in a real loop beyond its microbenchmark and
    the compute scale (`m.step_scale[engine]["sync"]`, `suite.calibrate.step_scales`); 0 where
    this engine was not measured: another engine's collectives are not this one's. Without it
    every engine was predicted too fast (results/benchmarks/README.md, prediction accuracy)."""
    return m.step_scale.get(engine_key(methods), {}).get("sync", 0.0)


class NotCalibrated(LookupError):
    pass


def machine_for(t: Trial, host: str | None = None) -> Machine:
    """The constants for this trial's hardware: a calibration of it (this machine's, or `host`'s)
    if there is one, else the datasheet (GPU). A CPU profile without calibration raises."""
    key = calibration_key(t.hardware)
    cal = load_calibration(key, host)
    if cal is None and host is not None:
        cal = load_calibration(key)
    if cal is not None:
        if t.hardware.device == "cuda":
            sheet = datasheet(t)
            sheet.source = f"{sheet.source}; calibrated: {cal.source}"
            for k in (
                "matmul",
                "attention",
                "memory_bps",
                "op_overhead_s",
                "collectives",
                "adam_elements_per_s",
                "host_bps",
                "nvme_read_bps",
                "nvme_write_bps",
                "step_scale",
            ):
                if getattr(cal, k):
                    setattr(sheet, k, getattr(cal, k))
            if cal.adam_elements_per_s.get("deepspeed_cpu"):  # measured on each rank at once: the node's share
                sheet.host_adam_elements_per_s = cal.adam_elements_per_s["deepspeed_cpu"] * cal.ranks
            return sheet
        return cal
    if t.hardware.device == "cuda":
        return datasheet(t)
    raise NotCalibrated(
        f"{t.hardware.name} ({key}) has no calibration on this machine: "
        f"run `suite-predict calibrate hardware={t.hardware.name}`"
    )


def interpolate(points: list[list[float]], query: tuple[float, ...]) -> float:
    """Multilinear interpolation, in log2 of every coordinate and of the value, over measured
    points [x1, .., xk, value] that form a full grid; clamped to the grid's range."""
    k = len(query)
    axes = [sorted({p[i] for p in points}) for i in range(k)]
    table = {tuple(p[:k]): p[k] for p in points}
    cell, frac = [], []
    for i, v in enumerate(query):
        ax = axes[i]
        v = min(max(v, ax[0]), ax[-1])
        j = (
            max(0, min(len(ax) - 2, next((n for n, a in enumerate(ax) if a >= v), len(ax) - 1) - 1))
            if len(ax) > 1
            else 0
        )
        a, b = ax[j], ax[min(j + 1, len(ax) - 1)]
        cell.append((a, b))
        frac.append(0.0 if a == b else (math.log2(v) - math.log2(a)) / (math.log2(b) - math.log2(a)))
    total = 0.0
    for corner in itertools.product((0, 1), repeat=k):
        weight = math.prod(f if c else 1 - f for c, f in zip(corner, frac, strict=True))
        if weight:
            total += weight * math.log2(table[tuple(cell[i][c] for i, c in enumerate(corner))])
    return 2**total
