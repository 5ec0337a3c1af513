"""FLOPs of one forward and backward of a model, counted with `torch.utils.flop_counter` on the
model built on the meta device, so counting costs no memory and no compute. Fused kernels count
as their PyTorch references (`suite.models.kernels.reference_kernels`); a model whose reference
loops over every position is counted at short lengths and extrapolated exactly."""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import TYPE_CHECKING

import torch
from torch.utils.flop_counter import FlopCounterMode, conv_flop_count

from suite.models.arch import attentions
from suite.models.build import batch, build
from suite.models.config import hf_config, int_field
from suite.models.kernels import fallbacks, reference_kernels

if TYPE_CHECKING:  # annotations only: this module reads the settings it is given
    from suite.config.schema import ModelConfig

EXTRAPOLATION_STEP = 4  # short lengths counted for a model with a per-position reference loop


def _conv_backward_flop(grad_out_shape, x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
    """A convolution's backward FLOPs: the input gradient as PyTorch counts it, and the weight
    gradient counted per group. torch's formula counts a grouped convolution's weight gradient
    as if dense, `groups` times too many FLOPs (a depthwise one's `channels` times: ConvNeXt's
    7x7 and Mamba's 1D convolutions). Each weight element sums over the batch and every output
    position (every input position of a transposed one), one multiply-add each."""
    transposed, output_mask = args[4], args[7]
    flops = 0
    if output_mask[0]:
        flops += conv_flop_count(grad_out_shape, w_shape, out_shape[0], not transposed)
    if output_mask[1]:
        positions = math.prod((x_shape if transposed else grad_out_shape)[2:])
        flops += 2 * math.prod(w_shape) * x_shape[0] * positions
    return flops


def flop_counter() -> FlopCounterMode:
    """PyTorch's FlopCounterMode with grouped convolutions' backward counted right."""
    return FlopCounterMode(display=False, custom_mapping={torch.ops.aten.convolution_backward: _conv_backward_flop})


def _count(model: torch.nn.Module, m: ModelConfig, micro_batch: int) -> int:
    """FLOPs of one forward + backward of the built (meta) model on a micro-batch of `m`'s recipe."""
    gen = torch.Generator().manual_seed(0)
    inputs = {k: v.to("meta") for k, v in batch(m, micro_batch, gen, "cpu").items()}
    if attentions(m) and m.unit == "token":
        # An explicit 4D mask: causal-mask creation reads tensor values, which meta tensors
        # lack. The attention FLOPs counted are the same.
        s = m.recipe.seq_len
        inputs["attention_mask"] = torch.zeros(micro_batch, 1, s, s, device="meta")
    with reference_kernels(model), flop_counter() as counter:
        model(**inputs).loss.backward()
    return counter.get_total_flops()


def _at_length(m: ModelConfig, seq_len: int) -> ModelConfig:
    return dataclasses.replace(m, recipe=dataclasses.replace(m.recipe, seq_len=seq_len))


def _extrapolated(model: torch.nn.Module, m: ModelConfig, micro_batch: int) -> int | None:
    """FLOPs at the recipe's length from four short lengths, or None where that is not exact.

    A PyTorch reference of a fused sequence kernel (Mamba's selective scan) loops over every
    position, which on the meta device takes hours at a recipe's length. Counted FLOPs are a
    polynomial of degree <= 2 in the length (linear layers, convolutions and scans grow
    linearly, attention quadratically): three short lengths fix it, a fourth checks it exactly,
    and it is evaluated at the recipe's length. Lengths are multiples of the config's
    `chunk_size` where it has one, so a chunked scan pads alike at every length.
    """
    chunk = int_field(hf_config(m), "chunk_size")
    lengths = [k * (chunk or EXTRAPOLATION_STEP) for k in (1, 2, 3, 4)]
    if m.recipe.seq_len <= lengths[-1]:
        return None
    counts = [_count(model, _at_length(m, n), micro_batch) for n in lengths]

    def fit(x: int) -> Fraction:  # Lagrange polynomial through the first three points
        total = Fraction(0)
        for i in range(3):
            term = Fraction(counts[i])
            for j in range(3):
                if j != i:
                    term *= Fraction(x - lengths[j], lengths[i] - lengths[j])
            total += term
        return total

    if fit(lengths[3]) != counts[3]:
        return None
    return round(fit(m.recipe.seq_len))


def count_flops(m: ModelConfig, attention: str, recompute: str, micro_batch: int = 1) -> tuple[float, int]:
    """(FLOPs of forward + backward per sample, parameter count), on the meta device.

    With recompute="full" the recomputed forward is counted too (hardware FLOPs). Fused
    kernels count as their PyTorch reference (`reference_kernels`); a model with such kernels
    is counted at short lengths and extrapolated exactly (`_extrapolated`).
    """
    with torch.device("meta"):
        model = build(m, "sdpa" if attention == "flash_attention_2" else attention, recompute)
    n_params = sum(p.numel() for p in model.parameters())
    flops = None
    if m.unit == "token" and fallbacks(model):
        flops = _extrapolated(model, m, micro_batch)
    if flops is None:
        flops = _count(model, m, micro_batch)
    return flops / micro_batch, n_params
