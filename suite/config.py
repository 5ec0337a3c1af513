"""Typed config schemas, their validation, and the frozen trial spec with its stable id.

The YAML files in `conf/` are merged onto `Config` (registered in Hydra's ConfigStore as
`config_schema`), so a misspelled key or a wrong type fails at composition. Allowed values
and allowed *combinations* are checked by `problems()`, which returns every problem at
once so a user fixes them in one go.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

FAMILIES = ("gpt_neox", "gpt2", "llama", "roberta", "vit")
PRECISIONS = ("fp32", "bf16", "fp16")
ATTENTIONS = ("eager", "sdpa", "flash_attention_2")
OFFLOADS = ("none", "optimizer", "optimizer+params")
RECOMPUTES = ("none", "full")
DEVICES = ("cpu", "cuda")
FAULTS = ("none", "hang", "kill", "nan")
GPU_COUNTS = (1, 2, 4, 8)
PREDICTION_ONLY = ("memory_gbps", "link", "link_gbps", "host_gbps", "bandwidth_source")
"""HardwareConfig fields read by the predictor only (suite.predict), left out of Trial.id."""


@dataclass
class RecipeConfig:
    """The model's original pretraining recipe (seed-paper.md has the sources)."""

    global_batch: int = MISSING
    """Samples per optimizer step, summed over all devices; fixed across methods."""
    seq_len: int = 0
    """Tokens per sample (text models); 0 for image models."""
    image_size: int = 0
    """Image side in pixels (image models); 0 for text models."""
    train_steps: int = MISSING
    """Optimizer steps of the original run."""
    precision: str = MISSING
    """Training precision of the original run: fp32, bf16 or fp16."""
    lr: float = MISSING
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    original_gpus: int = 0
    """GPUs of the original run (0 when unknown)."""
    original_days: float = 0.0
    """Wall-clock days of the original run (0 when unknown)."""


@dataclass
class ModelConfig:
    """Architecture of a standard model, built with `transformers` from random weights."""

    name: str = MISSING
    family: str = MISSING
    """One of FAMILIES: selects the `transformers` class and the synthetic batch."""
    hidden: int = MISSING
    layers: int = MISSING
    heads: int = MISSING
    kv_heads: int = 0
    """Key/value heads (grouped-query attention); 0 means equal to `heads`."""
    intermediate: int = MISSING
    vocab: int = 0
    max_positions: int = 0
    rotary_pct: float = 0.25
    patch_size: int = 16
    num_labels: int = 0
    source: str = ""
    """Where the shapes come from."""
    recipe: RecipeConfig = field(default_factory=RecipeConfig)


@dataclass
class HardwareConfig:
    """A compute budget: N GPUs of one type, or N CPU worker processes."""

    name: str = MISSING
    device: str = MISSING
    """cpu or cuda."""
    gpu: str = ""
    """GPU model name (empty for CPU)."""
    count: int = MISSING
    """Devices (CPU: worker processes) in the trial."""
    mem_gib: float = 0.0
    """Memory per device (GPU datasheet); for CPU the enforced budget, 0 = unlimited."""
    peak_tflops: dict[str, float] = field(default_factory=dict)
    """Dense peak TFLOP/s per dtype (bf16, fp16, tf32, fp32) from `datasheet`."""
    bf16: bool = False
    tf32: bool = False
    datasheet: str = ""
    memory_gbps: float = 0.0
    """Device memory bandwidth, GB/s (datasheet); 0 on CPU, where `suite-predict calibrate`
    measures it. For predictions only, like the fields below: not part of a trial's id."""
    link: str = ""
    """How the devices of one node reach each other: nvlink2/3/4, pcie3/4/5 (the slot's
    generation, x16), or "" (CPU: shared memory, measured by calibration)."""
    link_gbps: float = 0.0
    """Per-device bandwidth of `link`, one direction, GB/s (datasheet)."""
    host_gbps: float = 0.0
    """Per-device bandwidth to the host (PCIe x16), one direction, GB/s: offload transfers."""
    bandwidth_source: str = ""
    """Where the three bandwidths come from."""


