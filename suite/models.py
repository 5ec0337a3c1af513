"""Any transformers architecture: its config, the model, synthetic batches, FLOPs and validation.

A model is data (`ModelConfig`): a transformers `model_type` with its config fields (or a local
`config.json`) and a task. One generic path serves every architecture:

- the config: `AutoConfig.for_model(model_type, **fields)`; a local config.json is read as
  JSON, never through the Hub (suite/__init__.py turns the Hub off for every suite process);
- the model: the task's `AutoModelFor...` class, `_from_config`, random weights;
- the batch, the labels and the unit of throughput follow the task (`ModelConfig.unit`), not the family;
- shape facts (`shape`), supported attention (`attentions`), blocks for recomputation and the
  limits a trial must respect are read from the config and the model class, without building.

FLOPs are counted with `torch.utils.flop_counter` on the model built on the meta device, so
counting costs no memory and no compute. Optional fused kernels that transformers picks up
when a package is installed (Mamba's `mamba-ssm`, `causal-conv1d`) are reported by
`kernel_path`, so a trial says which implementation it timed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import inspect
import json
import math
import sys
import threading
import types
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.flop_counter import FlopCounterMode, conv_flop_count

from suite.files import write_json

if TYPE_CHECKING:  # annotations only: models reads the settings it is given
    from suite.config.schema import ModelConfig, Trial

AUTO_CLASSES = {
    "causal-lm": "AutoModelForCausalLM",
    "masked-lm": "AutoModelForMaskedLM",
    "image-classification": "AutoModelForImageClassification",
}
EXTRAPOLATION_STEP = 4  # short lengths counted for a model with a per-position reference loop
MASKED_FRACTION = 0.15  # masked LM: the share of positions predicted (BERT's and RoBERTa's 15%)
# Keys of a saved config.json that describe the file, not the architecture; the trial's
# precision, not the file's dtype, decides the weights' dtype.
FILE_METADATA = ("transformers_version", "architectures", "_name_or_path", "auto_map", "torch_dtype", "dtype")
# Config fields the suite sets from the trial; a model config may not set them.
SUITE_FIELDS = {
    "dtype": "methods.precision",
    "torch_dtype": "methods.precision",
    "attn_implementation": "methods.attention",
    "_attn_implementation": "methods.attention",
    "use_cache": "the suite (training keeps no key/value cache)",
}


class ModelError(ValueError):
    """A model config that cannot be resolved; the message names the field and the value."""


_TRANSFORMERS = threading.RLock()
"""Held while transformers resolves a name of its lazy modules: a second thread resolving one at
the same time can find a module half made (AttributeError: module 'transformers' has no
attribute 'AutoModel'; seen when a test's thread labelled a trial while another built one)."""


def _serialized(fn):
    """`fn`, run by one thread at a time (`_TRANSFORMERS`)."""

    @functools.wraps(fn)
    def one_at_a_time(*args, **kwargs):
        with _TRANSFORMERS:
            return fn(*args, **kwargs)

    return one_at_a_time


def read_config_file(path: str) -> dict[str, Any]:
    """The fields of a local config.json (or of DIR/config.json); never a Hub download."""
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise ModelError(
            f"model.hf_config={path!r} is not a local file or a folder with a config.json "
            "(configs are read from local files only, never from the Hugging Face Hub)"
        )
    try:
        d = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelError(f"model.hf_config={path!r} is not readable JSON ({e})") from e
    if not isinstance(d, dict) or not isinstance(d.get("model_type"), str):
        raise ModelError(f"model.hf_config={path!r} has no model_type; a transformers config.json names one")
    return {k: v for k, v in d.items() if k not in FILE_METADATA}


def fields(m: ModelConfig) -> tuple[str, dict[str, Any]]:
    """The model type and the config fields: the local file's, then `m.config` over them."""
    if not m.hf_config:
        return m.model_type, dict(m.config)
    file = read_config_file(m.hf_config)
    file_type = file.pop("model_type")
    if m.model_type and m.model_type != file_type:
        raise ModelError(f"model.model_type={m.model_type!r} but model.hf_config={m.hf_config!r} is {file_type!r}")
    return file_type, {**file, **m.config}


def inline(m: ModelConfig) -> ModelConfig:
    """`m` with its local config.json's fields copied into `config`, so a trial's record stands
    alone and its id changes when the file does. Unchanged if the file cannot be read (the
    trial's problems then say why)."""
    if not m.hf_config:
        return m
    try:
        model_type, merged = fields(m)
    except ModelError:
        return m
    path = str(Path(m.hf_config).expanduser().resolve())
    source = m.source or f"config.json from {path}"
    return dataclasses.replace(m, model_type=model_type, hf_config="", config=merged, source=source)


@_serialized
def config_class(model_type: str):
    from transformers import CONFIG_MAPPING

    if not model_type:
        raise ModelError(
            "model.model_type is empty: name a transformers model type (gpt_neox, llama, mamba, convnext, ...) "
            "or a local config.json with model.hf_config"
        )
    if model_type not in CONFIG_MAPPING:
        near = difflib.get_close_matches(model_type, list(CONFIG_MAPPING.keys()), n=3)
        hint = f"; did you mean {', '.join(near)}?" if near else " (see transformers.CONFIG_MAPPING)"
        raise ModelError(f"model.model_type={model_type!r} is not a model type of this transformers{hint}")
    return CONFIG_MAPPING[model_type]


@_serialized
def hf_config(m: ModelConfig):
    """The transformers config of `m`: random-init training settings (no key/value cache) and,
    for image tasks, the recipe's image size where the architecture has one."""
    from transformers import AutoConfig

    model_type, f = fields(m)
    config_class(model_type)
    try:
        cfg = AutoConfig.for_model(model_type, **f)
    except Exception as e:  # noqa: BLE001 - transformers validates fields with many exception types
        why = str(e).strip().splitlines()[-1].strip() if str(e).strip() else type(e).__name__  # the validator's words
        raise ModelError(f"model.config is not a valid {model_type} config: {why}") from e
    if hasattr(cfg, "use_cache"):
        # Training never reuses keys and values: a cache only costs memory (and Mamba's fused
        # training path runs only without one).
        cfg.use_cache = False
    if m.unit == "image" and hasattr(cfg, "image_size"):
        cfg.image_size = m.recipe.image_size
    return cfg


@_serialized
def task_class(m: ModelConfig, cfg=None):
    """The task's AutoModelFor... class for `m`'s config (a class, nothing built)."""
    import transformers

    if m.task not in AUTO_CLASSES:
        raise ModelError(f"model.task={m.task!r} is not allowed; choose one of {', '.join(AUTO_CLASSES)}")
    cfg = cfg if cfg is not None else hf_config(m)
    mapping = getattr(transformers, AUTO_CLASSES[m.task])._model_mapping
    try:
        return mapping[type(cfg)]
    except KeyError:
        has = [task for task, auto in AUTO_CLASSES.items() if type(cfg) in getattr(transformers, auto)._model_mapping]
        raise ModelError(
            f"model_type {cfg.model_type!r} has no {m.task} model in transformers ({AUTO_CLASSES[m.task]}); "
            f"its tasks here: {', '.join(has) or 'none of ' + ', '.join(AUTO_CLASSES)}"
        ) from None


@dataclass(frozen=True)
class Shape:
    """Shape facts read from a transformers config by transformers' common names (attribute
    maps included, so GPT-2's n_embd is `hidden`); 0 where a model has none."""

    hidden: int
    """hidden_size; where the width changes by stage (ConvNeXt's hidden_sizes), the widest."""
    layers: int
    """Blocks: the sum of `depths` where stages have depths (ConvNeXt), else num_hidden_layers."""
    heads: int
    """num_attention_heads; 0 without attention."""
    vocab: int
    """vocab_size; 0 for image models."""
    max_positions: int
    """max_position_embeddings; 0 where the sequence length is not bounded by positions (Mamba)."""
    patch_size: int
    """Image models: the patch (ViT) or stem stride (ConvNeXt); 0 for text models."""
    num_labels: int
    num_channels: int


def int_field(cfg, name: str) -> int:
    v = getattr(cfg, name, None)
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def _shape(cfg) -> Shape:
    widths = getattr(cfg, "hidden_sizes", None) or []
    depths = getattr(cfg, "depths", None) or []
    return Shape(
        hidden=int_field(cfg, "hidden_size") or max(widths, default=0),
        layers=sum(depths) if depths else int_field(cfg, "num_hidden_layers"),
        heads=int_field(cfg, "num_attention_heads"),
        vocab=int_field(cfg, "vocab_size"),
        max_positions=int_field(cfg, "max_position_embeddings"),
        patch_size=int_field(cfg, "patch_size"),
        num_labels=int_field(cfg, "num_labels"),
        num_channels=int_field(cfg, "num_channels") or 3,
    )


@dataclass(frozen=True)
class Arch:
    """What validation and labels need to know of a model, read without building it."""

    shape: Shape
    model_class: str
    attentions: tuple[str, ...]
    """Attention implementations the model class offers; () for a model without attention."""
    block_names: tuple[str, ...]
    """Classes transformers keeps whole (`_no_split_modules`) of the model and its base model."""
    head_dim_given: bool
    gradient_checkpointing: bool
    """Whether transformers' own gradient checkpointing (the Trainer's) supports the model class."""


_archs: dict[str, Arch | str] = {}


def _read_arch(m: ModelConfig) -> Arch:
    """Called under `_TRANSFORMERS` (`_arch_uncached`)."""
    import transformers

    cfg = hf_config(m)
    cls = task_class(m, cfg)
    offered = (("eager", True), ("sdpa", cls._supports_sdpa), ("flash_attention_2", cls._supports_flash_attn))
    supported = tuple(name for name, flag in offered if flag)
    s = _shape(cfg)
    try:
        base = transformers.AutoModel._model_mapping[type(cfg)]
    except KeyError:
        base = None
    names = set(cls._no_split_modules or []) | set(getattr(base, "_no_split_modules", None) or [])
    return Arch(
        shape=s,
        model_class=cls.__name__,
        attentions=() if supported == ("eager",) and not s.heads else supported,
        block_names=tuple(sorted(names)),
        head_dim_given=getattr(cfg, "head_dim", None) is not None,
        gradient_checkpointing=bool(cls.supports_gradient_checkpointing),
    )


def _fields(obj):
    """A dataclass as its fields, without asdict's deep copy (a key made for every record loaded)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    return str(obj)


ARCH_FORMAT = 1
"""Bump when `_read_arch` reads other facts: cached ones of another format are not read."""


def arch(m: ModelConfig) -> Arch:
    """`m`'s architecture facts; raises ModelError if it has none. Cached per model config in
    memory and on disk (`paths.cache_dir()`/archs): reading them imports the model's modeling
    code from transformers, seconds in every command that validates or labels a trial."""
    key = _arch_key(m)
    a = _archs.get(key) or _arch_uncached(m, key)
    if isinstance(a, str):
        raise ModelError(a)
    return a


@_serialized
def _arch_uncached(m: ModelConfig, key: str) -> Arch | str:
    """`m`'s facts from the disk cache or read afresh, kept under `key` once whole (a thread that
    met a half-filled entry took None for the facts); the error's message where it has none."""
    if key in _archs:
        return _archs[key]
    path = _arch_path(m, key)
    a: Arch | str | None = _load_arch(path) if path else None
    if a is None:
        try:
            a = _read_arch(m)
        except ModelError as e:
            a = str(e)  # not kept on disk: the next command reads it again
        else:
            if path:
                _save_arch(path, a)
    _archs[key] = a
    return a


