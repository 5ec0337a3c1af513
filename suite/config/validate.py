"""Every problem of a trial, at once: its values, their combinations, its model against its
architecture (read from transformers without building the model), and what this machine lacks.

    problems(t)      # [] for a valid trial; each problem names the field, the value and what is allowed
    unsupported(t)   # why this machine cannot run a valid trial (no such GPU, no flash-attn, a memory
                     # cap above its GPUs' memory), or None

A single run with problems exits 2 listing them; in a sweep the trial is recorded `invalid`.
"""

from __future__ import annotations

import difflib
import os
import shutil
from functools import cache
from pathlib import Path
from typing import Any

from suite import stats
from suite.config.schema import (
    ATTENTIONS,
    DEVICES,
    ENGINES,
    FAULTS,
    GPU_COUNTS,
    OFFLOAD_DEVICES,
    OFFLOADS,
    OPTIMIZERS,
    PRECISIONS,
    RECOMPUTES,
    TASKS,
    ZERO_STAGES,
    MethodsConfig,
    Trial,
    settings_json,
)
from suite.detect import gpu_mem_gib, local_gpus, memory_cap_gib
from suite.methods import on_nvme, swap_dir
from suite.models.arch import arch, attention
from suite.models.config import SUITE_FIELDS, ModelError, config_class, fields, hf_config, int_field
from suite.ops import aio_problem
from suite.predict.nvme import swap_bytes as nvme_bytes


def _positive_fields(cfg_class, f: dict[str, Any]) -> list[str]:
    """Integer fields given a value <= 0 where transformers' default is a positive integer."""
    default = cfg_class()
    out = []
    for k, v in f.items():
        d = getattr(default, k, None)
        if isinstance(d, (list, tuple)) and d and all(isinstance(x, int) and x > 0 for x in d):
            if isinstance(v, list) and any(not isinstance(x, int) or x <= 0 for x in v):
                out.append(f"model.config.{k}={v} must hold integers > 0")
        elif isinstance(d, int) and not isinstance(d, bool) and d > 0:
            if isinstance(v, int) and not isinstance(v, bool) and v <= 0:
                out.append(f"model.config.{k}={v} must be > 0")
    return out


def _unknown_fields(cfg_class, f: dict[str, Any], built) -> list[str]:
    """Fields the config class neither declares nor takes (a typo is kept as a stray attribute)."""
    default = cfg_class()
    out = []
    for k in f:
        if not hasattr(default, k) and k in vars(built):
            near = difflib.get_close_matches(k, [a for a in vars(default) if not a.startswith("_")], n=2)
            hint = f"; did you mean {' or '.join(near)}?" if near else ""
            out.append(f"model.config.{k} is not a field of {cfg_class.__name__}{hint}")
    return out


_MODEL_PROBLEMS: dict[str, list[str]] = {}
"""model_problems by model, recomputation and attention (building transformers' config takes ~5
ms; a search or `suite-predict hardware=all` asks about one model thousands of times)."""


def model_problems(t: Trial) -> list[str]:
    """Every problem of the trial's model against its architecture, without building it."""
    key = settings_json([t.model, t.methods.recompute, t.methods.attention])
    if key not in _MODEL_PROBLEMS:
        if len(_MODEL_PROBLEMS) >= 1024:
            _MODEL_PROBLEMS.clear()
        _MODEL_PROBLEMS[key] = _model_problems(t)
    return list(_MODEL_PROBLEMS[key])


