"""The typed settings of a trial and the frozen `Trial` with its stable id.

Every setting is a dataclass field with its doc under it; a field with a fixed set of values is
typed `Literal[...]`, and the tuple of those values (`ENGINES`, ...) is read from that type, so
the choices are written once. The YAML in `conf/` fills these fields (`suite.config.compose`
registers them with Hydra, where a misspelled key or a wrong type fails at composition); values
and combinations are checked by `suite.config.validate.problems`, every problem at once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

MISSING = "???"  # OmegaConf's marker of a required value (omegaconf.MISSING), kept free of its import

Precision = Literal["fp32", "bf16", "fp16"]
Attention = Literal["eager", "sdpa", "flash_attention_2", "none"]
Engine = Literal["deepspeed", "fsdp2"]
Offload = Literal["none", "optimizer", "optimizer+params"]
OffloadDevice = Literal["cpu", "nvme"]
Recompute = Literal["none", "full", "selective"]
Optimizer = Literal["engine", "torch_fused"]
Device = Literal["cpu", "cuda"]
Fault = Literal["none", "hang", "kill", "nan", "oom", "overflow"]
ZeroStage = Literal[0, 1, 2, 3]
Task = Literal["causal-lm", "masked-lm", "image-classification", "question-answering", "sequence-classification"]

PRECISIONS: tuple[str, ...] = get_args(Precision)
ATTENTIONS: tuple[str, ...] = get_args(Attention)
ENGINES: tuple[str, ...] = get_args(Engine)
OFFLOADS: tuple[str, ...] = get_args(Offload)
OFFLOAD_DEVICES: tuple[str, ...] = get_args(OffloadDevice)
RECOMPUTES: tuple[str, ...] = get_args(Recompute)
OPTIMIZERS: tuple[str, ...] = get_args(Optimizer)
DEVICES: tuple[str, ...] = get_args(Device)
FAULTS: tuple[str, ...] = get_args(Fault)
ZERO_STAGES: tuple[int, ...] = get_args(ZeroStage)
GPU_COUNTS = (1, 2, 4, 8)
TASKS = dict(zip(get_args(Task), ("token", "token", "image", "token", "token"), strict=True))
"""Each task and its unit of throughput: a text sample is `seq_len` tokens, an image is one unit
(an image has no token count common to every architecture: a ViT sees patches, a ConvNeXt pixels)."""
PREDICTION_ONLY = (
    "memory_gbps",
    "link",
    "link_gbps",
    "host_gbps",
    "bandwidth_source",
    "host",
    "power_w",
    "power_source",
)
"""HardwareConfig fields read by predictions only (suite.predict; `suite-plan`'s energy), left out of Trial.id."""


def dataclass_fields(obj: Any) -> Any:
    """`json.dumps`'s `default` for settings: a dataclass as its fields, any other value as its text.
    `json.dumps(x, sort_keys=True, default=dataclass_fields)` is the text of
    `json.dumps(asdict(x), sort_keys=True)` without asdict's deep copy, which dominated the keys made
    of a model's settings for each of the thousands of candidates a prediction ranks."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    return str(obj)


def settings_json(obj: Any) -> str:
    """Settings (a dataclass, or JSON holding some) as sorted JSON: a key for caches of them."""
    return json.dumps(obj, sort_keys=True, default=dataclass_fields)


@dataclass
class RecipeConfig:
    """The model's original pretraining recipe; each conf/model YAML cites its source."""

    global_batch: int = MISSING
    """Samples per optimizer step, summed over all devices; fixed across methods."""
    seq_len: int = 0
    """Tokens per sample (text tasks)."""
    image_size: int = 0
    """Image side in pixels (image tasks); the model config's `image_size`, where it has one, follows it."""
    train_steps: int = MISSING
    """Optimizer steps of the original run."""
    precision: Precision = MISSING
    """Training precision of the original run: fp32, bf16 or fp16."""
    lr: float = MISSING
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    """Gradient-norm clipping; 0 for none."""
    original_gpus: int = 0
    """GPUs of the original run (0 when unknown)."""
    original_days: float = 0.0
    """Wall-clock days of the original run (0 when unknown)."""


@dataclass
class ModelConfig:
    """Any `transformers` architecture, built from its config with random weights.

    A model is data: a `model_type` (any key of transformers' CONFIG_MAPPING) and the fields
    of its transformers config, or a local `config.json`, plus the task it is trained for.
    `suite.models` builds every one through the same path; no architecture has code of its own.
    """

    name: str = MISSING
    task: Task = MISSING
    """One of TASKS: picks the AutoModelFor... class, the synthetic batch and the labels."""
    model_type: str = ""
    """transformers model type (gpt_neox, llama, mamba, convnext, ...); may be left empty with `hf_config`."""
    hf_config: str = ""
    """A local config.json (or a folder holding one) to start from; never a Hub id. A trial
    keeps the file's fields in `config` (see `suite.models.config.inline`), so its record stands alone."""
    config: dict[str, Any] = field(default_factory=dict)
    """transformers config fields, with transformers' names; over `hf_config` where both give one."""
    source: str = ""
    """Where the shapes come from."""
    recipe: RecipeConfig = field(default_factory=RecipeConfig)

    @property
    def unit(self) -> str:
        """What throughput counts for the model's task (TASKS): token or image."""
        return TASKS.get(self.task, "token")


@dataclass
class HostConfig:
    """The host of one node, per node: what offload keeps in its memory, CPU Adam's pace, and the
    NVMe drive the NVMe tier swaps to. Datasheet-style defaults with their source in each GPU
    profile's `host:` block (conf/hardware/); 0 where not known (a CPU profile's host is this
    machine: `suite-predict calibrate` measures its CPU Adam and NVMe). For predictions only: not
    in a trial's id (`PREDICTION_ONLY`)."""

    mem_gib: float = 0.0
    """Host memory of the node, GiB: what offloaded states (and the NVMe tier's pinned buffers)
    must fit in, with every rank of the node."""
    mem_gbps: float = 0.0
    """Host memory bandwidth of the node, GB/s (all channels of all sockets)."""
    cores: int = 0
    """CPU cores of the node (CPU Adam runs on them, shared by the node's ranks)."""
    adam_elements_per_s: float = 0.0
    """DeepSpeedCPUAdam parameters per second with the whole node's cores (cited, or measured by
    `suite-predict calibrate` on that node); 0: from `mem_gbps` (CPU Adam streams its states)."""
    nvme_gib: float = 0.0
    """Capacity of the NVMe drive(s) the NVMe tier swaps to, GiB (0: none)."""
    nvme_read_gbps: float = 0.0
    """Read bandwidth DeepSpeed's async I/O reaches on that drive, GB/s."""
    nvme_write_gbps: float = 0.0
    """Write bandwidth DeepSpeed's async I/O reaches on that drive, GB/s."""
    source: str = ""
    """Where these figures come from."""


@dataclass
class HardwareConfig:
    """A compute budget: N GPUs of one type, or N CPU worker processes."""

    name: str = MISSING
    device: Device = MISSING
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
    host: HostConfig = field(default_factory=HostConfig)
    """The node's host: memory, CPU Adam, NVMe (offload and the NVMe tier); `HostConfig`."""
    power_w: float = 0.0
    """Board power of one device at its datasheet maximum (TDP), W: the energy `suite-plan` weighs."""
    power_source: str = ""
    """Where `power_w` comes from."""


@dataclass
class MethodsConfig:
    """Memory optimizations and speed switches applied to one trial."""

    engine: Engine = "deepspeed"
    """Sharding engine: deepspeed (ZeRO, set by `zero_stage`) or fsdp2 (PyTorch's `fully_shard`,
    set by `reshard_after_forward`); suite/engines.py."""
    zero_stage: ZeroStage = 0
    """DeepSpeed ZeRO stage 0 (plain data parallel) to 3; stays 0 under engine=fsdp2."""
    reshard_after_forward: bool | None = None
    """FSDP2 only: true = full_shard (ZeRO-3-like), false = shard_grad_op (ZeRO-2-like). Unset
    (null) means the engine's default: FSDP2's true, filled in when the trial is resolved; under
    deepspeed it stays unset."""
    reduce_every_micro_step: bool = False
    """FSDP2 only: reduce-scatter gradients after every micro-step's backward (as torchtitan and
    Composer do), so no unsharded gradients are kept between micro-steps; false: only at the
    boundary micro-step (FSDP2's no_sync before it). Not part of a trial's id while false."""
    offload: Offload = "none"
    """none, optimizer (DeepSpeed ZeRO >= 1) or optimizer+params (DeepSpeed ZeRO-3; under fsdp2
    FSDP2's CPUOffloadPolicy, which keeps parameters, gradients and optimizer state on the host)."""
    offload_device: OffloadDevice = "cpu"
    """Where `offload` puts what it offloads, in DeepSpeed's words: cpu (host memory) or nvme
    (ZeRO-Infinity: DeepSpeed's async I/O swaps the optimizer states, and under optimizer+params
    the parameters, to files under `nvme_path`; ZeRO-3 only). Not in the id at its default."""
    nvme_path: str = ""
    """A folder on the NVMe drive: each trial swaps into its own `<nvme_path>/<trial id>`, removed
    after it whatever its outcome; empty: `<store.dir>/nvme`, filled in when the trial runs
    (`suite.nvme`). Where, not what: not in the id; the record keeps it."""
    recompute: Recompute = "none"
    """Activation recomputation: none, full (every block keeps only its input) or selective (every
    block keeps its matmuls' and attention's outputs and recomputes the rest: PyTorch's selective
    activation checkpointing, Korthikanti et al. 2022); `suite.models.recompute.apply_recompute`."""
    micro_batch: int = 1
    """Samples per device per micro-step; gradient accumulation keeps the global batch."""
    attention: Attention = "sdpa"
    """eager, sdpa or flash_attention_2, where the model class supports it. A model without
    attention (Mamba, ConvNeXt) has none to choose: it runs `none` (`suite.models.arch.attention`) at the
    default or at `none`; another value, or recompute=selective, is refused (`suite.config.validate`)."""
    compile: bool = False
    tf32: bool = False
    """fp32 matrix multiplies and convolutions on TF32 tensor cores (`torch.backends.cuda.matmul` and
    `torch.backends.cudnn` `allow_tf32`): off by default, as PyTorch has it for matmuls (its cuDNN
    default is on; the suite sets both from this one switch), on with `+lunch=on` (the seed's free
    lunch). It applies where the GPU has TF32 (`hardware.tf32`; `Trial.tf32`); elsewhere it changes
    nothing and is no part of the id. It changes only what runs in fp32 (an fp32 recipe, fp32 parts)."""
    optimizer: Optimizer = "engine"
    """AdamW as the engine's own: DeepSpeed's FusedAdam (its CPU Adam under offload), torch's fused
    AdamW under FSDP2; or torch_fused: torch's fused AdamW handed to DeepSpeed, where DeepSpeed's
    JIT-compiled ops cannot be built (the GPU check falls back to it). Not in the id at its default."""
    precision: Literal["recipe", "fp32", "bf16", "fp16"] = "recipe"
    """recipe (the model's own; fp32 on CPU, see `Trial.precision`), or an override: fp32, bf16, fp16."""


@dataclass
class MeasureConfig:
    """How a trial is timed."""

    warmup_steps: int = 2
    timed_steps: int = 5
    max_micro_steps: int = 4
    """Micro-steps run per timed step; a larger accumulation is extrapolated from the
    measured micro, boundary and optimizer times (`suite.metrics.step_metrics`)."""
    timeout_s: float = 600.0
    seed: int = 0
    rerun: bool = False
    """Measure again even if the store holds this trial."""
    repeats: Any = 1
    """Runs of the trial, each in fresh worker processes: a number, or `auto`: runs until the
    95% interval of the median is at most `repeat_width` of the median wide (so at least 6 runs,
    the fewest that give 95%), at most `max_repeats`. Runs already stored count: asking for more
    adds runs to the trial's record. How it is measured, not what: not part of the trial id."""
    repeat_width: float = 0.05
    """With repeats=auto: the widest interval of the median accepted, as a fraction of the median."""
    max_repeats: int = 10
    """With repeats=auto: the most runs of one trial (MLPerf Training scores 3 to 10 runs)."""
    param_stats: bool = False
    """Also record each parameter's element count, mean and std as built, gathered where sharded
    (`param_stats` in the metrics; the GPU check compares ZeRO-3's and FSDP2's builds with
    ZeRO-0's). What is recorded beside the measurement, not what is measured: not in the id."""


@dataclass
class DebugConfig:
    """Fault injection for tests of the failure paths."""

    fault: Fault = "none"
    """none, hang, kill (SIGKILL itself), nan, or oom (allocate more than the rank's memory: the
    GPU's, or the CPU budget), at the first timed step; overflow: the rank reports an fp16
    overflow (a skipped update) on the first two steps and the first timed one."""
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
    mode: Literal["offline", "online", "disabled"] = "offline"
    """offline (default; `wandb sync` later), online, or disabled."""
    project: str = "suite"
    dir: str = "results"
    """W&B writes its run folders under DIR/wandb/."""


@dataclass
class SearchConfig:
    """The space `suite-search` explores for one (model, hardware); micro-batches are searched."""

    engines: list[str] = field(default_factory=lambda: ["deepspeed", "fsdp2"])
    """Sharding engines: deepspeed takes each of `zero_stages`; fsdp2 both its modes
    (reshard_after_forward false: shard_grad_op; true: full_shard)."""
    zero_stages: list[int] = field(default_factory=lambda: [0, 1, 2, 3])
    offloads: list[str] = field(default_factory=lambda: ["none", "optimizer", "optimizer+params"])
    recomputes: list[str] = field(default_factory=lambda: ["none", "full"])
    """Recomputation modes tried (none, full, selective)."""
    attentions: list[str] = field(default_factory=list)
    """Empty: keep methods.attention."""
    compiles: list[bool] = field(default_factory=list)
    """Empty: keep methods.compile."""
    fixed: bool = False
    """`suite-predict` only: predict the one configuration `methods.*` name (every setting as
    given, micro-batch included) rather than rank every configuration of these axes."""
    fit_margin: float = 0.10
    """A combination is set aside unmeasured when the predictor puts its smallest micro-batch
    above the device memory by more than this fraction (room for the prediction's error)."""
    margin: float = 0.03
    """Stop when no remaining candidate is predicted to beat the best one's median step time
    (of `min_runs` runs) by this fraction (after `pred_error`)."""
    pred_error: float | None = None
    """How far the predictor may be off for a combination not yet measured, as a fraction of its
    step time: it is still measured while its calibrated prediction less this fraction beats the
    best one's interval by `margin`. None: the median step-time error published for this kind
    of device (results/accuracy/<device>.json), 0.10 where none is published."""
    budget_s: float = 0.0
    """Stop after this many seconds of trials (0: no limit)."""
    min_runs: int = 3
    """Runs a contender gets before intervals are compared: the best one before the stop rule
    uses its interval, and every configuration that may tie it (3 runs: [min, max] covers the
    median with 75%)."""
    max_runs: int = 6
    """Contenders are re-measured until their intervals separate or each has this many runs
    (6: [min, max] covers the median with 96.9%)."""
    refine_ties: bool = False
    """Re-measure, up to `max_runs`, ties that cannot separate by then (their intervals are bound
    to overlap: below 9 runs an interval is [min, max], which more runs only widen). That only
    moves the medians, and so which of the tied ones is named the winner. False: such ties are
    reported as they stand."""


@dataclass
class PlanConfig:
    """`suite-plan`: the options weighed to train one model (each GPU type of conf/hardware/ with a
    price, at 1, 2, 4 or 8 per node, bought or rented) and the limits of its answer (analysis/plan.py)."""

    tokens: str = "recipe"
    """What to train on: `recipe` (the model's: global_batch x seq_len x train_steps), `chinchilla`
    (20 tokens per parameter, Hoffmann et al. 2022, "Training Compute-Optimal Large Language
    Models"), or a number of tokens (3e11); an image model counts images."""
    max_days: float | None = None
    """The deadline: days to train, at most; null for none."""
    max_usd: float | None = None
    """The budget: dollars up front, at most (renting: the bill; buying: the hardware and the
    run's electricity); null for none."""
    buy: bool | None = None
    """true: weigh buying only (conf/prices/owned.yaml); false: renting only (cloud.yaml); null: both."""
    gpus: list[str] = field(default_factory=list)
    """GPU types (conf/hardware/) to weigh; empty: every one with a price."""
    max_nodes: int = 1
    """Nodes weighed, from 1 up to this many, each of 1, 2, 4 or 8 GPUs."""
    usd_per_kwh: float = 0.13
    """Electricity bought for owned hardware, $/kWh: about the 2023 US commercial average (EIA,
    Electric Power Annual 2023, average revenue per kWh by sector and state)."""
    pue: float = 1.58
    """Power usage effectiveness, the facility's power over the IT's: 1.58, the industry average of
    2023 (Uptime Institute Global Data Center Survey 2023)."""
    grid_g_per_kwh: float = 480.0
    """Grams CO2e per kWh: the world's electricity generation in 2023 (Ember, Global Electricity
    Review 2024: 480 gCO2/kWh, lifecycle emissions)."""
    out: str = "reports/plan"
    """Where `suite-plan` writes its table (CSV, Markdown, LaTeX) and its figure."""


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
    plan: PlanConfig = field(default_factory=PlanConfig)


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
    def from_json(cls, d: dict[str, Any]) -> Trial:
        model = dict(d["model"])
        model["recipe"] = RecipeConfig(**model["recipe"])
        hardware = dict(d["hardware"])
        hardware["host"] = HostConfig(**hardware.get("host") or {})
        methods = MethodsConfig(**d["methods"])
        if methods.engine == "fsdp2" and methods.reshard_after_forward is None:
            # The engine's default, written out once so that both spellings are one trial (one id).
            methods.reshard_after_forward = True
        return cls(
            model=ModelConfig(**model),
            hardware=HardwareConfig(**hardware),
            methods=methods,
            measure=MeasureConfig(**d["measure"]),
            debug=DebugConfig(**d.get("debug", {})),
            nodes=d.get("nodes", 1),
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def id(self) -> str:
        # asdict's deep copy of the model's config, one level down, is not needed: only the
        # top-level groups lose keys here (`dataclass_fields` spells out the rest as asdict would).
        d = dataclass_fields(self)
        for group in ("measure", "hardware", "methods"):
            d[group] = dataclass_fields(d[group])
        for how in ("rerun", "timeout_s", "repeats", "repeat_width", "max_repeats", "param_stats"):
            d["measure"].pop(how)  # how to run it, not what is measured
        for k in PREDICTION_ONLY:  # describe the hardware to the predictor; ids predate them
            d["hardware"].pop(k)
        if d["nodes"] == 1:
            d.pop("nodes")  # one-node ids predate the field and stay as they were
        me = d["methods"]
        if me["optimizer"] == "engine":
            del me["optimizer"]  # ids predate the setting and stay as they were
        if not self.tf32:
            del me["tf32"]  # ids predate the setting; where TF32 does not run, it changes nothing
        if not me["reduce_every_micro_step"]:
            del me["reduce_every_micro_step"]  # ids predate the field and stay as they were
        if me["offload_device"] == "cpu":
            del me["offload_device"]  # ids predate the NVMe tier and stay as they were
        del me["nvme_path"]  # where the swap files go, not what is measured
        if me["engine"] == "deepspeed" and me["reshard_after_forward"] is None:
            del me["engine"], me["reshard_after_forward"]  # DeepSpeed ids predate the engine and stay as they were
        blob = json.dumps(d, sort_keys=True, separators=(",", ":"), default=dataclass_fields)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    # Derived quantities; one owner each.
    @property
    def precision(self) -> str:
        """The precision that runs: methods.precision; for `recipe`, the recipe's on a GPU and
        fp32 on a CPU, where 16-bit recipes are GPU recipes (DeepSpeed trains no fp16 there)
        and fp32 is the precision every CPU trains. The record's metrics repeat it."""
        p = self.methods.precision
        if p != "recipe":
            return p
        return "fp32" if self.hardware.device == "cpu" else self.model.recipe.precision

    @property
    def tf32(self) -> bool:
        """Whether fp32 matmuls and convolutions run on TF32 tensor cores: `methods.tf32` where the
        GPU has them (`hardware.tf32`), never elsewhere."""
        return bool(self.methods.tf32 and self.hardware.tf32 and self.hardware.device == "cuda")

    @property
    def unit(self) -> str:
        """What throughput counts for the model's task (TASKS): token or image."""
        return self.model.unit

    @property
    def devices(self) -> int:
        """Devices (ranks) over all nodes: the recipe's global batch is split over them."""
        return self.nodes * self.hardware.count

    @property
    def per_device_batch(self) -> int:
        """Samples per device per step; 0 for a device count below 1 (invalid, see `problems`)."""
        return self.model.recipe.global_batch // self.devices if self.devices > 0 else 0

    @property
    def gas(self) -> int:
        """Gradient accumulation steps that keep the recipe's global batch (0 for a micro-batch below 1)."""
        return self.per_device_batch // self.methods.micro_batch if self.methods.micro_batch > 0 else 0

    @property
    def max_runs(self) -> int:
        """The most runs this trial's measurement may take (its repeats, or the cap of auto)."""
        r = self.measure.repeats
        return self.measure.max_repeats if r == "auto" else r

    @property
    def gas_measured(self) -> int:
        return min(self.gas, self.measure.max_micro_steps)

    @property
    def tokens_per_sample(self) -> int:
        """Units of throughput per sample (see `unit`): seq_len tokens of text, or 1 image."""
        return self.model.recipe.seq_len if self.unit == "token" else 1