@dataclass
class MethodsConfig:
    """Memory optimizations and speed switches applied to one trial."""

    zero_stage: int = 0
    """DeepSpeed ZeRO stage 0 (plain data parallel) to 3."""
    offload: str = "none"
    """none, optimizer (ZeRO >= 1) or optimizer+params (ZeRO-3) to CPU."""
    recompute: str = "none"
    """Activation recomputation: none or full (every block)."""
    micro_batch: int = 1
    """Samples per device per micro-step; gradient accumulation keeps the global batch."""
    attention: str = "sdpa"
    compile: bool = False
    precision: str = "recipe"
    """recipe (the model's own), or an override: fp32, bf16, fp16."""


@dataclass
class MeasureConfig:
    """How a trial is timed."""

    warmup_steps: int = 2
    timed_steps: int = 5
    max_micro_steps: int = 4
    """Micro-steps run per timed step; a larger accumulation is extrapolated from the
    measured micro, boundary and optimizer times (DESIGN.md, 'Measuring a step')."""
    timeout_s: float = 600.0
    seed: int = 0
    rerun: bool = False
    """Measure again even if the store holds this trial."""


@dataclass
class DebugConfig:
    """Fault injection for tests of the failure paths."""

    fault: str = "none"
    """none, hang, kill (SIGKILL itself) or nan, at the first timed step."""
    fault_rank: int = 0


@dataclass
class ClusterConfig:
    """Slurm: where sweep jobs run (`hydra/launcher=slurm`) and how many nodes a trial spans.

    Users edit conf/cluster/default.yaml, or add conf/cluster/NAME.yaml and pick it with
    `cluster=NAME`. Each job's GPUs, CPUs, memory and time limit are derived from its trial
    (`suite.slurm.resources`); the three overrides below replace the derived value when set.
    """

    nodes: int = 1
    """Nodes per trial, one launcher agent each; the trial spans nodes * hardware.count devices."""
    partition: str = ""
    """Slurm partition; empty: the cluster's default."""
    account: str = ""
    qos: str = ""
    sbatch: dict[str, Any] = field(default_factory=dict)
    """Further sbatch options by long name, e.g. {constraint: a100, mail-type: FAIL}."""
    setup: list[str] = field(default_factory=list)
    """Shell lines a job runs before the trial (module load ..., source .venv/bin/activate)."""
    cpus_per_gpu: int = 8
    """CPU cores asked per GPU (for the ranks and CPU offload); a CPU trial asks one per worker."""
    cpus_per_node: int = 0
    """Override: CPU cores per node (0: derived)."""
    mem_gb: int = 0
    """Override: host memory per node in GB (0: derived)."""
    time_min: int = 0
    """Override: the job's time limit in minutes (0: derived from measure.timeout_s)."""
    network_gbps: float = 200.0
    """Bandwidth between nodes, Gbit/s per node (the sum of a node's NICs, one direction):
    predictions of `cluster.nodes` > 1 (`suite-predict`). 200: one HDR InfiniBand NIC."""
    network: str = "InfiniBand HDR, one 200 Gb/s NIC per node"
    """What `network_gbps` describes, shown with predictions."""


@dataclass
class StoreConfig:
    dir: str = "results/runs"
    """One JSON file per trial lands here, named by the trial id."""
    sweep: str = "adhoc"
    """Name recorded with each result (W&B group, report filter)."""


@dataclass
class WandbConfig:
    mode: str = "offline"
    """offline (default; `wandb sync` later), online, or disabled."""
    project: str = "suite"
    dir: str = "results"
    """W&B writes its run folders under DIR/wandb/."""


@dataclass
class SearchConfig:
    """The space `suite-search` explores for one (model, hardware); micro-batches are searched."""

    zero_stages: list[int] = field(default_factory=lambda: [0, 1, 2, 3])
    offloads: list[str] = field(default_factory=lambda: ["none", "optimizer", "optimizer+params"])
    recomputes: list[str] = field(default_factory=lambda: ["none", "full"])
    attentions: list[str] = field(default_factory=list)
    """Empty: keep methods.attention."""
    compiles: list[bool] = field(default_factory=list)
    """Empty: keep methods.compile."""
    margin: float = 0.03
    """Stop when no remaining candidate is predicted to beat the best by this fraction."""
    budget_s: float = 0.0
    """Stop after this many seconds of trials (0: no limit)."""


