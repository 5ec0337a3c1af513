"""One micro-step of the real model, traced under fake tensors (`suite.predict.recorder`): its
activation memory, and the FLOPs, bytes and shapes of every operator, as functions of the
micro-batch. No formula of any architecture is involved: a Llama with grouped-query attention,
Mamba or ConvNeXt is traced as it runs. Against glibc's own count of a real CPU step
(mallinfo2) the activation peak agrees within 0.5 MiB of 160 (tests/test_predict.py).

What the trace keeps, per micro-step of `b` samples:

    activation_bytes(b) = max over operators t of  act_t(b) + fresh_grad_t
        act_t     bytes of every storage alive after operator t that the step created and that
                  is not a parameter's gradient (activations saved for backward, temporaries)
        fresh_grad_t  gradient bytes operator t has just produced: a gradient is live at least
                  from its creation until the engine takes it (accumulates it into an existing
                  gradient, copies it into a bucket); the engine's own gradient buffers are
                  model states (`suite.predict.memory`)
    activation_bytes_with_grads(b)  the same with every gradient produced so far kept: the first
                  micro-step of a step, when gradients are born in p.grad and stay there
    flops(b), bytes(b)  per operator, as the recorder counts them

Every quantity is affine in the micro-batch (each operator's shapes grow with it, none
shrinks), so the step is traced at b = 2 and b = 4 and each event and operator is carried as
`a + b * c`; the two traces must run the same operators in the same order, which is checked.
(At b = 1 a model may skip an expand or a copy of its labels: a few bytes, which the line
through 2 and 4 counts anyway.) The peak of affine lines is their upper envelope, kept
exactly; a direct trace at b = 1, 3 and 8 gives the same peaks and FLOPs (tests). Traces are
cached on disk by model, attention, recomputation, dtype, loss, linear layers, the device whose
kernels run (`DEVICES`) and library versions (`SUITE_CACHE_DIR`, default ~/.cache/suite).

Each gradient's birth is kept too: `grad_order` lists the parameters (by index in
`param_numels`) in the order their final gradient appears, and `frontier` gives, for every k,
the upper envelope of the live-bytes lines of the events at which exactly k gradients exist, so
an engine whose buffers grow as gradients arrive (ZeRO-2's partition, ZeRO-3's released
parameters; `suite.predict.memory`) is added to the activations at the same moment, not at
their separate peaks. A tied weight's two gradients are summed as the real autograd engine sums
them (in place where it can; `suite.predict.recorder`), and under ZeRO-3 the model runs
DeepSpeed's linear layers (`linear="zero3"`, `LINEARS`), as the worker's does.

This module imports no torch: the predictor reads a cached trace without it, and records one
(`suite.predict.recorder`, torch) only where the cache has none.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from suite import paths
from suite.config import ModelConfig
from suite.config.schema import settings_json
from suite.files import write_json

FORMAT = 6
"""Version of the cached trace's layout; a change of it retraces (6: gradient order, frontier,
units, in-place gradient sums)."""
B1, B2 = 2, 4
"""The micro-batches traced. Not 1: at one sample some models skip an expand or a copy."""
LOSSES = ("model", "fused")
"""The loss a trace runs: the model's own (transformers', as the worker trains), or a fused
cross-entropy kernel's (`suite.predict.recorder._FusedCrossEntropy`, as published runs that fuse
their loss)."""
LINEARS = ("torch", "zero3")
"""The linear layers' function: torch's `F.linear`, or DeepSpeed ZeRO-3's `zero3_linear_wrap`,
which replaces it in a ZeRO-3 worker (`suite.predict.recorder.linear`)."""
DROPOUT_OPS = ("aten.bernoulli", "aten.native_dropout")
"""A CPU's dropout draws its noise with `bernoulli_`; a trace without it has no dropout to run otherwise."""
NORMS = ("model", "fused")
"""The RMSNorms a trace runs: the model's own eager operators, or a fused kernel's
(`suite.predict.recorder._FusedRMSNorm`, as published runs that fuse their norms)."""
DEVICES = ("cpu", "cuda")
"""The device whose kernels a trace runs where the two differ (`suite.predict.recorder.dropout_kernels`:
a GPU's dropout is one fused kernel keeping a 1-byte mask, a CPU's keeps noise of the input's dtype)."""


