"""The predictor: memory per rank and step time in seconds of any trial, before it runs.

    p = Predictor().predict(trial)     # a Prediction: peaks, fit, step and its parts, sources
    Predictor().estimate(trial)        # the search's interface (Estimator): GiB to fit, s/step

A module per concern:

    trace.py    one micro-step of the real model: activations, FLOPs, bytes and shapes of every
                operator, affine in the micro-batch, cached on disk
    recorder.py the micro-step run under fake tensors, each operator recorded (torch)
    operators.py  the classes of aten operators the trace records and the timing prices
    memory.py   the engine's model states as it lays them out (DeepSpeed ZeRO 0-3, offload,
                FSDP2, plain loops), with their sources
    peaks.py    a layout's terms by when they are alive: peaks of the build and of the timed
                window, the micro-step's peak moment
    timing.py   the step's parts under a roofline, collectives and the optimizer
    machine.py  the hardware's constants: datasheet (GPU) or calibration (`suite.calibrate`)
    gpu.py      GPU efficiencies by architecture, and published runs' implementations

What a prediction reports, and how it compares with what the worker measures:

    peak_mem_gib         the timed window's peak as the worker reports it: a GPU's
                         max_memory_allocated (tensors, cuBLAS workspaces); a CPU worker's
                         resident memory above its imported runtime (tensors + the runtime
                         the trial adds, calibrated per engine)
    build_peak_mem_gib   the same while the model is built and the engine initialised
    device_gib           what must fit in the device: the larger peak, plus on a GPU the
                         CUDA context and NCCL buffers and the allocator's slack, on a CPU
                         worker the part of its RLIMIT_DATA budget beyond resident memory;
                         under a memory cap (`suite.detect.memory_cap_gib`) what the cap holds:
                         the caching allocator's memory alone, the context and NCCL's buffers
                         being outside it (the overheads not counted in memory_allocated)
    fits                 every tier holds what it must: device_gib <= hardware.mem_gib (a CPU worker
                         without a budget fits), the node's ranks' host_gib <= hardware.host.mem_gib
                         (offload on a GPU) and their nvme_gib <= hardware.host.nvme_gib (the NVMe
                         tier); `short_of` names the first tier that does not
    step_time_s          (GAS-1) * t_micro + t_boundary + t_optimizer, as suite.metrics composes it

A prediction is a prediction: `suite-predict` and the report label it so, show it with the
error measured so far (`published_error`) and never mix it with measured figures.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Protocol

from suite import paths
from suite.config import Trial
from suite.config.schema import ModelConfig, settings_json
from suite.detect import memory_cap_gib
from suite.metrics import peak_flops
from suite.models.arch import shape
from suite.models.config import hf_config
from suite.predict import comm, memory, timing
from suite.predict.gpu import SUITE, Implementation
from suite.predict.machine import GIB, Machine, engine_key, machine_for
from suite.predict.memory import bytes_per_element
from suite.predict.operators import ATTENTION_PREFIX
from suite.predict.peaks import Layout, Term
from suite.predict.trace import model_flops, traced

HAND_FUSED_NORMS = 4
"""Hidden-sized tensors per block and token a run with hand-fused kernels keeps for its norms beyond
its matmuls' outputs: each of a block's two norms saves its input, and its output is the next
matmul's saved input (`_activations_of`)."""
MLP_WIDTH = ("intermediate_size", "n_inner", "ffn_dim", "d_ff")
"""transformers' names of the MLP's width (Llama, GPT-2, OPT, T5); unset, 4 x hidden."""
ATTENTION_DROPOUT = ("attn_pdrop", "attention_dropout", "attention_probs_dropout_prob")
"""transformers' names of the dropout on attention probabilities (GPT-2; Llama, GPT-NeoX, OPT; BERT, ViT)."""
_AS_RUN: dict[str, ModelConfig] = {}


MEMORY_KINDS = ("allocated", "reserved", "nvidia-smi")
"""The kinds of per-GPU memory figure a prediction gives (`Prediction.memory_gib`)."""


@dataclass(frozen=True)
class Estimate:
    """What the search asks of a prediction."""

    mem_gib: float
    """Memory that must fit in the device (`Prediction.device_gib`)."""
    step_time: float
    """Seconds per optimizer step."""


class Estimator(Protocol):
    """The one small interface between the search and the predictor (tests script their own)."""

    def estimate(self, t: Trial) -> Estimate: ...


