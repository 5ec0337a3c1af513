"""What validation, labels and the metrics need to know of a model, read from its config and
its model class without building it: shape facts (`Shape`), the attention implementations it
offers, the blocks transformers keeps whole (`Arch`), and the attention a trial runs.

Reading them imports the model's modeling code from transformers (seconds), so they are cached
per model config in memory and on disk (`paths.cache_dir()`/archs). This module imports no
torch: a report or the leaderboard that labels a trial reads the cache without it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from suite import paths
from suite.config.schema import settings_json
from suite.files import write_json
from suite.models.config import ModelError, fields, hf_config, int_field, serialized, task_class

if TYPE_CHECKING:  # annotations only: this module reads the settings it is given
    from suite.config.schema import ModelConfig, Trial


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
    import transformers  # deferred: transformers imports torch

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


@serialized
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
    return settings_json(m)


def _arch_path(m: ModelConfig, key: str) -> Path | None:
    """Where `m`'s facts are cached: named by its in-memory `key` (`_arch_key`), its resolved config (a
    local file's fields included), transformers' version and ARCH_FORMAT; None where the config
    cannot be read."""
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