@dataclass(frozen=True)
class OpGroup:
    """Identical operators of one phase (same name and shapes at every micro-batch), counted."""

    op: str
    phase: str
    """forward, or backward (which includes the recomputed forward under recomputation)."""
    count: int
    flops: tuple[float, float]
    """FLOPs of one operator as (a, c): a + c * micro_batch."""
    bytes: tuple[float, float]
    """Bytes read and written by one operator, (a, c)."""
    dims: tuple[tuple[float, float], ...]
    """Shape dimensions as (a, c) each: (batch, M, N, K) of a matmul, (batch, heads, q, kv, d,
    causal) of an attention operator, () otherwise."""
    allocs: tuple[tuple[float, float], ...] = ()
    """Bytes of each storage one operator creates, (a, c) each: a fresh allocation may cost
    more than its bytes' writing (`suite.predict.comm.first_touch_seconds`)."""

    def at(self, pair: tuple[float, float], b: int) -> float:
        return pair[0] + pair[1] * b

    def flops_at(self, b: int) -> float:
        return self.at(self.flops, b)

    def bytes_at(self, b: int) -> float:
        return self.at(self.bytes, b)

    def allocs_at(self, b: int) -> list[float]:
        return [self.at(x, b) for x in self.allocs]

    def dims_at(self, b: int) -> tuple[int, ...]:
        return tuple(round(self.at(d, b)) for d in self.dims)


@dataclass(frozen=True)
class Trace:
    """One micro-step of one model (attention, recomputation, dtype), affine in the micro-batch."""

    key: str
    n_params: int
    param_numels: tuple[int, ...]
    """Every parameter's element count, in module order."""
    block_numels: tuple[int, ...]
    """Parameters of each repeated block (`suite.models.recompute.blocks`), in order; the rest is the root."""
    module_params: tuple[tuple[int, ...], ...]
    """The element counts of the parameters each module owns itself, for every module that owns
    any, in module order: the unit ZeRO-3 gathers."""
    envelope: tuple[tuple[float, float], ...]
    """Upper envelope of the live-bytes lines (a, c): activation_bytes(b) = max(a + c * b)."""
    grads_envelope: tuple[tuple[float, float], ...]
    """The same with every gradient produced so far counted (the first micro-step of a step,
    when gradients accumulate in p.grad and none exist before it)."""
    groups: tuple[OpGroup, ...]
    grad_order: tuple[int, ...] = ()
    """Indices (in `param_numels`) of the parameters in the order their gradients appear."""
    frontier: tuple[tuple[int, float, float], ...] = ()
    """(k, a, c): the upper envelope of the live-bytes lines of the backward's events at which
    exactly the first k gradients of `grad_order` exist, for every k, of the forward's events
    (k = -1) and the backward's first event alone (k = -2: what the forward leaves to it); its
    maximum is `activation_bytes`."""
    frontier_held: tuple[tuple[int, float, float], ...] = ()
    """The same without the gradient an event has just produced: for an engine that holds every
    gradient from its birth (and counts it), not one that takes it away at once."""
    unit_of: tuple[int, ...] = ()
    """Per parameter (as `param_numels`), the repeated block (`block_numels`) it belongs to, or
    -1 for the rest (the root: embeddings, final norm, head)."""

    def activation_bytes(self, b: int) -> float:
        """Peak bytes the micro-step holds beyond parameters, gradients and optimizer state."""
        return max(a + c * b for a, c in self.envelope)

    def activation_bytes_with_grads(self, b: int) -> float:
        """Peak of the micro-step's activations and the gradients it has produced so far."""
        return max(a + c * b for a, c in self.grads_envelope)

    def moments(self, b: int, held: bool = False) -> list[tuple[int, float]]:
        """(k, live bytes) at micro-batch `b` for every k of `frontier` (`frontier_held` if
        `held`): the micro-step's largest activations while exactly k gradients exist (k = -1: in
        the forward, -2: the backward's first event)."""
        best: dict[int, float] = {}
        for k, a, c in self.frontier_held if held else self.frontier:
            best[k] = max(best.get(k, -float("inf")), a + c * b)
        return sorted(best.items())

    def flops(self, b: int, phase: str | None = None) -> float:
        return sum(g.count * g.flops_at(b) for g in self.groups if phase in (None, g.phase))

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Trace:
        groups = tuple(
            OpGroup(
                g["op"],
                g["phase"],
                g["count"],
                tuple(g["flops"]),
                tuple(g["bytes"]),
                tuple(tuple(x) for x in g["dims"]),
                tuple(tuple(x) for x in g.get("allocs", ())),
            )
            for g in d["groups"]
        )
        return cls(
            key=d["key"],
            n_params=d["n_params"],
            param_numels=tuple(d["param_numels"]),
            block_numels=tuple(d["block_numels"]),
            module_params=tuple(tuple(x) for x in d["module_params"]),
            envelope=tuple(tuple(x) for x in d["envelope"]),
            grads_envelope=tuple(tuple(x) for x in d["grads_envelope"]),
            groups=groups,
            grad_order=tuple(d["grad_order"]),
            frontier=tuple(tuple(x) for x in d["frontier"]),
            frontier_held=tuple(tuple(x) for x in d["frontier_held"]),
            unit_of=tuple(d["unit_of"]),
        )


