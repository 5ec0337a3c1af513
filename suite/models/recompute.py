"""A model's repeated block, found from its own structure, and activation recomputation of every
block through PyTorch's non-reentrant checkpoint: `full` keeps only each block's input,
`selective` also the outputs of its matmuls and fused attention (`SAVED_BY_SELECTIVE`). The
engines shard by the same blocks (`blocks`)."""

from __future__ import annotations

import torch

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
operators are recomputed in backward (Korthikanti et al. 2022).
`selective-alternate` (a published run's policy, traced for its prediction; no method of the suite)
is torchtitan's "op" policy: the same, but every second `aten.mm` of a block is recomputed."""
MODES = ("full", "selective", "selective-alternate")


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


def _selective_policy(ctx, func, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy

    name = str(func.overloadpacket)
    name = name if name.startswith("aten.") else f"aten.{name}"
    return CheckpointPolicy.MUST_SAVE if name in SAVED_BY_SELECTIVE else CheckpointPolicy.PREFER_RECOMPUTE


def _selective_contexts():
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(_selective_policy)


def _alternate_contexts():
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    count = {False: 0, True: 0}  # matrix multiplies of this block's forward, and of its recomputation

    def policy(ctx, func, *args, **kwargs):
        if _selective_policy(ctx, func) is CheckpointPolicy.PREFER_RECOMPUTE:
            return CheckpointPolicy.PREFER_RECOMPUTE
        if str(func.overloadpacket) in ("aten.mm", "mm"):
            count[ctx.is_recompute] += 1
            if count[ctx.is_recompute] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE

    return create_selective_checkpoint_contexts(policy)


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
    if mode not in MODES:
        raise ValueError(f"recompute {mode!r}: allowed {', '.join(MODES)}")
    contexts = {"selective": _selective_contexts, "selective-alternate": _alternate_contexts}
    extra = {"context_fn": contexts[mode]} if mode in contexts else {}
    apply_activation_checkpointing(
        model,
        checkpoint_wrapper_fn=lambda m: checkpoint_wrapper(m, checkpoint_impl=CheckpointImpl.NO_REENTRANT, **extra),
        check_fn=lambda m: type(m) is cls,
    )
