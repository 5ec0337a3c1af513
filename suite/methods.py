"""The memory-optimization methods of a trial as engine settings: one owner for how a
`MethodsConfig` becomes a DeepSpeed config or FSDP2 settings, for the measured trial and for
the exported launch config alike.

The optimizer is AdamW with the recipe's settings under both engines, each in its own fused
implementation (DeepSpeed's FusedAdam or CPU Adam; torch's fused AdamW under FSDP2), so that
no configuration pays for a slower kernel than its engine's own (see `deepspeed_config`), unless
`methods.optimizer=torch_fused` asks for torch's under DeepSpeed too.

The settings themselves are plain data: torch is imported only by what makes torch objects
(`torch_dtype`, `fsdp2_dtypes`, `torch_adamw`), so the predictor, the labels and the exports read
the settings without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from suite.config import Trial
from suite.models.arch import shape

if TYPE_CHECKING:  # annotations only
    import torch

    from suite.config import MethodsConfig


def torch_dtype(precision: str) -> torch.dtype:
    """The torch dtype of a precision: fp32, bf16 or fp16."""
    import torch  # deferred: only what makes tensors needs it

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def reshards_after_forward(me: MethodsConfig) -> bool:
    """FSDP2's mode: true = full_shard (each unit resharded after its forward, gathered again in
    backward), false = shard_grad_op. Unset is FSDP2's default, true (`MethodsConfig`; a resolved
    trial has it written out)."""
    return me.reshard_after_forward is not False


def deepspeed_config(t: Trial, gas: int) -> dict[str, Any]:
    """DeepSpeed JSON for the trial at `gas` accumulation steps per optimizer step.

    DeepSpeed builds the optimizer from the "optimizer" section, at every ZeRO stage: FusedAdam,
    or DeepSpeedCPUAdam when the optimizer is offloaded (deepspeed/runtime/engine.py,
    `get_optimizer_configuration`, 0.19.8 lines 2377-2409). A torch optimizer handed in by the
    caller would instead run ZeRO-0 under fp16/bf16 through `FP16_UnfusedOptimizer`, per-tensor
    Python loops (`_configure_fp16_optimizer`, lines 2555-2608: only a FusedAdam gets the fused
    `FP16_Optimizer`), while ZeRO >= 1 would not: ZeRO-0's optimizer time would be inflated.
    That is what `methods.optimizer=torch_fused` asks for, where DeepSpeed's ops cannot be built:
    no "optimizer" section, and torch's fused AdamW handed in (`torch_adamw`; engines.DeepSpeed).
    """
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
    if me.optimizer == "engine":
        cfg["optimizer"] = {"type": "AdamW", "params": optimizer_params(t)}
    elif me.offload != "none":
        # A handed-in optimizer under offload is refused unless this is off (engine.py:2342-2346).
        cfg["zero_force_ds_cpu_optimizer"] = False
    if t.precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    elif t.precision == "fp16":
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 16}
    return cfg


def bucket_elements(t: Trial) -> int:
    """Communication bucket size, sized to the model as Hugging Face's DeepSpeed integration
    sizes its "auto" buckets (hidden^2, hidden as `suite.models.arch.Shape` reads it). DeepSpeed's
    default of 5e8 elements allocates 2 GB (fp32) for a model of any size, so no small model
    would fit a small budget with ZeRO."""
    h = shape(t.model).hidden
    return h * h


def bucket_sizes(t: Trial) -> dict[str, int]:
    n, h = bucket_elements(t), shape(t.model).hidden
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


def fsdp2_dtypes(t: Trial) -> tuple[torch.dtype | None, torch.dtype]:
    """FSDP2's mixed precision (param_dtype, reduce_dtype): compute and all-gather in the trial's
    16-bit dtype (None under fp32: the parameters' own), gradients reduced in fp32. The sharded
    parameters stay fp32 and are the optimizer's master weights, as DeepSpeed's are."""
    import torch  # deferred: see the module's docstring

    return (None if t.precision == "fp32" else torch_dtype(t.precision)), torch.float32


def torch_adamw(t: Trial, params) -> torch.optim.Optimizer:
    """torch's fused AdamW (one kernel for all parameters; on the host too, under offload): FSDP2's
    optimizer on the sharded fp32 parameters, and DeepSpeed's under `methods.optimizer=torch_fused`."""
    import torch  # deferred: see the module's docstring

    p = optimizer_params(t)
    return torch.optim.AdamW(params, lr=p["lr"], betas=tuple(p["betas"]), weight_decay=p["weight_decay"], fused=True)


def fsdp_config(t: Trial, block_class_name: str) -> dict[str, Any]:
    """The trial's FSDP2 settings as the `fsdp_config` of `transformers.TrainingArguments`
    (training_args.py, `_process_fsdp_args`): version 2, one `fully_shard` unit per block."""
    me = t.methods
    return {
        "version": 2,
        "reshard_after_forward": reshards_after_forward(me),
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "transformer_layer_cls_to_wrap": [block_class_name],
        "activation_checkpointing": me.recompute == "full",
        "cpu_offload": me.offload != "none",
    }
