"""From `conf/` to a `Trial`: the schema registered with Hydra, and one `config` every caller composes through.

    cfg = config(["model=pythia-1b", "hardware=a6000", "hardware.count=4"])   # Hydra's composed config
    t = trial(["model=pythia-1b", "hardware=a6000-x4"])                         # the same, as a Trial

The commands (`cli/`) compose through `hydra.main` with the same registration (`register`) and
the same override rules (`overrides`); `trial_from_cfg` turns any composed config into a Trial.

Hardware is a GPU type with a count, `hardware=a6000 hardware.count=4` (conf/hardware/a6000.yaml
names it `a6000-x4`); the older single-value form `hardware=a6000-x4` is rewritten to it, so a
trial keeps its name and its id either way.

OmegaConf does not know `Literal`: Hydra gets a copy of the schema with each `Literal[...]` field
typed by its values' type (`for_hydra`). A value outside the choices composes, and
`suite.config.validate.problems` names it with the rest, so a sweep records it as `invalid`.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import re
import threading
import typing
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from suite import paths
from suite.config.schema import Config, HardwareConfig, Trial
from suite.models.config import inline

_HYDRA = threading.Lock()
"""Held while composing: Hydra keeps one global state per process (`GlobalHydra`)."""

OLD_HARDWARE = re.compile(r"(?P<gpu>[a-z0-9][a-z0-9.-]*?)-x(?P<count>\d+)")


class OverrideError(ValueError):
    """An override that cannot be read; the message says the form to use."""


@functools.cache
def for_hydra(cls: type) -> type:
    """A copy of a schema dataclass that OmegaConf accepts: Literal fields typed by their values.
    It is an attribute of this module (`Hydra<Name>`), so that pickle (submitit's Slurm jobs
    carry Hydra's state) refers to it by name instead of copying it."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if typing.get_origin(kind) is typing.Literal:
            kind = type(typing.get_args(kind)[0])
        elif dataclasses.is_dataclass(kind):
            kind = for_hydra(kind)
        default = {"default": f.default} if f.default is not dataclasses.MISSING else {}
        if f.default_factory is not dataclasses.MISSING:
            factory = f.default_factory
            default = {"default_factory": for_hydra(factory) if dataclasses.is_dataclass(factory) else factory}
        out.append((f.name, kind, dataclasses.field(**default)))
    name = f"Hydra{cls.__name__}"
    made = dataclasses.make_dataclass(name, out)
    made.__module__, made.__qualname__ = __name__, name
    globals()[name] = made
    return made


HYDRA_SCHEMA = for_hydra(Config)
"""What Hydra's ConfigStore holds as `config_schema` (made on import: an unpickled job finds it)."""


def model_name(hf_config: str) -> str:
    """conf/model/hf.yaml's default name: the config's folder name, or the file's own name
    when it is not config.json ("hf" while no file is given)."""
    p = Path(hf_config)
    if not hf_config:
        return "hf"
    return p.parent.name if p.name == "config.json" and p.parent.name else (p.stem if p.suffix == ".json" else p.name)


_usage = {"program": "suite", "text": ""}


def register(program: str = "", usage: str = "") -> None:
    """Register the schema and the resolvers the YAML uses; a command gives its name and usage
    (its module docstring), which `--help` prints before the config groups."""
    from hydra.core.config_store import ConfigStore

    if program:
        _usage.update(program=program, text=usage.strip())
    ConfigStore.instance().store(name="config_schema", node=HYDRA_SCHEMA)
    OmegaConf.register_new_resolver("model_name", model_name, replace=True)
    OmegaConf.register_new_resolver("suite_program", lambda _job: _usage["program"], replace=True)
    OmegaConf.register_new_resolver("suite_usage", lambda _job: _usage["text"] or _usage["program"], replace=True)


def options(group: str) -> list[str]:
    """The options of a config group as shipped (conf/<group>/*.yaml)."""
    return sorted(p.stem for p in (paths.conf_dir() / group).glob("*.yaml"))


def known(group: str, name: str) -> bool:
    """Whether `name` is an option of the group as shipped; for hardware also `<gpu>-x<n>`."""
    names = options(group)
    old = OLD_HARDWARE.fullmatch(name) if group == "hardware" else None
    return name in names or bool(old and old["gpu"] in names)


def _hardware(value: str, known: list[str]) -> list[str]:
    """`hardware=VALUE` as overrides: an option as it is, an old `<gpu>-x<n>` name (or a sweep of
    them) as the GPU type and its count."""
    values = value.split(",")
    if all(v in known for v in values):
        return [f"hardware={value}"]
    old = [OLD_HARDWARE.fullmatch(v) for v in values]
    if not all(m and m["gpu"] in known for m in old):
        return [f"hardware={value}"]  # Hydra names what is unknown, with the options there are
    gpus = list(dict.fromkeys(m["gpu"] for m in old))
    counts = list(dict.fromkeys(m["count"] for m in old))
    if len(gpus) > 1 and len(counts) > 1:
        raise OverrideError(
            f"hardware={value}: give the GPU types and the counts apart, e.g. "
            f"hardware={','.join(gpus)} hardware.count={','.join(counts)} (every count on every type)"
        )
    return [f"hardware={','.join(gpus)}", f"hardware.count={','.join(counts)}"]


def overrides(args: list[str]) -> list[str]:
    """Command-line overrides with the old hardware names rewritten (see the module docstring)."""
    known = options("hardware")
    out: list[str] = []
    for a in args:
        key, sep, value = a.partition("=")
        out += _hardware(value, known) if sep and key == "hardware" and value else [a]
    return out


def config(args: list[str]):
    """The composed config of these overrides, from the shipped conf/ (Hydra's compose API). A
    process composes the same overrides once while conf/ is unchanged (Hydra takes a sixth of a
    second; a copy, milliseconds); each caller gets its own copy."""
    return copy.deepcopy(_composed(tuple(args), _conf_stamp()))


def _conf_stamp() -> tuple:
    """conf/ as it is now: each YAML file's path and modification time. A cached reading of
    conf/ (a composed config, a hardware profile) holds while this is unchanged."""
    root = paths.conf_dir()
    return (str(root), *((str(p.relative_to(root)), p.stat().st_mtime_ns) for p in sorted(root.rglob("*.yaml"))))


@functools.lru_cache(maxsize=256)
def _composed(args: tuple[str, ...], stamp: tuple):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register()
    with _HYDRA:  # Hydra's state is one per process: threads compose one at a time
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(paths.conf_dir()), version_base="1.3"):
            return hydra_compose(config_name="config", overrides=overrides(list(args)))