@dataclass
class Prediction:
    trial_id: str
    peak_mem_gib: float
    build_peak_mem_gib: float
    model_states_gib: float
    reserved_gib: float
    """A GPU's caching allocator's peak (`torch.cuda.max_memory_reserved`): the larger peak x its slack."""
    device_gib: float
    """What the device holds at its peak (nvidia-smi's figure): reserved + CUDA context + NCCL; what must fit."""
    capacity_gib: float
    fits: bool
    step_time_s: float
    t_micro_s: float
    t_boundary_s: float
    t_optimizer_s: float
    tokens_per_s: float
    mfu: float | None
    host_gib: float
    """Per rank in the host's memory under offload (GPU); 0 otherwise."""
    machine: str
    nvme_gib: float = 0.0
    """Per rank on the NVMe drive (the NVMe tier); 0 otherwise."""
    short_of: str = ""
    """The tier that does not hold what it must: "device memory", "host memory" or "NVMe";
    empty where the trial fits."""
    memory_terms: dict[str, list] = field(default_factory=dict)
    time_detail: dict[str, float] = field(default_factory=dict)
    n_params: int = 0
    """The model's parameters, as traced."""

    def memory_gib(self, kind: str) -> float:
        """The memory figure of `kind` (MEMORY_KINDS): allocated (the timed window's peak of
        max_memory_allocated), reserved (max_memory_reserved), nvidia-smi (the device's)."""
        return {"allocated": self.peak_mem_gib, "reserved": self.reserved_gib, "nvidia-smi": self.device_gib}[kind]

    def to_json(self) -> dict:
        return asdict(self)


