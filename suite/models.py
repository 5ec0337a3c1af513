"""Model building, synthetic batches of the recipe's shape, and FLOP counting.

Every model is built with `transformers` from its config with random weights; nothing is
ever downloaded. FLOPs are counted with `torch.utils.flop_counter` on the same model built
on the meta device, so counting costs no memory and no compute.
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from suite.config import ModelConfig


def hf_config(m: ModelConfig):
    import transformers as tf

    if m.family == "gpt_neox":
        return tf.GPTNeoXConfig(
            vocab_size=m.vocab,
            hidden_size=m.hidden,
            num_hidden_layers=m.layers,
            num_attention_heads=m.heads,
            intermediate_size=m.intermediate,
            max_position_embeddings=m.max_positions,
            rotary_pct=m.rotary_pct,
            use_cache=False,
            tie_word_embeddings=False,
        )
    if m.family == "gpt2":
        return tf.GPT2Config(
            vocab_size=m.vocab,
            n_embd=m.hidden,
            n_layer=m.layers,
            n_head=m.heads,
            n_inner=m.intermediate,
            n_positions=m.max_positions,
            use_cache=False,
        )
    if m.family == "llama":
        return tf.LlamaConfig(
            vocab_size=m.vocab,
            hidden_size=m.hidden,
            num_hidden_layers=m.layers,
            num_attention_heads=m.heads,
            num_key_value_heads=m.kv_heads or m.heads,
            intermediate_size=m.intermediate,
            max_position_embeddings=m.max_positions,
            use_cache=False,
        )
    if m.family == "roberta":
        return tf.RobertaConfig(
            vocab_size=m.vocab,
            hidden_size=m.hidden,
            num_hidden_layers=m.layers,
            num_attention_heads=m.heads,
            intermediate_size=m.intermediate,
            max_position_embeddings=m.max_positions,
        )
    if m.family == "vit":
        return tf.ViTConfig(
            hidden_size=m.hidden,
            num_hidden_layers=m.layers,
            num_attention_heads=m.heads,
            intermediate_size=m.intermediate,
            image_size=m.recipe.image_size,
            patch_size=m.patch_size,
            num_labels=m.num_labels,
        )
    raise ValueError(f"unknown model family {m.family!r}")


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


def apply_recompute(model: torch.nn.Module) -> None:
    """Full activation recomputation: every block is checkpointed (PyTorch's non-reentrant
    `torch.utils.checkpoint`), so only each block's input is kept for the backward pass."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )

    cls = block_class(model)
    if cls is None:
        raise ValueError(f"{type(model).__name__} has no repeated block to recompute")
    apply_activation_checkpointing(
        model,
        checkpoint_wrapper_fn=lambda m: checkpoint_wrapper(m, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
        check_fn=lambda m: type(m) is cls,
    )


def build(m: ModelConfig, attention: str, recompute: str, dtype: torch.dtype | None = None) -> torch.nn.Module:
    """The model with random weights on the current default device, in training mode.

    `dtype` (default: torch's default, fp32) is the dtype its weights are created in, so a
    16-bit trial never holds an fp32 copy of the model; buffers that transformers keeps in
    fp32 (rotary frequencies) stay fp32.
    """
    import transformers as tf

    cls = {
        "gpt_neox": tf.GPTNeoXForCausalLM,
        "gpt2": tf.GPT2LMHeadModel,
        "llama": tf.LlamaForCausalLM,
        "roberta": tf.RobertaForMaskedLM,
        "vit": tf.ViTForImageClassification,
    }[m.family]
    kwargs = {"attn_implementation": attention}
    if dtype is not None:
        kwargs["dtype"] = dtype
    model = cls._from_config(hf_config(m), **kwargs)
    if recompute == "full":
        apply_recompute(model)
    return model.train()


def batch(m: ModelConfig, micro_batch: int, gen: torch.Generator, device) -> dict[str, torch.Tensor]:
    """One synthetic micro-batch of the recipe's shape, drawn from `gen` on the CPU."""
    b, r = micro_batch, m.recipe
    if m.family == "vit":
        x = torch.randn(b, 3, r.image_size, r.image_size, generator=gen)
        y = torch.randint(0, m.num_labels, (b,), generator=gen)
        return {"pixel_values": x.to(device), "labels": y.to(device)}
    ids = torch.randint(0, m.vocab, (b, r.seq_len), generator=gen)
    if m.family == "roberta":  # masked LM: 15% of positions are predicted
        masked = torch.rand(b, r.seq_len, generator=gen) < 0.15
        labels = torch.where(masked, ids, torch.full_like(ids, -100))
        return {"input_ids": ids.to(device), "labels": labels.to(device)}
    return {"input_ids": ids.to(device), "labels": ids.to(device)}


def count_flops(m: ModelConfig, attention: str, recompute: str, micro_batch: int = 1) -> tuple[float, int]:
    """(FLOPs of forward + backward per sample, parameter count), on the meta device.

    With recompute="full" the recomputed forward is counted too (hardware FLOPs).
    """
    gen = torch.Generator().manual_seed(0)
    inputs = {k: v.to("meta") for k, v in batch(m, micro_batch, gen, "cpu").items()}
    with torch.device("meta"):
        model = build(m, "sdpa" if attention == "flash_attention_2" else attention, recompute)
        n_params = sum(p.numel() for p in model.parameters())
        if m.family in ("gpt_neox", "gpt2", "llama"):
            # An explicit 4D mask: causal-mask creation reads tensor values, which meta
            # tensors lack. The attention FLOPs counted are the same.
            s = m.recipe.seq_len
            inputs["attention_mask"] = torch.zeros(micro_batch, 1, s, s)
        with FlopCounterMode(display=False) as counter:
            model(**inputs).loss.backward()
    return counter.get_total_flops() / micro_batch, n_params