def trial_from_cfg(cfg: Any) -> Trial:
    """The trial of a composed config; a local config.json's fields are copied into the
    trial (`suite.models.config.inline`), so its record stands alone."""
    d = OmegaConf.to_container(cfg, resolve=True)
    spec = {k: d[k] for k in ("model", "hardware", "methods", "measure", "debug")}
    t = Trial.from_json({**spec, "nodes": d["cluster"]["nodes"]})
    return dataclasses.replace(t, model=inline(t.model))


def trial(args: list[str]) -> Trial:
    """The trial of these overrides."""
    return trial_from_cfg(config(args))


def with_hardware(cfg: Any, gpu: str, count: int, in_place: bool = False) -> Any:
    """`cfg` with its hardware replaced by conf/hardware/<gpu>.yaml at `count` devices: what
    composing `hardware=<gpu> hardware.count=<count>` gives when no other override or experiment
    touches hardware (tests/test_predict.py checks it against Hydra), in milliseconds instead of
    Hydra's third of a second (`suite-predict hardware=all` predicts 21 types x 4 counts).
    `in_place`: `cfg` is the caller's own copy (`config` gives one), changed rather than copied."""
    node = _hardware_node(gpu, _conf_stamp()).copy()
    node.count = count
    out = cfg if in_place else cfg.copy()
    out.hardware = node
    return out


@functools.lru_cache(maxsize=256)
def _hardware_node(name: str, stamp: tuple):
    """conf/hardware/<name>.yaml merged into the hardware schema, read once per `stamp`
    (callers copy it before changing it)."""
    return OmegaConf.merge(OmegaConf.structured(for_hydra(HardwareConfig)), _hardware_file(name))


def _hardware_file(name: str):
    """conf/hardware/<name>.yaml with its defaults list (other files of the group) merged in."""
    path = paths.conf_dir() / "hardware" / f"{name}.yaml"
    if not path.is_file():
        raise OverrideError(f"hardware={name}: no conf/hardware/{name}.yaml")
    own = OmegaConf.load(path)
    defaults = list(own.pop("defaults", None) or [])
    parts = [
        own if d == "_self_" else _hardware_file(str(d)) for d in defaults + ["_self_"] * ("_self_" not in defaults)
    ]
    return OmegaConf.merge(*parts)


def gpu_profiles() -> dict[str, dict[str, Any]]:
    """Every GPU type of conf/hardware/ by its key (a100-80gb): its datasheet fields (a copy of
    the folder's one reading while its files are unchanged)."""
    return copy.deepcopy(_gpu_profiles(_conf_stamp()))


@functools.lru_cache(maxsize=8)
def _gpu_profiles(stamp: tuple) -> dict[str, dict[str, Any]]:
    out = {}
    for p in sorted((paths.conf_dir() / "hardware").glob("*.yaml")):
        d = OmegaConf.to_container(OmegaConf.load(p))
        if d.get("device") == "cuda":
            out[p.stem] = d
    return out