@dataclass
class Config:
    model: ModelConfig = MISSING
    hardware: HardwareConfig = MISSING
    methods: MethodsConfig = field(default_factory=MethodsConfig)
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    search: SearchConfig = field(default_factory=SearchConfig)


def register() -> None:
    ConfigStore.instance().store(name="config_schema", node=Config)


@dataclass(frozen=True)
class Trial:
    """One fully resolved trial: what is measured and how. Its `id` keys the store."""

    model: ModelConfig
    hardware: HardwareConfig
    methods: MethodsConfig
    measure: MeasureConfig
    debug: DebugConfig
    nodes: int = 1
    """Nodes the trial spans (`cluster.nodes`), each with hardware.count devices."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trial:
        model = dict(d["model"])
        model["recipe"] = RecipeConfig(**model["recipe"])
        return cls(
            model=ModelConfig(**model),
            hardware=HardwareConfig(**d["hardware"]),
            methods=MethodsConfig(**d["methods"]),
            measure=MeasureConfig(**d["measure"]),
            debug=DebugConfig(**d.get("debug", {})),
            nodes=d.get("nodes", 1),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def id(self) -> str:
        d = self.to_dict()
        d["measure"].pop("rerun")  # how to run it, not what is measured
        d["measure"].pop("timeout_s")
        for k in PREDICTION_ONLY:  # describe the hardware to the predictor; ids predate them
            d["hardware"].pop(k)
        if d["nodes"] == 1:
            d.pop("nodes")  # one-node ids predate the field and stay as they were
        blob = json.dumps(d, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    # Derived quantities; one owner each.
    @property
    def precision(self) -> str:
        p = self.methods.precision
        return self.model.recipe.precision if p == "recipe" else p

    @property
    def devices(self) -> int:
        """Devices (ranks) over all nodes: the recipe's global batch is split over them."""
        return self.nodes * self.hardware.count

    @property
    def per_device_batch(self) -> int:
        return self.model.recipe.global_batch // self.devices

    @property
    def gas(self) -> int:
        """Gradient accumulation steps that keep the recipe's global batch."""
        return self.per_device_batch // self.methods.micro_batch

    @property
    def gas_measured(self) -> int:
        return min(self.gas, self.measure.max_micro_steps)

    @property
    def tokens_per_sample(self) -> int:
        r = self.model.recipe
        if self.model.family == "vit":
            return (r.image_size // self.model.patch_size) ** 2 + 1  # patches + [CLS]
        return r.seq_len


def _choice(problems: list[str], name: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        problems.append(f"{name}={value!r} is not allowed; choose one of {', '.join(map(str, allowed))}")


def _positive(problems: list[str], name: str, value: float) -> None:
    if value <= 0:
        problems.append(f"{name}={value} must be > 0")


def problems(t: Trial) -> list[str]:
    """Every problem with the values and their combination; empty when the trial is valid."""
    p: list[str] = []
    m, r, hw, me, ms = t.model, t.model.recipe, t.hardware, t.methods, t.measure
    _choice(p, "model.family", m.family, FAMILIES)
    for k in ("hidden", "layers", "heads", "intermediate"):
        _positive(p, f"model.{k}", getattr(m, k))
    if m.heads > 0 and m.hidden % m.heads:
        p.append(f"model.hidden={m.hidden} is not divisible by model.heads={m.heads}")
    if m.kv_heads and m.heads % m.kv_heads:
        p.append(f"model.heads={m.heads} is not divisible by model.kv_heads={m.kv_heads}")
    if m.family == "vit":
        _positive(p, "model.recipe.image_size", r.image_size)
        _positive(p, "model.num_labels", m.num_labels)
        if r.image_size > 0 and m.patch_size > 0 and r.image_size % m.patch_size:
            p.append(f"model.recipe.image_size={r.image_size} is not a multiple of model.patch_size={m.patch_size}")
    elif m.family in FAMILIES:
        _positive(p, "model.recipe.seq_len", r.seq_len)
        _positive(p, "model.vocab", m.vocab)
        if r.seq_len > m.max_positions > 0:
            p.append(f"model.recipe.seq_len={r.seq_len} exceeds model.max_positions={m.max_positions}")
    _positive(p, "model.recipe.global_batch", r.global_batch)
    _positive(p, "model.recipe.train_steps", r.train_steps)
    _choice(p, "model.recipe.precision", r.precision, PRECISIONS)

    _choice(p, "hardware.device", hw.device, DEVICES)
    _positive(p, "hardware.count", hw.count)
    if hw.device == "cuda" and hw.count not in GPU_COUNTS:
        p.append(f"hardware.count={hw.count} is not a GPU count of one node; choose one of {GPU_COUNTS}")
    _positive(p, "cluster.nodes", t.nodes)
    if hw.mem_gib < 0:
        p.append(f"hardware.mem_gib={hw.mem_gib} must be >= 0")

    _choice(p, "methods.zero_stage", me.zero_stage, (0, 1, 2, 3))
    _choice(p, "methods.offload", me.offload, OFFLOADS)
    _choice(p, "methods.recompute", me.recompute, RECOMPUTES)
    _choice(p, "methods.attention", me.attention, ATTENTIONS)
    _choice(p, "methods.precision", me.precision, ("recipe",) + PRECISIONS)
    _positive(p, "methods.micro_batch", me.micro_batch)
    if me.offload != "none" and me.zero_stage == 0:
        p.append(f"methods.offload={me.offload} needs sharding; set methods.zero_stage to 1, 2 or 3")
    if me.offload == "optimizer+params" and me.zero_stage != 3:
        p.append(f"methods.offload=optimizer+params needs methods.zero_stage=3 (got {me.zero_stage})")
    prec = t.precision
    if prec == "bf16" and not hw.bf16:
        p.append(f"precision bf16 is not supported by {hw.name}; set methods.precision=fp16 or fp32")
    if prec == "fp16" and hw.device == "cpu":
        p.append(f"precision fp16 does not train on CPU ({hw.name}); set methods.precision=fp32 or bf16")
    if me.attention == "flash_attention_2" and prec == "fp32":
        p.append("methods.attention=flash_attention_2 needs bf16 or fp16; set methods.precision")
    if me.attention == "flash_attention_2" and m.family not in ("gpt_neox", "llama", "gpt2"):
        p.append(f"methods.attention=flash_attention_2 is not available for model.family={m.family}")
    if r.global_batch > 0 and hw.count > 0 and t.nodes > 0:
        over = f"hardware.count={hw.count}" + (f" x cluster.nodes={t.nodes}" if t.nodes > 1 else "")
        if r.global_batch % t.devices:
            p.append(f"model.recipe.global_batch={r.global_batch} is not divisible by {over}")
        elif me.micro_batch > 0 and t.per_device_batch % me.micro_batch:
            p.append(
                f"methods.micro_batch={me.micro_batch} does not divide the per-device batch "
                f"{t.per_device_batch} (global {r.global_batch} / {t.devices} devices)"
            )

    for k in ("warmup_steps", "timed_steps", "max_micro_steps", "timeout_s"):
        _positive(p, f"measure.{k}", getattr(ms, k))
    _choice(p, "debug.fault", t.debug.fault, FAULTS)
    return p


def unsupported(t: Trial) -> str | None:
    """Why this machine cannot run a valid trial, or None. Checked before any launch."""
    if t.methods.attention == "flash_attention_2":
        if t.hardware.device == "cpu":
            return "flash-attn needs a CUDA GPU; it is unavailable on CPU"
        if importlib.util.find_spec("flash_attn") is None:
            return "flash-attn is not installed (pip install 'suite[flash]' on a CUDA machine)"
    if t.hardware.device == "cuda":
        import torch

        have = torch.cuda.device_count()
        if have < t.hardware.count:
            return f"{t.hardware.name} needs {t.hardware.count} CUDA GPU(s); this machine has {have}"
    return None