class Predictor:
    """Predictions for trials; `host` picks whose calibration a CPU trial uses (default: this
    machine's), `nodes`/`network` how a multi-node trial's nodes are joined; `machine`, given,
    is the constants every trial is predicted with (a calibration read from a file)."""

    def __init__(self, network: comm.Network | None = None, host: str | None = None, machine: Machine | None = None):
        self.network = network or comm.Network()
        self.host = host
        self._machines: dict[str, Machine] = {}
        self._fixed = machine

    def machine(self, t: Trial) -> Machine:
        if self._fixed is not None:
            return self._fixed
        if t.hardware.name not in self._machines:
            self._machines[t.hardware.name] = machine_for(t, self.host)
        return self._machines[t.hardware.name]

    def predict(self, t: Trial, impl: Implementation = SUITE) -> Prediction:
        """`t` predicted; on a GPU as `impl` runs it (the suite's own code by default, or a
        published run's implementation: `suite.predict.gpu.Implementation`)."""
        m = self.machine(t)
        me = t.methods
        tr = traced(self.model_as_run(t), me.attention, me.recompute, t.precision, device=kernels_of(t))
        loop = None
        if impl.states != "engine" and me.engine == "deepspeed" and me.zero_stage == 0:
            loop = (impl.states, impl.optimizer, impl.torch_ddp)
        kept, hand_fused = self._activations_of(t, tr, impl)
        lay = memory.layout(t, kept, loop, impl.built)
        if hand_fused:
            lay.backward.append(Term("hand-fused kernels' saved inputs", hand_fused, "HAND_FUSED_NORMS, MLP_WIDTH"))
        timed, build = lay.timed_peak(), lay.build_peak()
        cpu = m.kind == "cpu"
        if cpu:
            key = engine_key(me)
            runtime = m.runtime_bytes.get(key, m.runtime_bytes.get("zero0", 0.0))
            host = Layout.total(lay.host)  # one memory on a CPU worker
            peak, build_peak = timed + host + runtime, build + runtime
            device = max(peak, build_peak) + m.data_margin_bytes
            reserved = max(peak, build_peak)  # no caching allocator: what is resident
            host_gib = 0.0
        else:
            counted = sum(v[0] for v in m.overhead.values() if v[2])
            # A cap holds the caching allocator only: what is outside memory_allocated is outside it too.
            capped = memory_cap_gib(t.hardware) is not None
            fixed = 0.0 if capped else sum(v[0] for v in m.overhead.values() if not v[2])
            peak, build_peak = timed + counted, build + counted
            # The allocator keeps freed blocks cached (reserved over allocated), but frees them and
            # retries before it fails an allocation: a trial fits on what it allocates; reserved
            # memory (and nvidia-smi's figure) grows at most to what the device has.
            needed = max(peak, build_peak) + fixed
            reserved = max(peak, build_peak) * m.reserved_ratio
            if t.hardware.mem_gib > 0:
                reserved = max(min(reserved, t.hardware.mem_gib * GIB - fixed), max(peak, build_peak))
            device = reserved + fixed
            host_gib = Layout.total(lay.host) / GIB
        capacity = t.hardware.mem_gib
        nvme_gib = memory.Layout.total(lay.nvme) / GIB
        short_of = tier_short(t, (device if cpu else needed) / GIB, host_gib, nvme_gib)
        fits = not short_of
        # Time from the trace of the unfused operators: a GPU's dropout kernel is one pass over
        # memory (its mask is what it keeps, above), yet the published runs that drop out most
        # (Lambda's and Hugging Face's BERT, Raschka's GPT-2) ran as slow as the three passes of the
        # unfused path (median |error| 7.7%, 26.8%, 19.2% against 11.1%, 30.0%, 27.5% with one pass,
        # its random numbers drawn as it goes): an empirical choice, made on those runs.
        timed = traced(self.model_as_run(t), me.attention, me.recompute, t.precision)  # `tr` itself on a CPU
        parts = timing.step_parts(t, timed, m, t.nodes, self.network, impl)
        step = parts.step_time_s
        tokens = t.model.recipe.global_batch * t.tokens_per_sample
        tokens_per_s = tokens / step if step and not math.isnan(step) else math.nan
        peak_f = peak_flops(t)
        flops_per_token = self.model_flops(t) / t.tokens_per_sample
        mfu = flops_per_token * tokens_per_s / (t.devices * peak_f) if peak_f and not math.isnan(tokens_per_s) else None
        terms = {
            "steady": [[x.name, x.bytes / GIB, x.source] for x in lay.steady],
            "backward": [[x.name, x.bytes / GIB, x.source] for x in lay.backward],
            "boundary": [[x.name, x.bytes / GIB, x.source] for x in lay.boundary],
            "optimizer": [[x.name, x.bytes / GIB, x.source] for x in lay.optimizer],
            "build": [[x.name, x.bytes / GIB, x.source] for x in lay.build],
            "host": [[x.name, x.bytes / GIB, x.source] for x in lay.host],
            "nvme": [[x.name, x.bytes / GIB, x.source] for x in lay.nvme],
            "activations": [["traced micro-step", lay.activations / GIB, "suite.predict.trace"]],
        }
        return Prediction(
            trial_id=t.id,
            peak_mem_gib=peak / GIB,
            build_peak_mem_gib=build_peak / GIB,
            model_states_gib=lay.states() / GIB,
            reserved_gib=reserved / GIB,
            device_gib=device / GIB,
            capacity_gib=capacity,
            fits=fits,
            step_time_s=step,
            t_micro_s=parts.t_micro,
            t_boundary_s=parts.t_boundary,
            t_optimizer_s=parts.t_optimizer,
            tokens_per_s=tokens_per_s,
            mfu=mfu,
            host_gib=host_gib,
            machine=m.source,
            nvme_gib=nvme_gib,
            short_of=short_of,
            memory_terms=terms,
            time_detail=parts.detail,
            n_params=tr.n_params,
        )

    @staticmethod
    def model_as_run(t: Trial) -> ModelConfig:
        """The model as the trial's device runs it. A GPU's fused attention (SDPA's flash and
        memory-efficient kernels, flash-attn) applies the attention probabilities' dropout inside
        the kernel from a seed (PyTorch's `scaled_dot_product_attention`, `dropout_p`), keeping no
        mask and no probabilities; a CPU runs SDPA with dropout as its unfused math (the trace, made
        on the CPU, records that): so on a GPU the trace is made without that dropout."""
        if t.hardware.device != "cuda" or t.methods.attention not in ("sdpa", "flash_attention_2"):
            return t.model
        key = settings_json(t.model)
        if key not in _AS_RUN:
            cfg = hf_config(t.model)  # the defaults too: GPT-2's and BERT's attention dropout is 0.1 unless set
            zeroed = {k: 0.0 for k in ATTENTION_DROPOUT if getattr(cfg, k, 0)}
            _AS_RUN[key] = replace(t.model, config={**t.model.config, **zeroed}) if zeroed else t.model
        return _AS_RUN[key]

    @staticmethod
    def _activations_of(t: Trial, tr, impl: Implementation):
        """The trace whose activations a GPU run keeps, and what a run with hand-fused kernels keeps
        beyond it (bytes). Compiled (torch.compile) or with its norms and activations fused by hand,
        a run keeps the outputs of its matmuls and attention, which is what selective recomputation
        keeps (torch.compile's partitioner recomputes the pointwise operators between them); with
        kernels fused by hand (no recomputation) a run also keeps the inputs its matmuls and fused
        kernels save that the matmul-only trace recomputes: each norm's input and output (the next
        matmul's input; flash-attn's ops/layer_norm.py and ops/rms_norm.py keep x and the normalized
        output) and the MLP's activation output (its down projection's input), HAND_FUSED_NORMS
        hidden-sized tensors and one of the MLP's width per block and token. With its loss fused (a causal LM's
        cross-entropy kernel, by hand or by torch.compile, which fuses the softmax and its
        backward) no fp32 copy of the logits (`recorder._FusedCrossEntropy`). Under DeepSpeed ZeRO-3,
        on any device, with its linear layers, as its worker runs them (`trace.LINEARS`). Else `tr`'s own."""
        me = t.methods
        linear = "zero3" if me.engine == "deepspeed" and me.zero_stage == 3 else "torch"
        if t.hardware.device != "cuda":
            if linear == "torch":
                return tr, 0.0
            return traced(t.model, me.attention, me.recompute, t.precision, "model", linear), 0.0
        recompute = t.methods.recompute
        compiled = t.methods.compile if impl.compiled is None else impl.compiled
        hand = not compiled and impl.elementwise_fused(False) and recompute == "none"
        if recompute == "none" and (compiled or hand):
            recompute = "selective"
        fused_loss = "loss" in impl.fused or compiled
        loss = "fused" if fused_loss and t.model.task == "causal-lm" else "model"
        # Norms fused by hand, the rest eager: each RMSNorm keeps what its kernel keeps (compiled or
        # fully hand-fused runs keep less, through the selective trace above).
        norm = "fused" if "norm" in impl.fused and not (compiled or hand) else "model"
        if t.methods.recompute == "selective":  # the run's own policy (`Implementation.selective`)
            recompute = impl.selective
        extra = 0.0
        if hand:
            s, cfg = shape(t.model), hf_config(t.model)
            inner = next((v for k in MLP_WIDTH if isinstance(v := getattr(cfg, k, None), int)), 4 * s.hidden)
            tokens = t.methods.micro_batch * t.tokens_per_sample
            extra = (HAND_FUSED_NORMS * s.hidden + inner) * s.layers * tokens * bytes_per_element(t.precision)
        if (recompute, loss, linear, norm) == (t.methods.recompute, "model", "torch", "model"):
            return tr, extra
        as_run = Predictor.model_as_run(t)
        return traced(as_run, t.methods.attention, recompute, t.precision, loss, linear, "cuda", norm), extra

    @staticmethod
    def model_flops(t: Trial) -> float:
        """Model FLOPs per sample as MFU counts them: `suite.models.flops.count_flops` (no recomputation),
        less the half of causal attention's FLOPs that its kernel skips, as the predicted time
        counts them (`timing.compute_seconds`): so predicted MFU never exceeds the GPU's efficiency."""
        tr = traced(Predictor.model_as_run(t), t.methods.attention, "none", t.precision)
        skipped = sum(
            0.5 * g.count * g.flops_at(1)
            for g in tr.groups
            if g.op.startswith(ATTENTION_PREFIX) and len(g.dims) > 5 and g.dims_at(1)[5]
        )
        return model_flops(t.model, t.methods.attention) - skipped

    def estimate(self, t: Trial) -> Estimate:
        """The search's interface: what must fit, and seconds per step."""
        p = self.predict(t)
        return Estimate(p.device_gib, p.step_time_s)