def _model_problems(t: Trial) -> list[str]:
    m, r, me = t.model, t.model.recipe, t.methods
    p: list[str] = []
    if m.task not in TASKS:
        p.append(f"model.task={m.task!r} is not allowed; choose one of {', '.join(TASKS)}")
    try:
        model_type, f = fields(m)
        cfg_class = config_class(model_type)
    except ModelError as e:
        return p + [str(e)]
    for k, owner in SUITE_FIELDS.items():
        if k in m.config:
            p.append(f"model.config.{k} is set by the trial, not the model config: use {owner}")
    bad = _positive_fields(cfg_class, f)
    if bad:  # transformers' own validators would only report the first of them
        return p + bad
    try:
        built = hf_config(m)
    except ModelError as e:
        return p + [str(e)]
    p += _unknown_fields(cfg_class, f, built)
    if m.task not in TASKS:
        return p
    try:
        a = arch(m)
    except ModelError as e:
        return p + [str(e)]
    s = a.shape
    if s.heads and s.hidden % s.heads and not a.head_dim_given:
        p.append(f"model.config: hidden_size={s.hidden} is not divisible by num_attention_heads={s.heads}")
    kv = int_field(built, "num_key_value_heads")
    if s.heads and kv and s.heads % kv:
        p.append(f"model.config: num_attention_heads={s.heads} is not divisible by num_key_value_heads={kv}")
    if TASKS[m.task] == "token":
        if r.seq_len <= 0:
            p.append(f"model.recipe.seq_len={r.seq_len} must be > 0")
        if s.vocab <= 0:
            p.append(f"model.config.vocab_size={s.vocab} must be > 0 for {m.task}")
        if r.seq_len > s.max_positions > 0:
            p.append(
                f"model.recipe.seq_len={r.seq_len} exceeds the model's positions "
                f"(model.config max_position_embeddings={s.max_positions})"
            )
    else:
        if r.image_size <= 0:
            p.append(f"model.recipe.image_size={r.image_size} must be > 0")
        elif s.patch_size > 0 and r.image_size % s.patch_size:
            p.append(f"model.recipe.image_size={r.image_size} is not a multiple of the patch size {s.patch_size}")
        if s.num_labels <= 0:
            p.append(f"model.config.num_labels={s.num_labels} must be > 0 for {m.task}")
    if me.recompute != "none" and not a.block_names:
        p.append(
            f"methods.recompute={me.recompute} needs repeated blocks; {a.model_class} names none (_no_split_modules)"
        )
    if a.attentions and me.attention not in a.attentions:
        allowed = ", ".join(a.attentions)
        p.append(f"methods.attention={me.attention} is not supported by {a.model_class}; choose one of {allowed}")
    if not a.attentions:  # a method that means nothing here would run as another's trial under a second id
        if me.attention not in (MethodsConfig.attention, "none"):
            p.append(
                f"methods.attention={me.attention} means nothing for {a.model_class}: it has no attention (it runs "
                f"'none'); leave methods.attention at its default ({MethodsConfig.attention}) or set none"
            )
        if me.recompute == "selective":
            p.append(
                "methods.recompute=selective recomputes the cheap operators around a block's attention and keeps "
                f"its matmuls (Korthikanti et al. 2022); {a.model_class} has no attention: choose none or full"
            )
    return p