def _arch_key(m: ModelConfig) -> str:
    return json.dumps(m, sort_keys=True, default=_fields)


def _arch_path(m: ModelConfig, key: str) -> Path | None:
    """Where `m`'s facts are cached: named by its in-memory `key` (`_arch_key`), its resolved config (a
    local file's fields included), transformers' version and ARCH_FORMAT; None where the config
    cannot be read."""
    import hashlib
    from importlib import metadata

    from suite import paths

    try:
        resolved = fields(m)
    except ModelError:
        return None
    blob = json.dumps(
        [key, resolved, metadata.version("transformers"), ARCH_FORMAT],
        sort_keys=True,
        default=str,
    )
    return paths.cache_dir() / "archs" / f"{hashlib.sha256(blob.encode()).hexdigest()[:20]}.json"


def _load_arch(path: Path) -> Arch | None:
    try:
        d = json.loads(path.read_text())
        return Arch(
            **{
                **d,
                "shape": Shape(**d["shape"]),
                "attentions": tuple(d["attentions"]),
                "block_names": tuple(d["block_names"]),
            }
        )
    except (OSError, ValueError, TypeError, KeyError):  # absent, or written by another format: read again
        return None


def _save_arch(path: Path, a: Arch) -> None:
    try:
        write_json(path, dataclasses.asdict(a))
    except OSError:  # a cache that cannot be written costs time, not correctness
        pass


