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

import os
from dataclasses import dataclass
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


def on_nvme(t: Trial) -> bool:
    """Whether the trial offloads to the NVMe tier (ZeRO-Infinity)."""
    return t.methods.offload_device == "nvme" and t.methods.offload != "none"


def swap_dir(t: Trial) -> str:
    """The folder an NVMe trial's ranks swap into: its own, `<methods.nvme_path>/<trial id>`
    (`suite.nvme` resolves nvme_path when the trial runs, empties this folder after it)."""
    return os.path.join(t.methods.nvme_path or "nvme", t.id)


def deepspeed_config(t: Trial, gas: int, param_numels: tuple[int, ...] = ()) -> dict[str, Any]:
    """DeepSpeed JSON for the trial at `gas` accumulation steps per optimizer step; under the NVMe
    tier its swap buffers are sized to the model, whose parameters' sizes `param_numels` gives
    (in the model's order: `nvme_sizes`).

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
    pinned = t.hardware.device == "cuda"
    if me.offload in ("optimizer", "optimizer+params"):
        zero["offload_optimizer"] = {"device": me.offload_device, "pin_memory": pinned}
    if me.offload == "optimizer+params":
        zero["offload_param"] = {"device": me.offload_device, "pin_memory": pinned}
    nvme = on_nvme(t)
    if nvme:
        sizes = nvme_sizes(t, param_numels)
        zero["sub_group_size"] = NVME_SUB_GROUP
        folder = swap_dir(t)
        zero["offload_optimizer"].update(nvme_path=folder, buffer_count=OPTIMIZER_SWAP_BUFFERS)
        if "offload_param" in zero:
            zero["offload_param"].update(
                nvme_path=folder, buffer_count=PARAM_SWAP_BUFFERS, buffer_size=sizes.param_buffer, max_in_cpu=0
            )
            # No prefetch: DeepSpeed 0.19.8 queues a parameter used at the turn from forward to
            # backward (the output head) twice for one NVMe read and fails on the second
            # ("already assigned swap buffer", partitioned_param_coordinator.py:670-690,
            # partitioned_param_swapper.py:185); without prefetch each is read when its module runs.
            zero["stage3_prefetch_bucket_size"] = 0
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
    if nvme:
        cfg["aio"] = aio_config(t)
    if t.precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    elif t.precision == "fp16":
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 16}
    return cfg


ZERO3_SUB_GROUP = 1_000_000_000
"""ZeRO-3's `sub_group_size` by default, elements (zero/config.py:182): its optimizer steps one
sub-group of each rank's partition at a time."""
NVME_SUB_GROUP = 100_000_000
"""ZeRO-3's `sub_group_size` under the NVMe tier, elements: the optimizer swaps one sub-group at a
time through `OPTIMIZER_SWAP_BUFFERS` pinned fp32 buffers of the largest sub-group each; at the
default (`ZERO3_SUB_GROUP`) they would pin 16 GB per rank."""
OPTIMIZER_SWAP_BUFFERS = 4
"""The optimizer swapper's pinned buffers: one per state it swaps, the fp32 parameter, its two
moments and the gradient (offload_config.py, `buffer_count`)."""
PARAM_SWAP_BUFFERS = 5
"""The parameter swapper's pinned buffers (offload_config.py's default): partitions in flight."""
MIN_SWAP_BYTES = 2**20
"""A partition smaller than this stays in host memory, never swapped (swap_tensor/utils.py
MIN_AIO_BYTES, the larger of it and aio block_size: partitioned_param_swapper.py:99,
optimizer_utils.py:225-232)."""
AIO_QUEUE_DEPTH = 32
AIO_MAX_THREADS = 8
"""DeepSpeed's async I/O settings as its DeepNVMe tutorial tuned them on a Lambda workstation
(docs/_tutorials/deepnvme.md, `ds_nvme_tune`: block 1 MiB, queue depth 32, 8 threads per
request, overlap_events on); threads: at most the node's cores per rank (`aio_config`)."""


@dataclass(frozen=True)
class NvmeSizes:
    """How the NVMe tier's swap buffers are sized for one model (`nvme_sizes`), in elements."""

    largest_sub_group: int
    """The largest optimizer sub-group of a rank's partition (what the optimizer swaps at once)."""
    param_buffer: int
    """offload_param.buffer_size: each parameter swap buffer holds the largest swapped partition,
    and the swapped fp16 parameters initialise the fp32 ones through them, a sub-group at a time
    (optimizer_utils.py:300-304), so it holds the largest sub-group too."""


def partitions(t: Trial, param_numels: tuple[int, ...]) -> list[int]:
    """Each parameter's partition on one rank under ZeRO-3, in elements (the last rank's padded)."""
    return [-(-x // t.devices) for x in param_numels]


def sub_groups(t: Trial, param_numels: tuple[int, ...]) -> list[int]:
    """The sizes, in elements, of the sub-groups ZeRO-3's optimizer steps one at a time on each
    rank: its partitions in the model's order, a sub-group closed once it reaches the trial's
    `sub_group_size` (`NVME_SUB_GROUP` under the NVMe tier, else `ZERO3_SUB_GROUP`;
    stage3.py:1210-1233); the whole partition where it is smaller."""
    size = NVME_SUB_GROUP if on_nvme(t) else ZERO3_SUB_GROUP
    groups, current = [], 0
    for x in partitions(t, param_numels):
        current += x
        if current >= size:
            groups.append(current)
            current = 0
    return groups + [current] if current or not groups else groups


def nvme_sizes(t: Trial, param_numels: tuple[int, ...]) -> NvmeSizes:
    """The NVMe tier's buffer sizes for a model of `param_numels` (its parameters, in order)."""
    if not param_numels:
        raise ValueError("the NVMe tier's swap buffers are sized to the model: give its parameters' sizes")
    largest = max(sub_groups(t, param_numels))
    biggest = max(partitions(t, param_numels))
    aligned = -(-max(largest, biggest) // 4096) * 4096  # DeepSpeed aligns its buffers to 1 KiB per I/O thread
    return NvmeSizes(largest_sub_group=largest, param_buffer=aligned)


def aio_config(t: Trial) -> dict[str, Any]:
    """DeepSpeed's `aio` section under the NVMe tier (`AIO_QUEUE_DEPTH`, `AIO_MAX_THREADS`); a host
    whose cores its profile does not give is the machine the config is made on (the trial's)."""
    cores = (t.hardware.host.cores or os.cpu_count() or 1) // max(t.hardware.count, 1)
    return {
        "block_size": MIN_SWAP_BYTES,
        "queue_depth": AIO_QUEUE_DEPTH,
        "intra_op_parallelism": max(1, min(AIO_MAX_THREADS, cores)),
        "single_submit": False,
        "overlap_events": True,
    }


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