def _choice(problems: list[str], name: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        problems.append(f"{name}={value!r} is not allowed; choose one of {', '.join(map(str, allowed))}")


def _positive(problems: list[str], name: str, value: float) -> None:
    if value <= 0:
        problems.append(f"{name}={value} must be > 0")


def _not_negative(problems: list[str], name: str, value: float) -> None:
    if value < 0:
        problems.append(f"{name}={value} must be >= 0")


def _engine_problems(me: MethodsConfig) -> list[str]:
    """Settings that belong to the other engine, and offloads the engine cannot do."""
    p: list[str] = []
    if me.engine == "fsdp2":
        if me.zero_stage != 0:
            p.append(
                f"methods.zero_stage={me.zero_stage} is a DeepSpeed setting; under methods.engine=fsdp2 set "
                "methods.reshard_after_forward (true: full_shard, like ZeRO-3; false: shard_grad_op, like ZeRO-2)"
            )
        if me.offload == "optimizer":
            p.append(
                "methods.offload=optimizer is not available under methods.engine=fsdp2: its CPUOffloadPolicy "
                "offloads parameters, gradients and optimizer state together; set methods.offload=optimizer+params"
            )
        if me.optimizer == "torch_fused":
            p.append(
                "methods.optimizer=torch_fused applies to methods.engine=deepspeed only: FSDP2's own optimizer "
                "is torch's fused AdamW already; leave methods.optimizer=engine"
            )
        if me.offload_device == "nvme":
            p.append(
                "methods.offload_device=nvme is DeepSpeed's (ZeRO-Infinity, ZeRO-3); FSDP2's CPUOffloadPolicy offloads "
                "to host memory only: set methods.engine=deepspeed methods.zero_stage=3, or methods.offload_device=cpu"
            )
    elif me.engine == "deepspeed":
        if me.reduce_every_micro_step:
            p.append(
                "methods.reduce_every_micro_step=true applies to methods.engine=fsdp2 only; DeepSpeed reduces "
                "at the boundary (ZeRO-0/1) or at every micro-step (ZeRO-2/3) by its stage"
            )
        if me.reshard_after_forward is not None:
            p.append(
                f"methods.reshard_after_forward={me.reshard_after_forward} applies to methods.engine=fsdp2 only; "
                "under deepspeed choose methods.zero_stage"
            )
        if me.offload != "none" and me.zero_stage == 0:
            p.append(f"methods.offload={me.offload} needs sharding; set methods.zero_stage to 1, 2 or 3")
        if me.offload == "optimizer+params" and me.zero_stage != 3:
            p.append(f"methods.offload=optimizer+params needs methods.zero_stage=3 (got {me.zero_stage})")
        if me.offload_device == "nvme" and me.offload != "none" and me.zero_stage != 3:
            p.append(
                f"methods.offload_device=nvme needs methods.zero_stage=3 (got {me.zero_stage}): only ZeRO-3's "
                "optimizer swaps to NVMe (DeepSpeed 0.19.8 stage3.py; ZeRO-1/2 would keep the states in host memory)"
            )
    if me.offload_device == "nvme" and me.offload == "none":
        p.append(
            "methods.offload_device=nvme says where offloaded states go, and methods.offload=none offloads nothing: "
            "set methods.offload=optimizer (or optimizer+params) with methods.zero_stage=3"
        )
    return p


def problems(t: Trial) -> list[str]:
    """Every problem with the values and their combination; empty when the trial is valid."""
    r, hw, me, ms = t.model.recipe, t.hardware, t.methods, t.measure
    p = model_problems(t)
    _positive(p, "model.recipe.global_batch", r.global_batch)
    _positive(p, "model.recipe.train_steps", r.train_steps)
    _choice(p, "model.recipe.precision", r.precision, PRECISIONS)
    _positive(p, "model.recipe.lr", r.lr)
    for k in ("weight_decay", "grad_clip", "original_gpus", "original_days"):
        _not_negative(p, f"model.recipe.{k}", getattr(r, k))
    if len(r.betas) != 2 or not all(0 <= b < 1 for b in r.betas):
        p.append(f"model.recipe.betas={list(r.betas)} must be two values in [0, 1)")

    _choice(p, "hardware.device", hw.device, DEVICES)
    _positive(p, "hardware.count", hw.count)
    if hw.device == "cuda" and hw.count not in GPU_COUNTS:
        p.append(f"hardware.count={hw.count} is not a GPU count of one node; choose one of {GPU_COUNTS}")
    _positive(p, "cluster.nodes", t.nodes)
    _not_negative(p, "hardware.mem_gib", hw.mem_gib)
    full = gpu_mem_gib(hw)
    if full and hw.mem_gib > full:
        p.append(
            f"hardware.mem_gib={hw.mem_gib:g} is above the {full:g} GiB of {hw.gpu}: on a GPU it caps the "
            f"device's memory and cannot add to it; set at most {full:g}"
        )
    for k, v in hw.peak_tflops.items():
        _positive(p, f"hardware.peak_tflops.{k}", v)

    _choice(p, "methods.engine", me.engine, ENGINES)
    _choice(p, "methods.zero_stage", me.zero_stage, ZERO_STAGES)
    _choice(p, "methods.offload", me.offload, OFFLOADS)
    _choice(p, "methods.offload_device", me.offload_device, OFFLOAD_DEVICES)
    _choice(p, "methods.recompute", me.recompute, RECOMPUTES)
    _choice(p, "methods.attention", me.attention, ATTENTIONS)
    _choice(p, "methods.optimizer", me.optimizer, OPTIMIZERS)
    _choice(p, "methods.precision", me.precision, ("recipe",) + PRECISIONS)
    _positive(p, "methods.micro_batch", me.micro_batch)
    p += _engine_problems(me)
    prec = t.precision
    if prec == "bf16" and not hw.bf16:
        p.append(f"precision bf16 is not supported by {hw.name}; set methods.precision=fp16 or fp32")
    if prec == "fp16" and hw.device == "cpu":
        p.append(f"precision fp16 does not train on CPU ({hw.name}); set methods.precision=fp32 or bf16")
    if attention(t) == "flash_attention_2" and prec == "fp32":
        p.append("methods.attention=flash_attention_2 needs bf16 or fp16; set methods.precision")
    if r.global_batch > 0 and hw.count > 0 and t.nodes > 0:
        over = f"hardware.count={hw.count}" + (f" x cluster.nodes={t.nodes}" if t.nodes > 1 else "")
        if r.global_batch % t.devices:
            p.append(f"model.recipe.global_batch={r.global_batch} is not divisible by {over}")
        elif me.micro_batch > 0 and t.per_device_batch % me.micro_batch:
            p.append(
                f"methods.micro_batch={me.micro_batch} does not divide the per-device batch "
                f"{t.per_device_batch} (global {r.global_batch} / {t.devices} devices)"
            )

    for k in ("warmup_steps", "timed_steps", "max_micro_steps", "timeout_s", "repeat_width", "max_repeats"):
        _positive(p, f"measure.{k}", getattr(ms, k))
    _not_negative(p, "measure.seed", ms.seed)
    if ms.repeats != "auto" and (isinstance(ms.repeats, bool) or not isinstance(ms.repeats, int) or ms.repeats < 1):
        p.append(f"measure.repeats={ms.repeats!r} is not allowed; give a number of runs >= 1, or auto")
    if ms.repeats == "auto" and ms.max_repeats < stats.runs_for_level():
        p.append(
            f"measure.max_repeats={ms.max_repeats} is too few for measure.repeats=auto: a "
            f"{stats.LEVEL:.0%} interval of the median needs at least {stats.runs_for_level()} runs"
        )
    _choice(p, "debug.fault", t.debug.fault, FAULTS)
    if t.debug.fault != "none" and not 0 <= t.debug.fault_rank < max(t.devices, 1):
        p.append(f"debug.fault_rank={t.debug.fault_rank} is not a rank of the trial's {t.devices} device(s)")
    return p


# A command that installs flash-attn: its setup.py imports torch, so it builds in this
# environment (no isolation), which must then hold its other build needs (setuptools and wheel
# are not in a fresh venv); it compiles CUDA code with nvcc unless a prebuilt wheel matches.
FLASH_ATTN_INSTALL = (
    "pip install setuptools wheel packaging ninja psutil && "
    "MAX_JOBS=4 pip install --no-build-isolation 'flash-attn>=2.5'"
)
FLASH_ATTN_MIN_CAPABILITY = (8, 0)  # FlashAttention-2 runs on Ampere (sm80) and newer GPUs


@cache
def flash_attn_problem() -> str | None:
    """Why flash-attn cannot serve this process's trials (not installed, does not import, a version
    transformers refuses), or None."""
    try:
        import flash_attn  # noqa: F401 - the CUDA extension loads here: an ABI mismatch shows now, not mid-trial
    except ModuleNotFoundError:
        return f"flash-attn is not installed (on a CUDA machine with nvcc: {FLASH_ATTN_INSTALL})"
    except Exception as e:  # noqa: BLE001 - any import failure (undefined symbol, missing library) is the reason
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return f"flash-attn does not import ({type(e).__name__}: {first}); reinstall it: {FLASH_ATTN_INSTALL}"
    from transformers.utils import is_flash_attn_2_available

    if not is_flash_attn_2_available():
        return "transformers cannot use the installed flash-attn (it needs flash-attn >= 2.3.3 and a CUDA torch)"
    return None


def unsupported(t: Trial, capability: tuple[int, int] | None = None) -> str | None:
    """Why this machine cannot run a valid trial, or None. Checked before any launch.

    `capability`: the compute capability of the trial's GPUs; None reads GPU 0's.
    """
    cuda = t.hardware.device == "cuda"
    if t.methods.engine == "fsdp2" and t.methods.offload != "none" and not cuda:
        return "FSDP2's CPUOffloadPolicy moves sharded state from an accelerator to the host; a CPU budget has none"
    if on_nvme(t):
        why = aio_problem()
        if why:
            return why
    if attention(t) == "flash_attention_2":
        if not cuda:
            return "flash-attn needs a CUDA GPU; it is unavailable on CPU"
        if capability is None:
            import torch

            capability = torch.cuda.get_device_capability(0) if torch.cuda.device_count() else None
        if capability is not None and tuple(capability) < FLASH_ATTN_MIN_CAPABILITY:
            major, minor = capability
            return (
                f"flash-attn 2 needs a GPU of compute capability 8.0 or newer (Ampere); this GPU's is {major}.{minor}"
            )
        # Its dtypes (fp16, bf16) are a problem of the trial itself: see problems().
        why = flash_attn_problem()
        if why:
            return why
    return absent_devices(t) or cap_above_devices(t)


def absent_devices(t: Trial) -> str | None:
    """Why this machine lacks the trial's GPUs (fewer CUDA GPUs than `hardware.count`), or None."""
    if t.hardware.device != "cuda":
        return None
    import torch

    have = torch.cuda.device_count()
    if have < t.hardware.count:
        return f"{t.hardware.name} needs {t.hardware.count} CUDA GPU(s); this machine has {have}"
    return None


def cap_above_devices(t: Trial) -> str | None:
    """Why a memory cap (`suite.detect.memory_cap_gib`) cannot hold on this machine's GPUs: a cap
    above a device's own memory would be no cap at all (torch refuses a fraction above 1), or None."""
    cap = memory_cap_gib(t.hardware)
    if cap is None:
        return None
    for i, (name, gib) in enumerate(local_gpus()[: t.hardware.count]):
        if cap > gib:
            return (
                f"hardware.mem_gib={cap:g} caps each GPU's memory, but GPU {i} ({name}) has {gib:.2f} GiB: "
                f"a cap can only lower it; set at most {gib:.2f}"
            )
    return None


def nvme_problems(t: Trial) -> list[str]:
    """Why this machine's drive cannot take an NVMe trial's swap, before it launches (a single run
    exits 2 naming them; a sweep records `invalid`): its folder (`suite.methods.swap_dir`, under
    `methods.nvme_path`) cannot be made or written, its filesystem refuses O_DIRECT (tmpfs before Linux 6.6 does;
    DeepSpeed's async I/O opens every swap file with it), or it has less free space than the
    predicted swap of the node's ranks (`suite.predict.nvme.swap_bytes`)."""
    if not on_nvme(t):
        return []
    folder = Path(swap_dir(t))
    where = f"methods.nvme_path={t.methods.nvme_path}"
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        return [f"{where}: {existing} is not a folder this user can write; give a writable folder on the NVMe drive"]
    made = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".o_direct"
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | getattr(os, "O_DIRECT", 0), 0o600)
        os.close(fd)
        probe.unlink()
    except OSError as e:
        return [
            f"{where}: cannot create a swap file with O_DIRECT in {folder} ({e.strerror}); DeepSpeed's async I/O "
            "needs a filesystem that allows it: give a folder on the NVMe drive"
        ]
    finally:
        if made:
            shutil.rmtree(folder, ignore_errors=True)
    need = nvme_bytes(t) * t.hardware.count  # the node's ranks, on one drive
    free = shutil.disk_usage(existing).free
    if free < need:
        return [
            f"{where}: {free / 2**30:.1f} GiB free on its filesystem, less than the {need / 2**30:.1f} GiB this "
            f"trial's {t.hardware.count} rank(s) swap (predicted); free space or give a folder on a larger drive"
        ]
    return []