def _envelope(points: list[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    """The lines a + c*b (b >= 1) that are the maximum somewhere: the upper envelope."""
    best: dict[float, float] = {}
    for a, c in points:
        if a > best.get(c, -float("inf")):
            best[c] = a
    lines = sorted(best.items())  # by slope c
    hull: list[tuple[float, float]] = []
    for c, a in lines:
        # drop lines below the new one for every b >= 1
        while hull and hull[-1][0] + hull[-1][1] <= a + c:
            hull.pop()
        while len(hull) >= 2:
            (a1, c1), (a2, c2) = hull[-2], hull[-1]
            # line 2 is never the maximum if line 3 overtakes line 1 no later than line 2 does
            if (a1 - a) * (c2 - c1) <= (a1 - a2) * (c - c1):
                hull.pop()
            else:
                break
        hull.append((a, c))
    return tuple(hull)


def _affine(v1: float, v2: float) -> tuple[float, float]:
    """(a, c) of the line through (B1, v1) and (B2, v2)."""
    c = (v2 - v1) / (B2 - B1)
    return (v1 - c * B1, c)


def trace_key(
    m: ModelConfig,
    attention: str,
    recompute: str,
    dtype: str,
    loss: str = "model",
    linear: str = "torch",
    device: str = "cpu",
    norm: str = "model",
) -> str:
    import torch  # deferred with transformers: only their versions, of a trace not in memory
    import transformers

    fields = {
        "model": m,
        "attention": attention,
        "recompute": recompute,
        "dtype": dtype,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "format": FORMAT,
    }
    if loss != "model":  # the model's own loss keeps the keys (and cached traces) it always had
        fields["loss"] = loss
    if linear != "torch":
        fields["linear"] = linear
    if device != "cpu":
        fields["device"] = device
    if norm != "model":
        fields["norm"] = norm
    return hashlib.sha256(settings_json(fields).encode()).hexdigest()[:20]


def cache_dir() -> Path:
    return paths.cache_dir() / "traces"


_memo: dict[str, Trace] = {}


def traced(
    m: ModelConfig,
    attention: str,
    recompute: str,
    dtype: str,
    loss: str = "model",
    linear: str = "torch",
    device: str = "cpu",
    norm: str = "model",
) -> Trace:
    """The trace of one micro-step of `m` (cached in memory and on disk).

    `attention` flash_attention_2 is traced as sdpa (flash-attn runs on CUDA only; both keep
    O(sequence) memory per head and count the same FLOPs). `loss` "model" is the model's own
    loss (what the worker runs), "fused" a fused cross-entropy kernel's (causal LMs only).
    `linear` "zero3" runs the linear layers as a ZeRO-3 worker does (`LINEARS`). `device` "cuda"
    runs a GPU's kernels where they keep other tensors than a CPU's (`DEVICES`); `norm` "fused" runs
    RMSNorms as one kernel (`NORMS`)."""
    if device not in DEVICES:
        raise ValueError(f"device {device!r}: allowed {', '.join(DEVICES)}")
    if norm not in NORMS:
        raise ValueError(f"norm {norm!r}: allowed {', '.join(NORMS)}")
    if loss not in LOSSES:
        raise ValueError(f"loss {loss!r}: allowed {', '.join(LOSSES)}")
    if linear not in LINEARS:
        raise ValueError(f"linear {linear!r}: allowed {', '.join(LINEARS)}")
    if loss == "fused" and m.task != "causal-lm":
        raise ValueError(f"loss fused: a fused cross-entropy over next tokens needs a causal-lm, not {m.task}")
    if device == "cuda":
        unfused = traced(m, attention, recompute, dtype, loss, linear, "cpu", norm)
        if not any(g.op.startswith(DROPOUT_OPS) for g in unfused.groups):
            return unfused  # nothing drops out: a GPU's kernels keep what a CPU's do
    traced_attention = "sdpa" if attention == "flash_attention_2" else attention
    key = trace_key(m, traced_attention, recompute, dtype, loss, linear, device, norm)
    if key in _memo:
        return _memo[key]
    path = cache_dir() / f"{key}.json"
    if path.exists():
        try:
            _memo[key] = Trace.from_json(json.loads(path.read_text()))
            return _memo[key]
        except (ValueError, KeyError, TypeError):
            pass  # a damaged cache file is traced again
    t = _trace(m, traced_attention, recompute, dtype, key, loss, linear, device, norm)
    write_json(path, t.to_json())
    _memo[key] = t
    return t


def model_flops(m: ModelConfig, attention: str) -> float:
    """Model FLOPs per sample as the worker's MFU counts them (`suite.models.flops.count_flops`,
    no recomputation), cached in memory and on disk like the traces."""
    key = trace_key(m, attention, "none", "model-flops")
    if key in _flops_memo:
        return _flops_memo[key]
    path = cache_dir() / f"{key}.flops.json"
    if path.exists():
        _flops_memo[key] = float(json.loads(path.read_text())["flops_per_sample"])
        return _flops_memo[key]
    from suite.models.flops import count_flops  # deferred: torch, only where the cache has none

    flops = count_flops(m, attention, "none")[0]
    write_json(path, {"flops_per_sample": flops})
    _flops_memo[key] = flops
    return flops


_flops_memo: dict[str, float] = {}


def _trace(
    m: ModelConfig,
    attention: str,
    recompute: str,
    dtype: str,
    key: str,
    loss: str,
    linear: str,
    device: str,
    norm: str = "model",
) -> Trace:
    """`m`'s micro-step recorded at B1 and B2 samples, carried as affine lines."""
    # Deferred: the recorder and the model's blocks need torch, only where the cache has no trace.
    from suite.models.recompute import blocks
    from suite.predict.recorder import build_fake, record

    model, fake_mode = build_fake(m, attention, recompute, dtype)
    params = list(model.parameters())
    param_numels = tuple(p.numel() for p in params)
    repeated = blocks(model)
    block_numels = tuple(sum(p.numel() for p in blk.parameters()) for blk in repeated)
    unit = {id(p): i for i, blk in enumerate(repeated) for p in blk.parameters()}
    owned = [tuple(p.numel() for p in mod.parameters(recurse=False)) for mod in model.modules()]
    ev1, act1, fresh1, cum1, k1, order1 = record(model, m, B1, fake_mode, loss, linear, device, norm)
    ev2, act2, fresh2, cum2, k2, order2 = record(model, m, B2, fake_mode, loss, linear, device, norm)
    same = len(ev1) == len(ev2) and all(a.op == b.op and a.phase == b.phase for a, b in zip(ev1, ev2, strict=True))
    if not same or k1 != k2 or order1 != order2:
        raise NotAffine(f"{m.name}: the operators of micro-batch {B1} and {B2} differ; it cannot be traced affinely")
    lines = [_affine(a1 + f1, a2 + f2) for a1, f1, a2, f2 in zip(act1, fresh1, act2, fresh2, strict=True)]
    # The backward's first event: what the forward leaves (its outputs other than the loss freed).
    ends = min((i for i, ev in enumerate(ev1) if ev.phase == "backward"), default=len(ev1) - 1)
    by_count: dict[int, list[tuple[float, float]]] = {}
    held: dict[int, list[tuple[float, float]]] = {}
    for ev, k, line, a1, a2 in zip(ev1, k1, lines, act1, act2, strict=True):
        moment = -1 if ev.phase == "forward" else k
        by_count.setdefault(moment, []).append(line)
        held.setdefault(moment, []).append(_affine(a1, a2))
    with_grads = [_affine(a1 + g1, a2 + g2) for a1, g1, a2, g2 in zip(act1, cum1, act2, cum2, strict=True)]
    groups: dict[tuple, list] = {}
    for e1, e2 in zip(ev1, ev2, strict=True):
        if len(e1.dims) != len(e2.dims):
            raise NotAffine(f"{m.name}: operator {e1.op} changes rank with the micro-batch")
        dims = tuple(_affine(x, y) for x, y in zip(e1.dims, e2.dims, strict=True))
        if len(e1.allocs) != len(e2.allocs):
            raise NotAffine(f"{m.name}: operator {e1.op} creates a different number of tensors by micro-batch")
        allocs = tuple(_affine(x, y) for x, y in zip(e1.allocs, e2.allocs, strict=True))
        k = (e1.op, e1.phase, _affine(e1.flops, e2.flops), _affine(e1.bytes, e2.bytes), dims, allocs)
        groups.setdefault(k, [0])[0] += 1
    return Trace(
        key=key,
        n_params=sum(param_numels),
        param_numels=param_numels,
        block_numels=block_numels,
        module_params=tuple(x for x in owned if x),
        envelope=_envelope(lines),
        grads_envelope=_envelope(with_grads),
        groups=tuple(OpGroup(op, ph, n[0], fl, by, dims, al) for (op, ph, fl, by, dims, al), n in groups.items()),
        grad_order=tuple(order1),
        frontier=tuple((k, a, c) for k, ls in sorted(by_count.items()) for a, c in _envelope(ls))
        + ((-2, *lines[ends]),),
        frontier_held=tuple((k, a, c) for k, ls in sorted(held.items()) for a, c in _envelope(ls)),
        unit_of=tuple(unit.get(id(p), -1) for p in params),
    )


class NotAffine(RuntimeError):
    """The model runs different operators at different micro-batches."""
