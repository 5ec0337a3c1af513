"""A model's transformers config: a local config.json's fields (read as JSON, never through the
Hub: suite/__init__.py turns the Hub off for every suite process), the fields the suite sets
itself, `AutoConfig.for_model(model_type, **fields)`, and the task's AutoModelFor... class.

transformers is imported where it is used (it imports torch), and its lazy modules are resolved
by one thread at a time (`serialized`).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: this module reads the settings it is given
    from suite.config.schema import ModelConfig

AUTO_CLASSES = {
    "causal-lm": "AutoModelForCausalLM",
    "masked-lm": "AutoModelForMaskedLM",
    "image-classification": "AutoModelForImageClassification",
    # An encoder's fine-tuning heads (BERT on SQuAD, on GLUE): the compute of pretraining less the
    # language-model head, as published fine-tuning runs measure it.
    "question-answering": "AutoModelForQuestionAnswering",
    "sequence-classification": "AutoModelForSequenceClassification",
}
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


def serialized(fn):
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


@serialized
def config_class(model_type: str):
    from transformers import CONFIG_MAPPING  # deferred: transformers imports torch

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


@serialized
def hf_config(m: ModelConfig):
    """The transformers config of `m`: random-init training settings (no key/value cache) and,
    for image tasks, the recipe's image size where the architecture has one."""
    from transformers import AutoConfig  # deferred: transformers imports torch

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


@serialized
def task_class(m: ModelConfig, cfg=None):
    """The task's AutoModelFor... class for `m`'s config (a class, nothing built)."""
    import transformers  # deferred: transformers imports torch

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


def int_field(cfg, name: str) -> int:
    """An integer field of a transformers config; 0 where it has none (or not an integer)."""
    v = getattr(cfg, name, None)
    return v if isinstance(v, int) and not isinstance(v, bool) else 0
