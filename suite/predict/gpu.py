"""What a GPU achieves, as opposed to its datasheet peak: GEMMs by size, fused attention by
sequence, kernel launches and framework dispatch, and networks between nodes. Each constant has
its source on its line; `benchmarks/published/gpu-constants.yaml` holds the readings in full.
None is fitted to the published training runs the predictor is scored on
(`suite-predict published-accuracy`).

A GEMM of F FLOPs moving B bytes takes

    t = max(F / (best * peak), B / memory_bps) + GEMM_FIXED_S

`best` is the largest fraction of the dense peak a brute-force shape search reaches on that GPU
(MAMF); GEMM_FIXED_S the time a small GEMM takes beyond its work, read from XLA's table of cuBLAS
matmul rates on H100 (sm_90), where it explains the fall-off with size within 10%.

Fused attention (SDPA's flash backend, flash-attn 2, FlashAttention v1, the Triton kernel)
runs at its measured forward+backward rate by sequence and head dimension, as a fraction of the
peak (the FlashAttention-2 paper's figures, in causal-halved FLOPs as `suite.models.flops` counts them).

`Implementation` is how a training run's code runs those kernels: the suite's own trial
(Hugging Face transformers, eager or compiled) or a published run's (fused norms, activations
and loss, its attention kernel, how it reduces gradients).
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field

from suite import paths

# Best GEMM fraction of the dense peak of each dtype class ("16": fp16/bf16 with fp32 accumulate,
# "tf32", "fp32": no tensor cores), per GPU (the first key found in the datasheet name, upper-cased).
# "MAMF": stas00/ml-engineering compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS
# comparison table" (brute-force shape search); "torch-perf-db": the crowd-sourced torch.mm table of
# square sizes, best of the sizes (benchmarks/published/gpu-constants.yaml, dense_gemm). A GeForce
# card boosts above its rated clock, so its best exceeds 1.
GEMM_BEST: dict[str, dict[str, tuple[float, str]]] = {
    "GH200": {"16": (0.838, "GH200 828.6 of 989 TFLOPS (MAMF)")},
    "H100": {
        "16": (0.803, "H100 SXM 794.5 of 989 TFLOPS (MAMF)"),
        "tf32": (0.812, "H100 402.2 of 495 (torch-perf-db)"),
    },
    "H200": {"16": (0.803, "H100 SXM's (MAMF: H200 the same)")},
    "A100-PCIE": {
        "16": (0.811, "A100 PCIe 252.9 of 312 TFLOPS (MAMF)"),
        "tf32": (0.694, "A100-PCIE-40GB 108.3 of 156 (torch-perf-db)"),
        "fp32": (0.901, "A100-PCIE-40GB 17.6 of 19.5 (torch-perf-db)"),
    },
    "A100 80GB PCIE": {"16": (0.811, "A100 PCIe 252.9 of 312 TFLOPS (MAMF)")},
    "A100": {
        "16": (0.869, "A100 SXM 271.2 of 312 TFLOPS (MAMF)"),
        "fp32": (0.984, "A100 SXM4 80GB 19.2 of 19.5 (torch-perf-db)"),
    },
    "RTX 3090": {
        "16": (1.077, "RTX 3090 76.5 of 71 TFLOPS, 3 cards (torch-perf-db)"),
        "fp32": (0.694, "24.7 of 35.6 (torch-perf-db)"),
    },
    "RTX 4090": {
        "16": (1.011, "RTX 4090 167 of 165.2 TFLOPS, 6 cards (torch-perf-db)"),
        "tf32": (1.037, "85.65 of 82.6 (torch-perf-db)"),
        "fp32": (0.647, "53.4 of 82.6 (torch-perf-db, by size)"),
    },
    "RTX A6000": {
        "16": (0.797, "RTX A6000 123.3 of 154.8 TFLOPS (torch-perf-db)"),
        "fp32": (0.618, "23.9 of 38.7 (torch-perf-db)"),
    },
    "L40S": {
        "16": (0.743, "L40S 269.2 of 362.1 TFLOPS (torch-perf-db)"),
        "fp32": (0.512, "46.9 of 91.6 (torch-perf-db)"),
    },
    "V100": {
        "16": (0.759, "V100-SXM2-16GB fp16 94.8 of 125 TFLOPS (torch-perf-db)"),
        "fp32": (0.896, "14.1 of 15.7 (torch-perf-db)"),
    },
}
GEMM_BEST_ASSUMED = (0.80, "no GEMM reading for this GPU: assumed as the measured GPUs' (0.74-1.08)")
MEMORY_BEST = {
    "V100": (0.851, "copy 766 of 900 GB/s (chsasank device-benchmarks, V100 32GB)"),
    "A100": (0.731, "copy 1490 of 2039 GB/s (chsasank device-benchmarks, A100 80GB)"),
}
MEMORY_BEST_ASSUMED = (
    0.79,
    "no copy-bandwidth reading for this GPU: the two measured (V100 0.85, A100 0.73), averaged",
)
"""The fraction of its datasheet memory bandwidth a GPU's memory-bound kernels reach (a copy's)."""
MISALIGNED_RATE = 0.5
"""The rate of a GEMM with an odd dimension (a row of 16-bit elements then lies off 4-byte
boundaries: cuBLAS's tensor-op kernels read aligned vectors; NVIDIA cuBLAS docs, "Tensor Core
Usage"), as a fraction of an aligned one's: derived from a published pair,
the same GPT-2 124M on one A100 with the vocabulary 50,257 and padded to 50,304 (rasbt
LLMs-from-scratch ch05/10, torch.compile rows: 112,046 and 127,345 tokens/s; the output layer's
three GEMMs, 31% of the FLOPs, ran at 0.52 of their aligned rate); the PyTorch blog's nanoGPT
pair (108,743 and 141,241 on 8x A100) implies 0.35-0.42. Declared as derived: those two groups'
rows are in-sample for it. An even dimension that is not a multiple of 8 (InternLM-7B's MLP of
10,922) shows no such loss in its published run (InternEvo, 8x A100), so only odd ones pay it."""
GEMM_FIXED_S = 6e-6
"""Seconds a GEMM takes beyond its work: XLA's cuBLAS table for sm_90 (xla/service/gpu/model/
matmul_interpolator_data.h) gives 2048^3 bf16 at 632 TFLOP/s (27.2 us, 21.6 us of work at MAMF)
and 256x2048x256 at 41.8 TFLOP/s (6.4 us for 0.34 us of work): 5.6-6.1 us; assumed the same on
other GPUs."""

# FlashAttention-2 paper, forward+backward TFLOP/s by sequence (512..16384) at hidden 2048, bf16;
# read from the bar labels of assets/flash2_{a100,h100}_fwd_bwd_benchmark.png (FLOPs halved
# under the causal mask). Keyed kernel -> GPU -> (causal, head_dim) -> TFLOP/s by ATTENTION_SEQ.
ATTENTION_SEQ = (512, 1024, 2048, 4096, 8192, 16384)
ATTENTION_TFLOPS = {
    "flash2": {
        "a100": {
            (False, 64): (132, 153, 162, 171, 175, 176),
            (False, 128): (173, 173, 187, 196, 201, 203),  # 512: label hidden, 1024's taken
            (True, 64): (88, 119, 140, 156, 165, 171),
            (True, 128): (99, 133, 155, 173, 182, 189),
        },
        "h100": {
            (False, 64): (215, 254, 274, 288, 294, 296),
            (False, 128): (248, 294, 320, 326, 335, 338),
            (True, 64): (141, 192, 232, 257, 273, 284),
            (True, 128): (163, 221, 265, 294, 308, 328),
        },
    },
    "flash1": {
        "a100": {
            (False, 64): (91, 92, 104, 108, 110, 110),
            (False, 128): (76, 72, 76, 80, 82, 83),
            (True, 64): (58, 70, 77, 87, 92, 97),
            (True, 128): (55, 62, 69, 76, 80, 83),
        },
        "h100": {
            (False, 64): (157, 159, 161, 161, 166, 168),
            (False, 128): (127, 127, 128, 131, 137, 139),
            (True, 64): (104, 123, 136, 138, 149, 156),
            (True, 128): (98, 109, 108, 126, 135, 137),
        },
    },
    "triton": {  # measured on A100 only: other GPUs take A100's fraction of the peak
        "a100": {
            (False, 64): (90, 102, 98, 98, 100, 100),
            (False, 128): (78, 85, 90, 93, 95, 95),
            (True, 64): (59, 75, 79, 76, 79, 80),
            (True, 128): (50, 61, 68, 74, 78, 80),
        },
    },
    "cutlass": {  # xformers' memory-efficient kernel, SDPA's backend where flash cannot run (V100)
        "a100": {
            (False, 64): (68, 73, 76, 77, 75, 75),
            (False, 128): (83, 91, 95, 96, 97, 98),
            (True, 64): (51, 60, 66, 68, 69, 67),
            (True, 128): (58, 72, 82, 87, 91, 92),
        },
    },
}
ATTENTION_PEAK_TFLOPS = {"a100": 312, "h100": 989}

LAUNCH_GAP_S = 1.0e-6
"""GPU idle between two dependent kernels on one stream: 3.8 us per launch of a 2.9 us kernel on
V100 (NVIDIA blog "Getting Started with CUDA Graphs", 2019); H100 about 2.1 us per dependent
launch (Hazy Research, "Look Ma, No Bubbles!", 2025) of which the kernel's own ramp is part."""
EAGER_DISPATCH_S = 4e-6
"""Host time of one eager PyTorch operator on CUDA: "about 4 us per op" (pytorch/pytorch#82793,
A100); 2 us without autograd, 6.8 us with (pytorch/pytorch#41383). The host runs ahead of the GPU,
so a step costs the larger of the GPU's kernels and the host's dispatch."""
ZERO3_HOOK_S = 1.83e-3
"""Host seconds each of DeepSpeed ZeRO-3's per-micro-step collectives (a module's parameter gather,
a gradient bucket's reduce-scatter) adds on a GPU: the engine's hooks (fetch, release, prefetch
bookkeeping) run on the host, whose fetch also blocks on events once two are in flight
(partitioned_param_coordinator.py, `__max_ongoing_fetch_events`). A ZeRO-3 micro-step lasts the
longer of the host's time (its operators' dispatch and these) and the GPU's. Measured, not sourced:
Pythia-160M on one H200 (results/gpu-check/2026-12-04-h200, -rerun; benchmarks/zero3_hooks.py),
six ZeRO-3 micro-steps of 0.156-0.277 s (median 0.190) at micro-batches 1, 4 and 16 of 2048 tokens,
with ZeRO-0's at 0.031, 0.033 and 0.103 s: the same time whatever the compute, so the host's, less
its predicted dispatch (0.007 s), over the 100 collectives."""
LINK_EFFICIENCY = 0.8
"""Fraction of the datasheet link bandwidth NCCL's ring reaches within a node: all-reduce bus
bandwidth 234.9 of 300 GB/s on A100 NVLink 3, ring 367 of 450 GB/s on H200 NVLink 4
(ml-engineering network/README.md, nccl-tests tables)."""
NETWORK_EFFICIENCY = 0.8
"""Fraction of a node's advertised network bandwidth a collective reaches (ml-engineering
network/README.md: about 80% at best, e.g. 320 of 400 Gbps)."""