def shape(m: ModelConfig) -> Shape:
    """Shape facts of `m` for whoever needs a size (bucket sizes, estimates), without a build."""
    return arch(m).shape


def attentions(m: ModelConfig) -> tuple[str, ...] | None:
    """The attention implementations `m` offers: () without attention, None if `m` is invalid."""
    try:
        return arch(m).attentions
    except ModelError:
        return None


def attention(t: Trial) -> str:
    """The attention that runs: methods.attention, or `none` for a model without attention
    (Mamba, ConvNeXt), which has no implementation to choose. The record's metrics repeat it."""
    return "none" if attentions(t.model) == () else t.methods.attention


def block_class(model: torch.nn.Module) -> type[torch.nn.Module] | None:
    """The model's repeated block: of the classes transformers keeps whole when it splits a
    model over devices (`_no_split_modules`), the one with the most instances; of equals, the
    outermost. Found from the model's own structure, never from a per-architecture list."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    counts: dict[type, int] = {}
    depth: dict[type, int] = {}
    for name, module in model.named_modules():
        cls = type(module)
        if cls.__name__ in names:
            counts[cls] = counts.get(cls, 0) + 1
            depth.setdefault(cls, name.count("."))
    if not counts:
        return None
    return max(counts, key=lambda c: (counts[c], -depth[c]))


def blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's blocks (see `block_class`) in module order; empty if it has none."""
    cls = block_class(model)
    return [m for m in model.modules() if cls is not None and type(m) is cls]