def kernels_of(t: Trial) -> str:
    """Whose kernels `t`'s trace runs (`suite.predict.trace.DEVICES`): a GPU's on a GPU, else a CPU's."""
    return "cuda" if t.hardware.device == "cuda" else "cpu"


def tier_short(t: Trial, device_gib: float, host_gib: float, nvme_gib: float) -> str:
    """The first tier of the memory hierarchy that cannot hold what a trial keeps there, or "":
    the device (`hardware.mem_gib`; a CPU worker without a budget holds anything), then on a GPU
    the node's host memory for its ranks' offloaded states (`hardware.host.mem_gib`, 0: not
    checked), then the node's NVMe drive for their swap (`hardware.host.nvme_gib`: a GPU profile
    without one holds nothing; a CPU profile's drive is checked before launching instead,
    `suite.config.validate.nvme_problems`)."""
    hw = t.hardware
    if hw.mem_gib > 0 and device_gib > hw.mem_gib:
        return "device memory"
    if hw.device == "cuda" and hw.host.mem_gib > 0 and host_gib * hw.count > hw.host.mem_gib:
        return "host memory"
    if nvme_gib > 0 and (hw.device == "cuda" or hw.host.nvme_gib > 0) and nvme_gib * hw.count > hw.host.nvme_gib:
        return "NVMe"
    return ""


_PUBLISHED: dict[tuple[str, int, int], dict] = {}


def published_error(kind: str) -> dict | None:
    """The accuracy measured so far for predictions of `kind` (cpu, cuda, cuda-published): the
    summary `suite-report accuracy --publish` (or `suite-predict published-accuracy --publish`)
    commits under results/accuracy/, or None. Read once per version of the file: every predicted
    row's error label reads it."""
    path = paths.accuracy_dir() / f"{kind}.json"
    if not path.exists():
        return None
    st = path.stat()
    key = (str(path), st.st_mtime_ns, st.st_size)
    if key not in _PUBLISHED:
        _PUBLISHED[key] = json.loads(path.read_text())
    return _PUBLISHED[key]