def fitted_sustained() -> dict[str, tuple[float, str]]:
    """Fraction of its microbenchmarked rate a compute-bound kernel (GEMM, fused attention) keeps
    through a training run (clocks under sustained power, real data), per architecture. No source
    measures it alone: it is fitted to published runs by `suite-predict published-accuracy
    --publish`, which writes it with the error it was scored at (results/accuracy/cuda-published.json,
    `sustained_fitted`: each run of a group is predicted with the fraction fitted on the other groups'
    runs; the shipped fraction is the one fitted on all of them)."""
    return _fitted(str(paths.accuracy_dir() / "cuda-published.json"))


@functools.lru_cache(maxsize=4)
def _fitted(path: str) -> dict[str, tuple[float, str]]:
    try:
        with open(path) as f:
            d = json.load(f)
    except (OSError, ValueError):
        return {}
    folds = d.get("sustained_fitted") or {}
    every = folds.get("(all groups)") or {}
    out = {}
    for key, value in every.items():
        left = [f[key] for g, f in folds.items() if g != "(all groups)" and key in f]
        spread = f"; {min(left):.3f}-{max(left):.3f} leaving one group out" if left else ""
        out[key] = (value, f"fitted to published runs ({d.get('date', 'undated')}){spread}")
    return out


SUSTAINED_LIKE = {
    "ampere-pcie": "ampere",
    "other": "ampere",
    "volta": "ampere",
    "consumer": "ampere",
    "gh200": "hopper",
}
"""Architectures with no published runs take the fraction of the closest one that has some."""


