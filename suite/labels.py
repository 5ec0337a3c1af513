"""Names of what a trial runs, for every reader: the trial line, the search, the tables, the page.

One sharding label per engine mode (`SHARDINGS`, least sharded first), and the labels built
from it: the memory methods (`memory_methods_label`: "ZeRO-1 recompute"), a configuration
(`config_label`: "ZeRO-1 recompute mb 8x2 sdpa fp32"), a recipe (`recipe_label`), the hardware
with its memory cap (`hardware_label`), a budget (`budget_label`) and the one line a trial is
announced with (`describe`). The leaderboard page gets `SHARDINGS` and `ENGINES` in its data, not a copy.
"""

from __future__ import annotations

from typing import Any

from suite.config.schema import Trial
from suite.detect import memory_cap_gib
from suite.methods import reshards_after_forward
from suite.models.arch import attention

SHARDINGS = {
    "DDP": "DDP",
    "ZeRO-1": "ZeRO-1",
    "ZeRO-2": "ZeRO-2",
    "ZeRO-3": "ZeRO-3",
    "FSDP2 shard_grad_op": "FSDP2 grad_op",
    "FSDP2 full_shard": "FSDP2 full",
}
"""Each engine's sharding modes, least sharded first: DeepSpeed ZeRO-0 (plain data parallel, "DDP")
to 3, then FSDP2 without (shard_grad_op) and with (full_shard) resharding after forward;
label -> a short form where a narrow column needs one."""
ENGINES = {"deepspeed": "DeepSpeed", "fsdp2": "FSDP2"}


def sharding_label(t: Trial) -> str:
    me = t.methods
    if me.engine == "fsdp2":
        return "FSDP2 full_shard" if reshards_after_forward(me) else "FSDP2 shard_grad_op"
    return f"ZeRO-{me.zero_stage}" if me.zero_stage else "DDP"


def optimizer_label(t: Trial) -> list[str]:
    """The optimizer, where it is not the engine's own (methods.optimizer)."""
    return [f"optimizer={t.methods.optimizer}"] if t.methods.optimizer != "engine" else []


def offload_label(t: Trial) -> str:
    """What is offloaded, and to NVMe where the NVMe tier takes it: "optimizer+params@nvme"."""
    me = t.methods
    return f"{me.offload}@nvme" if me.offload != "none" and me.offload_device == "nvme" else me.offload


def methods_label(t: Trial) -> str:
    """The methods but the micro-batch: sharding, offload, recomputation, attention, compile."""
    me = t.methods
    parts = [sharding_label(t), f"offload={offload_label(t)}", f"recompute={me.recompute}", f"attn={me.attention}"]
    if me.reduce_every_micro_step:
        parts.insert(1, "reduce=every-micro-step")
    return " ".join(parts + (["compile"] if me.compile else []) + optimizer_label(t))


def memory_methods_label(t: Trial) -> str:
    """The memory methods alone, short: sharding, offload, recomputation ("ZeRO-1 recompute",
    "DDP" for none of them)."""
    me = t.methods
    parts = [sharding_label(t)]
    if me.reduce_every_micro_step:
        parts.append("reduce every micro-step")
    if me.offload != "none":
        parts.append(f"offload {offload_label(t)}")
    if me.recompute != "none":
        parts.append(f"recompute {me.recompute}" if me.recompute != "full" else "recompute")
    return " ".join(parts)


def config_label(t: Trial, gas: Any, kernel_path: str | None = None) -> str:
    """The methods as they ran, short: "ZeRO-1 recompute mb 8x2 sdpa fp32" (with the kernel path
    where a model has one)."""
    me = t.methods
    parts = [memory_methods_label(t)]
    parts.append(f"mb {me.micro_batch}x{gas}" if gas else f"mb {me.micro_batch}")
    parts.append(attention(t))
    if me.compile:
        parts.append("compile")
    parts += optimizer_label(t)
    parts.append(t.precision + (" tf32" if t.tf32 else ""))
    if kernel_path:
        parts.append(f"kernels {kernel_path}")
    return " ".join(parts)


def recipe_label(t: Trial) -> str:
    """What was measured: a step time compares only between trials of the same recipe."""
    r = t.model.recipe
    sample = f"x {r.seq_len} tokens" if t.unit == "token" else f"images of {r.image_size}x{r.image_size}"
    return f"batch {r.global_batch} {sample}, {r.train_steps:,} steps, {r.precision}"


def hardware_label(t: Trial) -> str:
    """The hardware profile, and its memory cap where it has one (`suite.detect.memory_cap_gib`):
    "h200-x1 capped at 24 GiB" is one H200 standing in for a 24 GiB card, a budget of its own."""
    cap = memory_cap_gib(t.hardware)
    return t.hardware.name if cap is None else f"{t.hardware.name} capped at {cap:g} GiB"


def budget_label(t: Trial) -> str:
    """A budget: the hardware profile with its cap, on more than one node where it spans several."""
    return hardware_label(t) if t.nodes == 1 else f"{hardware_label(t)} x {t.nodes} nodes"


def describe(t: Trial) -> str:
    """The trial in one line, with the attention and precision that run."""
    me, r = t.methods, t.model.recipe
    precision = t.precision + (" tf32" if t.tf32 else "")
    if me.precision == "recipe" and t.precision != r.precision:
        precision += f" (recipe {r.precision}; {t.hardware.device.upper()} trains {t.precision})"
    return (
        f"{t.model.name} {hardware_label(t)} {sharding_label(t)}"
        f"{' reduce=every-micro-step' if me.reduce_every_micro_step else ''} offload={offload_label(t)} "
        f"recompute={me.recompute} mb={me.micro_batch}x{t.gas} attn={attention(t)}"
        f"{' compile' if me.compile else ''}{''.join(' ' + x for x in optimizer_label(t))} {precision}"
    )
