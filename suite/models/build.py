"""The model a trial trains, with random weights (the task's AutoModelFor... class,
`_from_config`), and synthetic batches of the recipe's shape for its task."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from suite.models.arch import attentions, shape
from suite.models.config import hf_config, task_class
from suite.models.recompute import apply_recompute

if TYPE_CHECKING:  # annotations only: this module reads the settings it is given
    from suite.config.schema import ModelConfig

MASKED_FRACTION = 0.15  # masked LM: the share of positions predicted (BERT's and RoBERTa's 15%)


def build(m: ModelConfig, attention: str, recompute: str, dtype: torch.dtype | None = None) -> torch.nn.Module:
    """The model with random weights on the current default device, in training mode.

    `attention` is the implementation to run; a model without attention takes none, whatever
    is asked (`suite.models.arch.attention` records `none` for it). `dtype` (default: torch's
    default, fp32) is the dtype its weights are created in, so a 16-bit trial never holds an fp32
    copy of the model; buffers that transformers keeps in fp32 (rotary frequencies) stay fp32.
    """
    cfg = hf_config(m)
    kwargs: dict[str, Any] = {}
    if attentions(m):
        kwargs["attn_implementation"] = attention
    if dtype is not None:
        kwargs["dtype"] = dtype
    model = task_class(m, cfg)._from_config(cfg, **kwargs)
    if recompute != "none":
        apply_recompute(model, recompute)
    return model.train()


def batch(m: ModelConfig, micro_batch: int, gen: torch.Generator, device) -> dict[str, torch.Tensor]:
    """One synthetic micro-batch of the recipe's shape for the model's task, drawn from `gen` on the CPU.

    causal-lm: random tokens, labelled by themselves (the model shifts them);
    masked-lm: random tokens, MASKED_FRACTION of the positions labelled, the rest ignored (-100);
    image-classification: Gaussian pixels and a random class per image;
    question-answering: random tokens and a random answer span (start and end position) per row;
    sequence-classification: random tokens and a random class per row.
    """
    b, r, s = micro_batch, m.recipe, shape(m)
    if m.unit == "image":
        x = torch.randn(b, s.num_channels, r.image_size, r.image_size, generator=gen)
        y = torch.randint(0, s.num_labels, (b,), generator=gen)
        return {"pixel_values": x.to(device), "labels": y.to(device)}
    ids = torch.randint(0, s.vocab, (b, r.seq_len), generator=gen)
    if m.task == "question-answering":
        start = torch.randint(0, r.seq_len, (b,), generator=gen)
        end = torch.minimum(start + torch.randint(0, 16, (b,), generator=gen), torch.tensor(r.seq_len - 1))
        return {"input_ids": ids.to(device), "start_positions": start.to(device), "end_positions": end.to(device)}
    if m.task == "sequence-classification":
        y = torch.randint(0, max(s.num_labels, 1), (b,), generator=gen)
        return {"input_ids": ids.to(device), "labels": y.to(device)}
    labels = ids
    if m.task == "masked-lm":
        masked = torch.rand(b, r.seq_len, generator=gen) < MASKED_FRACTION
        labels = torch.where(masked, ids, torch.full_like(ids, -100))
    return {"input_ids": ids.to(device), "labels": labels.to(device)}