def sustained(gpu: str) -> tuple[float, str]:
    key, fitted = arch(gpu), fitted_sustained()
    if key in fitted:
        return fitted[key]
    like = SUSTAINED_LIKE.get(key, "")
    if like in fitted:
        value, source = fitted[like]
        return value, f"{like}'s, assumed: no published runs of this GPU ({source})"
    return 1.0, "none fitted"


ARCHITECTURES = ("ampere", "ampere-pcie", "hopper", "gh200", "consumer", "volta", "other")
"""The keys `arch` gives (a sustained fraction is fitted per key)."""


def arch(gpu: str) -> str:
    """The architecture key of a datasheet GPU name (conf/hardware `gpu`)."""
    g = gpu.upper()
    if "GH200" in g:
        return "gh200"
    if any(k in g for k in ("H100", "H200")):
        return "hopper"
    if "A100" in g:
        return "ampere-pcie" if "PCIE" in g else "ampere"
    if "V100" in g:
        return "volta"
    if any(k in g for k in ("GEFORCE", "RTX", "L40", "A40", "A10")):
        return "consumer"  # GeForce and workstation cards (Ampere GA10x, Ada): boost clocks, board power limits
    return "other"


def _reading(table: dict, gpu: str):
    g = gpu.upper()
    return next((v for k, v in table.items() if k in g), None)