SAVED_BY_SELECTIVE = (
    "aten.mm",
    "aten.addmm",
    "aten.bmm",
    "aten.baddbmm",
    "aten._scaled_dot_product_flash_attention",
    "aten._scaled_dot_product_efficient_attention",
    "aten._scaled_dot_product_cudnn_attention",
    "aten._scaled_dot_product_flash_attention_for_cpu",
    "aten._flash_attention_forward",
)
"""What selective recomputation keeps of a block's forward: the outputs of its matrix multiplies
and fused attention (expensive to recompute); norms, activations, dropout and the other cheap
operators are recomputed in backward (Korthikanti et al. 2022; torchtitan's "op" policy saves
matmuls and attention alike)."""


def _selective_policy(ctx, func, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy

    name = str(func.overloadpacket)
    name = name if name.startswith("aten.") else f"aten.{name}"
    return CheckpointPolicy.MUST_SAVE if name in SAVED_BY_SELECTIVE else CheckpointPolicy.PREFER_RECOMPUTE


def _selective_contexts():
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(_selective_policy)


def apply_recompute(model: torch.nn.Module, mode: str = "full") -> None:
    """Activation recomputation of every block through PyTorch's non-reentrant
    `torch.utils.checkpoint`: `full` keeps only each block's input for the backward pass;
    `selective` also keeps what `SAVED_BY_SELECTIVE` names (PyTorch's selective activation
    checkpointing, `create_selective_checkpoint_contexts`) and recomputes the rest."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )

    cls = block_class(model)
    if cls is None:
        raise ValueError(f"{type(model).__name__} has no repeated block to recompute")
    extra = {"context_fn": _selective_contexts} if mode == "selective" else {}
    apply_activation_checkpointing(
        model,
        checkpoint_wrapper_fn=lambda m: checkpoint_wrapper(m, checkpoint_impl=CheckpointImpl.NO_REENTRANT, **extra),
        check_fn=lambda m: type(m) is cls,
    )


def build(m: ModelConfig, attention: str, recompute: str, dtype: torch.dtype | None = None) -> torch.nn.Module:
    """The model with random weights on the current default device, in training mode.

    `attention` is the implementation to run; a model without attention takes none, whatever
    is asked (`attention` records `none` for it). `dtype` (default: torch's default,
    fp32) is the dtype its weights are created in, so a 16-bit trial never holds an fp32 copy
    of the model; buffers that transformers keeps in fp32 (rotary frequencies) stay fp32.
    """
    cfg = hf_config(m)
    kwargs: dict[str, Any] = {}
    if attentions(m):
        kwargs["attn_implementation"] = attention
    if dtype is not None:
        kwargs["dtype"] = dtype
    model = task_class(m, cfg)._from_config(cfg, **kwargs)
    if recompute != "none":
        apply_recompute(model, recompute)
    return model.train()


def batch(m: ModelConfig, micro_batch: int, gen: torch.Generator, device) -> dict[str, torch.Tensor]:
    """One synthetic micro-batch of the recipe's shape for the model's task, drawn from `gen` on the CPU.

    causal-lm: random tokens, labelled by themselves (the model shifts them);
    masked-lm: random tokens, MASKED_FRACTION of the positions labelled, the rest ignored (-100);
    image-classification: Gaussian pixels and a random class per image.
    """
    b, r, s = micro_batch, m.recipe, shape(m)
    if m.unit == "image":
        x = torch.randn(b, s.num_channels, r.image_size, r.image_size, generator=gen)
        y = torch.randint(0, s.num_labels, (b,), generator=gen)
        return {"pixel_values": x.to(device), "labels": y.to(device)}
    ids = torch.randint(0, s.vocab, (b, r.seq_len), generator=gen)
    labels = ids
    if m.task == "masked-lm":
        masked = torch.rand(b, r.seq_len, generator=gen) < MASKED_FRACTION
        labels = torch.where(masked, ids, torch.full_like(ids, -100))
    return {"input_ids": ids.to(device), "labels": labels.to(device)}


@dataclass(frozen=True)
class Fallback:
    """A function of a modeling module that transformers binds to an optional package's kernel
    when the package is installed, else to its PyTorch reference
    (`use_kernel_func_from_hub_with_fallback`: its closure holds `package` and
    `is_new_implementation`). `bound` is what the module holds under `name`: that function, or
    (transformers >= 5.2x) a module object whose `forward` calls it."""

    module: types.ModuleType
    name: str
    bound: Any
    reference: Any
    """The PyTorch reference implementation (the decorated function itself)."""
    package: str
    fast: bool


def _with_fallback(obj: Any) -> Any:
    """The `use_kernel_func_from_hub_with_fallback` wrapper behind `obj`, or None."""
    if isinstance(obj, torch.nn.Module):  # a function module: its class's forward closes over the function
        forward = getattr(type(obj), "forward", None)
        obj = inspect.getclosurevars(forward).nonlocals.get("func") if inspect.isfunction(forward) else None
    if not inspect.isfunction(obj) or not inspect.isfunction(getattr(obj, "__wrapped__", None)):
        return None
    free = inspect.getclosurevars(obj).nonlocals
    return obj if "is_new_implementation" in free and "package" in free else None


def _fallback_kernels(model: torch.nn.Module) -> list[Fallback]:
    """Every `Fallback` of the modeling modules the model's classes come from."""
    found = []
    names = sorted({type(mod).__module__ for mod in model.modules()})
    for module in filter(None, (sys.modules.get(n) for n in names)):
        for name, obj in list(vars(module).items()):
            # Functions and module objects only: attribute lookups on transformers' lazy modules import them.
            if not (inspect.isfunction(obj) or isinstance(obj, torch.nn.Module)):
                continue
            fn = _with_fallback(obj)
            if fn is not None:
                free = inspect.getclosurevars(fn).nonlocals
                fast = bool(free["is_new_implementation"])
                found.append(Fallback(module, name, obj, fn.__wrapped__, str(free["package"]), fast))
    return found


def kernel_path(model: torch.nn.Module) -> str | None:
    """Which implementation the model's optional fused kernels run: "fast (mamba-ssm, ...)" when
    every package transformers looks for is installed, "slow (PyTorch reference; ... not
    installed)" when none is, "mixed (...)" otherwise; None for a model without such kernels."""
    found = _fallback_kernels(model)
    if not found:
        return None
    fast = sorted({f.package.replace("_", "-") for f in found if f.fast})
    slow = sorted({f.package.replace("_", "-") for f in found if not f.fast})
    if not slow:
        return f"fast ({', '.join(fast)})"
    if not fast:
        return f"slow (PyTorch reference; {', '.join(slow)} not installed)"
    return f"mixed (fast: {', '.join(fast)}; slow: {', '.join(slow)} not installed)"


@contextlib.contextmanager
def reference_kernels(model: torch.nn.Module):
    """Run the model's optional fused kernels as their PyTorch references for a while: a custom
    kernel neither runs on the meta device nor shows its FLOPs to FlopCounterMode."""
    swapped = [f for f in _fallback_kernels(model) if f.fast]
    for f in swapped:
        setattr(f.module, f.name, f.reference)
    try:
        yield
    finally:
        for f in swapped:
            setattr(f.module, f.name, f.bound)


def _conv_backward_flop(grad_out_shape, x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
    """A convolution's backward FLOPs: the input gradient as PyTorch counts it, and the weight
    gradient counted per group. torch's formula counts a grouped convolution's weight gradient
    as if dense, `groups` times too many FLOPs (a depthwise one's `channels` times: ConvNeXt's
    7x7 and Mamba's 1D convolutions). Each weight element sums over the batch and every output
    position (every input position of a transposed one), one multiply-add each."""
    transposed, output_mask = args[4], args[7]
    flops = 0
    if output_mask[0]:
        flops += conv_flop_count(grad_out_shape, w_shape, out_shape[0], not transposed)
    if output_mask[1]:
        positions = math.prod((x_shape if transposed else grad_out_shape)[2:])
        flops += 2 * math.prod(w_shape) * x_shape[0] * positions
    return flops


def flop_counter() -> FlopCounterMode:
    """PyTorch's FlopCounterMode with grouped convolutions' backward counted right."""
    return FlopCounterMode(display=False, custom_mapping={torch.ops.aten.convolution_backward: _conv_backward_flop})


def _count(model: torch.nn.Module, m: ModelConfig, micro_batch: int) -> int:
    """FLOPs of one forward + backward of the built (meta) model on a micro-batch of `m`'s recipe."""
    gen = torch.Generator().manual_seed(0)
    inputs = {k: v.to("meta") for k, v in batch(m, micro_batch, gen, "cpu").items()}
    if attentions(m) and m.unit == "token":
        # An explicit 4D mask: causal-mask creation reads tensor values, which meta tensors
        # lack. The attention FLOPs counted are the same.
        s = m.recipe.seq_len
        inputs["attention_mask"] = torch.zeros(micro_batch, 1, s, s, device="meta")
    with reference_kernels(model), flop_counter() as counter:
        model(**inputs).loss.backward()
    return counter.get_total_flops()


def _at_length(m: ModelConfig, seq_len: int) -> ModelConfig:
    return dataclasses.replace(m, recipe=dataclasses.replace(m.recipe, seq_len=seq_len))


def _extrapolated(model: torch.nn.Module, m: ModelConfig, micro_batch: int) -> int | None:
    """FLOPs at the recipe's length from four short lengths, or None where that is not exact.

    A PyTorch reference of a fused sequence kernel (Mamba's selective scan) loops over every
    position, which on the meta device takes hours at a recipe's length. Counted FLOPs are a
    polynomial of degree <= 2 in the length (linear layers, convolutions and scans grow
    linearly, attention quadratically): three short lengths fix it, a fourth checks it exactly,
    and it is evaluated at the recipe's length. Lengths are multiples of the config's
    `chunk_size` where it has one, so a chunked scan pads alike at every length.
    """
    chunk = int_field(hf_config(m), "chunk_size")
    lengths = [k * (chunk or EXTRAPOLATION_STEP) for k in (1, 2, 3, 4)]
    if m.recipe.seq_len <= lengths[-1]:
        return None
    counts = [_count(model, _at_length(m, n), micro_batch) for n in lengths]

    def fit(x: int) -> Fraction:  # Lagrange polynomial through the first three points
        total = Fraction(0)
        for i in range(3):
            term = Fraction(counts[i])
            for j in range(3):
                if j != i:
                    term *= Fraction(x - lengths[j], lengths[i] - lengths[j])
            total += term
        return total

    if fit(lengths[3]) != counts[3]:
        return None
    return round(fit(m.recipe.seq_len))


def count_flops(m: ModelConfig, attention: str, recompute: str, micro_batch: int = 1) -> tuple[float, int]:
    """(FLOPs of forward + backward per sample, parameter count), on the meta device.

    With recompute="full" the recomputed forward is counted too (hardware FLOPs). Fused
    kernels count as their PyTorch reference (`reference_kernels`); a model with such kernels
    is counted at short lengths and extrapolated exactly (`_extrapolated`).
    """
    with torch.device("meta"):
        model = build(m, "sdpa" if attention == "flash_attention_2" else attention, recompute)
    n_params = sum(p.numel() for p in model.parameters())
    flops = None
    if m.unit == "token" and _fallback_kernels(model):
        flops = _extrapolated(model, m, micro_batch)
    if flops is None:
        flops = _count(model, m, micro_batch)
    return flops / micro_batch, n_params
