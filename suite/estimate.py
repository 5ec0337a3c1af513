"""Predictions of a trial's memory and step time before it runs, behind one small interface.

`Estimator` is what the search uses; `SimpleEstimator` is the first model (to be replaced
by a better predictor without touching the search):

- memory per device = model states (16 bytes/parameter for Adam, split by ZeRO stage as in
  Rajbhandari et al.; offloaded parts leave a GPU but not a CPU worker's memory) +
  activations (Korthikanti et al.: s*b*h*(34 + 5*a*s/h) bytes per layer at 16 bits, the
  5as/h term gone with sdpa/flash, about 2*s*b*h with full recomputation) + logits.
- step time in arbitrary units = hardware FLOPs per step per device, times a penalty for
  communication and offload, over an efficiency that grows with the micro-batch. Only
  ratios between predictions matter; the search calibrates them with measurements.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from suite.config import ModelConfig, Trial
from suite.models import count_flops, shape

GIB = 2**30
# Fixed per-rank overhead beyond model states and activations (buffers, allocator slack).
OVERHEAD_BYTES = 64 * 2**20
# Tokens per device per micro-step at which throughput reaches half its plateau.
HALF_EFFICIENCY_TOKENS = {"cpu": 64, "cuda": 2048}
# Relative slowdown per method (a first guess; the search measures the truth).
ZERO_PENALTY = {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.15}
OFFLOAD_PENALTY = {"none": 1.0, "optimizer": 1.5, "optimizer+params": 2.5}


@dataclass(frozen=True)
class Estimate:
    mem_gib: float
    """Predicted peak memory per device."""
    model_states_gib: float
    """The part no micro-batch changes: a lower bound of mem_gib."""
    step_time: float
    """Predicted time per optimizer step: seconds from `suite.predict.Predictor`; arbitrary
    units from `SimpleEstimator` (until the search uses the predictor and it goes)."""


class Estimator(Protocol):
    def estimate(self, t: Trial) -> Estimate: ...


_counted: dict[tuple[str, str, str], tuple[float, int]] = {}


def _flops_and_params(m: ModelConfig, attention: str, recompute: str) -> tuple[float, int]:
    """FLOPs per sample and parameters, counted once per (model, attention, recompute)."""
    key = (repr(m), attention, recompute)
    if key not in _counted:
        _counted[key] = count_flops(m, attention, recompute)
    return _counted[key]


def positions(t: Trial) -> int:
    """Positions a block sees per sample: the text sequence, or an image's patches (its side
    over the config's patch size, which is ConvNeXt's stem stride) for image tasks."""
    r = t.model.recipe
    if t.unit == "token":
        return r.seq_len
    return (r.image_size // max(shape(t.model).patch_size, 1)) ** 2


class SimpleEstimator:
    def model_states_bytes(self, t: Trial, n_params: int) -> float:
        n, me, on_gpu = t.hardware.count, t.methods, t.hardware.device == "cuda"
        weights, grads, optim = (4.0, 4.0, 8.0) if t.precision == "fp32" else (2.0, 2.0, 12.0)
        if me.zero_stage >= 1:
            optim /= n
        if me.zero_stage >= 2:
            grads /= n
        if me.zero_stage == 3:
            weights /= n
        if on_gpu and me.offload != "none":
            optim = 0.0
        if on_gpu and me.offload == "optimizer+params":
            weights = 0.0
        from suite.methods import bucket_elements

        buckets = 2 * 4 * bucket_elements(t) if me.zero_stage >= 1 else 0  # two fp32 buckets in flight
        return (weights + grads + optim) * n_params + buckets

    def activation_bytes(self, t: Trial) -> float:
        b, sh = t.methods.micro_batch, shape(t.model)
        s, h, a = positions(t), sh.hidden, sh.heads
        scale = 2.0 if t.precision == "fp32" else 1.0
        per_layer = s * b * h * 34 + (0 if t.attention != "eager" else 5 * a * s * s * b)
        if t.methods.recompute == "full":
            layers = 2 * s * b * h * sh.layers + per_layer  # checkpoints + one block being recomputed
        else:
            layers = per_layer * sh.layers
        logits = 3 * 4 * b * s * sh.vocab if t.unit == "token" else 0  # fp32 logits, softmax, grad
        return scale * layers + logits

    def estimate(self, t: Trial) -> Estimate:
        me = t.methods
        _, n_params = _flops_and_params(t.model, me.attention, "none")
        hw_flops, _ = _flops_and_params(t.model, me.attention, me.recompute)
        states = self.model_states_bytes(t, n_params) + OVERHEAD_BYTES
        mem = states + self.activation_bytes(t)
        tokens = me.micro_batch * positions(t)
        efficiency = tokens / (tokens + HALF_EFFICIENCY_TOKENS[t.hardware.device])
        work = hw_flops * t.per_device_batch
        penalty = ZERO_PENALTY[me.zero_stage] * OFFLOAD_PENALTY[me.offload]
        return Estimate(mem / GIB, states / GIB, work * penalty / efficiency)