def gemm_best(gpu: str, dtype: str = "bf16") -> tuple[float, str]:
    """The best fraction of `dtype`'s dense peak a GEMM reaches on this GPU (`GEMM_BEST`)."""
    by = _reading(GEMM_BEST, gpu) or {}
    cls = dtype if dtype in ("tf32", "fp32") else "16"
    return by.get(cls) or by.get("16") or GEMM_BEST_ASSUMED


def memory_best(gpu: str) -> tuple[float, str]:
    """The fraction of the datasheet bandwidth this GPU's memory-bound kernels reach (`MEMORY_BEST`)."""
    return _reading(MEMORY_BEST, gpu) or MEMORY_BEST_ASSUMED


def aligned(dims: tuple[int, ...], dtype: str) -> bool:
    """Whether a GEMM of (batch, rows, cols, inner) has no odd dimension (`MISALIGNED_RATE`); fp32
    elements are 4-byte aligned whatever the count."""
    return dtype in ("fp32", "tf32") or all(int(round(x)) % 2 == 0 for x in dims[1:])


def _attention_table(kernel: str, gpu: str) -> tuple[dict, float, str]:
    """The measured table closest to `gpu` for `kernel`, its GPU's peak, and what was assumed."""
    tables = ATTENTION_TFLOPS[kernel]
    family = "h100" if arch(gpu) in ("hopper", "gh200") else "a100"
    if family in tables:
        return tables[family], ATTENTION_PEAK_TFLOPS[family], ""
    return tables["a100"], ATTENTION_PEAK_TFLOPS["a100"], f"{kernel} on {gpu}: A100's fraction of the peak"


