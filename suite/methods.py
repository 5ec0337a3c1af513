"""The memory-optimization methods of a trial as a DeepSpeed config and an optimizer.

One owner for how a `MethodsConfig` becomes DeepSpeed settings, for the measured trial
and for the exported launch config alike.
"""

from __future__ import annotations

from typing import Any

import torch

from suite import models
from suite.config import Trial

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def deepspeed_config(t: Trial, gas: int) -> dict[str, Any]:
    """DeepSpeed JSON for the trial at `gas` accumulation steps per optimizer step."""
    me, r = t.methods, t.model.recipe
    zero: dict[str, Any] = {"stage": me.zero_stage}
    if me.zero_stage >= 1:
        zero.update(bucket_sizes(t))
    if me.offload in ("optimizer", "optimizer+params"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": t.hardware.device == "cuda"}
    if me.offload == "optimizer+params":
        zero["offload_param"] = {"device": "cpu", "pin_memory": t.hardware.device == "cuda"}
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": me.micro_batch,
        "gradient_accumulation_steps": gas,
        "train_batch_size": me.micro_batch * gas * t.devices,
        "gradient_clipping": r.grad_clip,
        "zero_optimization": zero,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if t.precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    elif t.precision == "fp16":
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 16}
    if me.offload != "none":
        # ZeRO-Offload steps the optimizer on the CPU with DeepSpeed's own CPU Adam.
        cfg["optimizer"] = {"type": "AdamW", "params": optimizer_params(t)}
    else:
        cfg["zero_allow_untested_optimizer"] = True
    return cfg


def bucket_elements(t: Trial) -> int:
    """Communication bucket size, sized to the model as Hugging Face's DeepSpeed integration
    sizes its "auto" buckets (hidden^2, hidden as `suite.models.Shape` reads it). DeepSpeed's
    default of 5e8 elements allocates 2 GB (fp32) for a model of any size, so no small model
    would fit a small budget with ZeRO."""
    h = models.shape(t.model).hidden
    return h * h


def bucket_sizes(t: Trial) -> dict[str, int]:
    n, h = bucket_elements(t), models.shape(t.model).hidden
    if t.methods.zero_stage == 3:
        return {
            "reduce_bucket_size": n,
            "stage3_prefetch_bucket_size": int(0.9 * n),
            "stage3_param_persistence_threshold": 10 * h,
        }
    return {"reduce_bucket_size": n, "allgather_bucket_size": n}


def optimizer_params(t: Trial) -> dict[str, Any]:
    r = t.model.recipe
    return {"lr": r.lr, "betas": list(r.betas), "weight_decay": r.weight_decay}


def client_optimizer(t: Trial, params) -> torch.optim.Optimizer | None:
    """The optimizer handed to DeepSpeed, or None when DeepSpeed builds its own (offload)."""
    if t.methods.offload != "none":
        return None
    p = optimizer_params(t)
    kind = {"fused": True} if t.hardware.device == "cuda" else {"foreach": True}
    return torch.optim.AdamW(params, lr=p["lr"], betas=tuple(p["betas"]), weight_decay=p["weight_decay"], **kind)