def attention_fraction(kernel: str, gpu: str, seq: int, head_dim: int, causal: bool) -> float:
    """Forward+backward fraction of the dense peak a fused attention kernel reaches, interpolated
    in log2(seq) and head dimension, clamped to the measured range."""
    table, peak, _ = _attention_table(kernel, gpu)
    s = min(max(seq, ATTENTION_SEQ[0]), ATTENTION_SEQ[-1])
    i = max(0, min(len(ATTENTION_SEQ) - 2, sum(1 for x in ATTENTION_SEQ if x <= s) - 1))
    a, b = ATTENTION_SEQ[i], ATTENTION_SEQ[i + 1]
    f = (math.log2(s) - math.log2(a)) / (math.log2(b) - math.log2(a))

    def at(hd: int) -> float:
        row = table[(bool(causal), hd)]
        return row[i] + f * (row[i + 1] - row[i])

    hd = min(max(head_dim, 64), 128)
    value = at(64) + (hd - 64) / 64 * (at(128) - at(64))
    return value / peak


@dataclass(frozen=True)
class Implementation:
    """How a training run's code runs on a GPU, where that changes the prediction.

    The suite's own trial is `Implementation()` (Hugging Face transformers: eager operators, or
    fused by torch.compile when the trial compiles). A published run names what its code fuses."""

    name: str = "suite (transformers)"
    fused: frozenset[str] = field(default_factory=frozenset)
    """Kernels fused beyond eager PyTorch: attention, norm, activation, loss, rotary, optimizer."""
    attention_kernel: str = ""
    """flash2, flash1, triton or cutlass; "" for what `methods.attention` runs (sdpa and
    flash_attention_2: flash2 on Ampere and newer, cutlass on V100)."""
    compiled: bool | None = None
    """torch.compile on; None: as the trial says (`methods.compile`)."""
    grad_reduce_bytes: int = 4
    """Bytes per element of gradient reduction under FSDP (the suite reduces in fp32)."""
    states: str = "engine"
    """How a loop outside DeepSpeed and FSDP keeps the model states: "engine" (the engine's own
    layout: the suite's trials, and runs of DeepSpeed or FSDP), "amp" (fp32 parameters, gradients
    and AdamW moments; 16-bit compute by autocast, which casts the weights at every forward), "pure"
    (16-bit parameters, gradients and moments: `model.to(bfloat16)`, bf16-true)."""
    optimizer: str = "fused"
    """How its AdamW steps: "fused" (one kernel), "foreach" (torch's default: one kernel per
    operation over many tensors), "loop" (a kernel per operation per tensor)."""
    torch_ddp: bool = False
    """Data parallel by torch's DistributedDataParallel (not DeepSpeed's ZeRO-0): gradients
    all-reduced in buckets while the backward runs."""
    selective: str = "selective"
    """Its selective recomputation (`suite.models.recompute.MODES`): the suite's ("selective"), or
    torchtitan's "op" policy, which also recomputes every second matrix multiply ("selective-alternate")."""
    built: str = "fp32"
    """How the code builds the model before its engine takes it (`suite.predict.memory.BUILT`):
    "fp32" (the suite's worker), "16-bit" (cast on the host first) or "meta" (no storage until sharded)."""

    def elementwise_fused(self, compile_on: bool) -> bool:
        """Norms and activations fused (by hand or by torch.compile): the operators between two
        matmuls run as one kernel that reads and writes the tensor once."""
        on = compile_on if self.compiled is None else self.compiled
        return on or {"norm", "activation"} <= self.fused

    def kernel(self, attention: str, gpu: str) -> str:
        if self.attention_kernel:
            return self.attention_kernel
        return "cutlass" if arch(gpu) == "volta" else "flash2"


SUITE = Implementation()
