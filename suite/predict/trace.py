"""One micro-step of the real model, traced under fake tensors: its activation memory, and the
FLOPs, bytes and shapes of every operator, as functions of the micro-batch.

The model is the one the worker trains (`suite.models.build`, same attention, same
recomputation through PyTorch's checkpoint per block, same dtype), run forward and backward on
a batch of the recipe's shape (`suite.models.build.batch`) under `FakeTensorMode` (built on the meta
device, then given fake CPU storage): every operator runs its shape function only, so tracing
Pythia-12B costs no memory and seconds. A `TorchDispatchMode` under it sees each aten operator
as it would run for real, forward, backward and the recomputed forward alike, and follows each
tensor storage the step creates from its operator to its release (a weak reference on the
storage, as PyTorch's own `torch.distributed._tools.mem_tracker.MemTracker` does); storages
that exist before the step (parameters, buffers, the batch) are never counted, though views of
them (a weight's transpose) pass through operators. No formula of any architecture is involved:
a Llama with grouped-query attention, Mamba or ConvNeXt is traced as it runs. Against glibc's
own count of a real CPU step (mallinfo2) the activation peak agrees within 0.5 MiB of 160
(tests/test_predict.py).

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
    flops(b), bytes(b)  per operator: FLOPs from torch.utils.flop_counter's formulas (the
                  formulas `suite.models.flops.count_flops` counts with), bytes read and written as
                  torch.utils._runtime_estimation.get_num_bytes counts them (a broadcast
                  dimension once)

Every quantity is affine in the micro-batch (each operator's shapes grow with it, none
shrinks), so the step is traced at b = 2 and b = 4 and each event and operator is carried as
`a + b * c`; the two traces must run the same operators in the same order, which is checked.
(At b = 1 a model may skip an expand or a copy of its labels: a few bytes, which the line
through 2 and 4 counts anyway.) The peak of affine lines is their upper envelope, kept
exactly; a direct trace at b = 1, 3 and 8 gives the same peaks and FLOPs (tests). Traces are
cached on disk by model, attention, recomputation, dtype, loss and library versions
(`SUITE_CACHE_DIR`, default ~/.cache/suite).

A run whose loss is a fused cross-entropy kernel (`loss="fused"`, a causal LM only) is traced
with that kernel in place of the model's own loss (`_FusedCrossEntropy`): transformers' loss
upcasts the logits to fp32 and keeps fp32 log-probabilities and two fp32 gradients of them, the
fused kernel none of these.

The worker's synthetic batches never pack sequences, so transformers' check for packed
sequences, which reads tensor values and therefore assumes packing under fake tensors, is
answered as the real run answers it (`_unpacked`); otherwise the fake run would build and keep
an explicit attention mask per layer that the real run never has.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from suite.config import ModelConfig
from suite.files import write_json
from suite.models.build import batch as make_batch
from suite.models.build import build
from suite.models.flops import count_flops
from suite.models.recompute import blocks

FORMAT = 5
"""Version of the cached trace's layout; a change of it retraces."""
B1, B2 = 2, 4
"""The micro-batches traced. Not 1: at one sample some models skip an expand or a copy."""
MATMULS = ("aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm")
ATTENTION_PREFIX = ("aten._scaled_dot_product", "aten._flash_attention", "aten._efficient_attention")
# Operators that move no data (views, metadata): they cost dispatch time only.
VIEWS = {
    "aten.view",
    "aten._unsafe_view",
    "aten.t",
    "aten.transpose",
    "aten.permute",
    "aten.expand",
    "aten.unsqueeze",
    "aten.squeeze",
    "aten.slice",
    "aten.select",
    "aten.split",
    "aten.split_with_sizes",
    "aten.unbind",
    "aten.as_strided",
    "aten.detach",
    "aten.alias",
    "aten.lift_fresh",
    "aten.unflatten",
    "aten.chunk",
    "aten.narrow",
    "aten.diagonal",
}
LOSSES = ("model", "fused")
"""The loss a trace runs: the model's own (transformers', as the worker trains), or a fused
cross-entropy kernel's (`_FusedCrossEntropy`, as published runs that fuse their loss)."""
METADATA = {"prim.device", "aten.sym_size", "aten.sym_stride", "aten.sym_numel", "aten.is_contiguous", "aten.dim"}


def _bytes(t: torch.Tensor) -> int:
    """Bytes an operator touches of `t`: a broadcast (stride 0) dimension is read once, as in
    torch.utils._runtime_estimation.get_num_bytes."""
    n = 1
    for size, stride in zip(t.shape, t.stride(), strict=True):
        if stride != 0:
            n *= size
    return n * t.element_size()


def _matmul_dims(name: str, args: tuple) -> tuple[int, int, int, int] | None:
    """(batch, M, N, K) of a matrix multiply: out[batch, M, N] = a[batch, M, K] @ b[batch, K, N]."""
    if name == "aten.mm":
        a, b = args[0], args[1]
        return 1, a.shape[0], b.shape[1], a.shape[1]
    if name == "aten.addmm":
        a, b = args[1], args[2]
        return 1, a.shape[0], b.shape[1], a.shape[1]
    if name == "aten.bmm":
        a, b = args[0], args[1]
        return a.shape[0], a.shape[1], b.shape[2], a.shape[2]
    if name == "aten.baddbmm":
        a, b = args[1], args[2]
        return a.shape[0], a.shape[1], b.shape[2], a.shape[2]
    return None


def _named(func, args: tuple, kwargs: dict) -> dict[str, Any]:
    """An operator's arguments by their names in its schema."""
    named = {a.name: v for a, v in zip(func._schema.arguments, args, strict=False)}
    named.update(kwargs)
    return named


def _attention_dims(func, args: tuple, kwargs: dict) -> tuple[int, ...]:
    """(batch, heads, q_len, kv_len, head_dim, causal) of a scaled-dot-product attention operator."""
    a = _named(func, args, kwargs)
    q, k = a["query"], a["key"]
    return q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3], int(bool(a.get("is_causal", False)))


def _flop_formulas() -> dict:
    """torch.utils.flop_counter's formulas, and the same formulas for the CPU flash-attention
    kernel that the registry leaves out (FlopCounterMode counts it by decomposing it into
    matrix multiplies, which gives the same count)."""
    from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

    aten = torch.ops.aten
    formulas = dict(flop_registry)
    formulas[aten._scaled_dot_product_flash_attention_for_cpu] = lambda q, k, v, *a, **kw: sdpa_flop_count(
        q.shape, k.shape, v.shape
    )
    formulas[aten._scaled_dot_product_flash_attention_for_cpu_backward] = lambda g, q, k, v, *a, **kw: (
        sdpa_backward_flop_count(g.shape, q.shape, k.shape, v.shape)
    )
    return formulas


@dataclass
class _Event:
    op: str
    phase: str
    flops: int
    bytes: int
    dims: tuple[int, ...]
    act: int
    fresh: int
    allocs: tuple[int, ...] = ()
    """Bytes of each storage the operator created."""


class _Recorder(TorchDispatchMode):
    """Records each operator and the live bytes of the storages created since it started."""

    def __init__(self, existing: set[int]) -> None:
        super().__init__()
        self.flop_registry = _flop_formulas()
        self.existing = existing  # ids of storages alive before the step (parameters, inputs)
        self.phase = "forward"
        self.events: list[_Event] = []
        self.alive: dict[int, int] = {}  # id of a live storage -> its serial number
        self.size: list[int] = []  # bytes of each storage, by serial number
        self.created: list[list[int]] = []  # serial numbers of the storages each event created
        self.live = 0

    def _free(self, key: int) -> None:
        serial = self.alive.pop(key, None)
        if serial is not None:
            self.live -= self.size[serial]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = str(func.overloadpacket)
        name = name if name.startswith(("aten.", "prim.")) else f"aten.{name}"
        if name in METADATA:
            return out
        created = []
        flat_out = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        for t in flat_out:
            st = t.untyped_storage()
            key = id(st)
            if key not in self.alive and key not in self.existing:
                self.alive[key] = len(self.size)
                created.append(len(self.size))
                self.size.append(st.nbytes())
                self.live += st.nbytes()
                weakref.finalize(st, self._free, key)
        flops, dims = 0, ()
        if func.overloadpacket in self.flop_registry:
            flops = int(self.flop_registry[func.overloadpacket](*args, **kwargs, out_val=out))
        if name in MATMULS:
            dims = _matmul_dims(name, args)
        elif name.startswith(ATTENTION_PREFIX):
            dims = _attention_dims(func, args, kwargs)
        moved = 0
        if name not in VIEWS:
            flat_in = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            moved = sum(_bytes(t) for t in flat_in) + sum(_bytes(t) for t in flat_out)
        allocs = tuple(self.size[s] for s in created)
        self.events.append(_Event(name, self.phase, flops, moved, tuple(int(d) for d in dims), self.live, 0, allocs))
        self.created.append(created)
        return out


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
    more than its bytes' writing (`suite.predict.timing.first_touch_seconds`)."""

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

    def activation_bytes(self, b: int) -> float:
        """Peak bytes the micro-step holds beyond parameters, gradients and optimizer state."""
        return max(a + c * b for a, c in self.envelope)

    def activation_bytes_with_grads(self, b: int) -> float:
        """Peak of the micro-step's activations and the gradients it has produced so far."""
        return max(a + c * b for a, c in self.grads_envelope)

    def flops(self, b: int, phase: str | None = None) -> float:
        return sum(g.count * g.flops_at(b) for g in self.groups if phase in (None, g.phase))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trace:
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
        )


@contextlib.contextmanager
def _unpacked():
    """transformers' packed-sequence check reads position ids, which fake tensors do not hold;
    the worker's batches are never packed (positions 0..s-1 in every row), so the real check
    returns None, and so does this one."""
    try:
        from transformers import masking_utils
    except ImportError:  # an architecture without transformers' masks
        yield
        return
    original = masking_utils.find_packed_sequence_indices
    masking_utils.find_packed_sequence_indices = lambda *args, **kwargs: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = original


class _FusedCrossEntropy(torch.autograd.Function):
    """The allocations of a fused cross-entropy kernel, as flash-attn's keeps them
    (flash_attn/ops/triton/cross_entropy.py, `CrossEntropyLoss`): the forward reads the logits in
    their own dtype and writes an fp32 loss and log-sum-exp per row, saving the logits (no copy)
    and the log-sum-exp; the backward writes the logits' gradient into a new buffer of the logits'
    dtype (`torch.empty_like(logits)`; into the logits themselves under `inplace_backward=True`,
    which flash_attn.losses.cross_entropy.CrossEntropyLoss leaves off by default). No fp32 copy of
    the logits exists at any time. Shapes only: the values are never read under fake tensors."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        rows = logits.shape[0]
        losses = torch.empty(rows, dtype=torch.float32, device=logits.device)
        lse = torch.empty(rows, dtype=torch.float32, device=logits.device)
        ctx.save_for_backward(logits, lse, target)
        return losses

    @staticmethod
    def backward(ctx, grad_losses: torch.Tensor) -> tuple[torch.Tensor, None]:
        logits, _, _ = ctx.saved_tensors
        return torch.empty(logits.shape, dtype=logits.dtype, device=logits.device), None


def _fused_loss(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """A causal LM's mean loss through `_FusedCrossEntropy`: the model returns its logits (no
    labels, so no loss of its own), the labels shifted by one position as the trainers shift
    them, the logits flattened to (tokens, vocabulary) as the kernel takes them."""
    labels = inputs["labels"]
    logits = model(input_ids=inputs["input_ids"]).logits  # only the loss's context keeps them
    target = torch.nn.functional.pad(labels[:, 1:], (0, 1), value=-100).reshape(-1)
    losses = _FusedCrossEntropy.apply(logits.reshape(-1, logits.shape[-1]), target)
    return losses.sum() / labels.numel()


def _run(
    model: torch.nn.Module, m: ModelConfig, micro_batch: int, fake_mode, loss: str = "model"
) -> tuple[_Recorder, set[int]]:
    """Forward and backward of one micro-batch, the loss the model's own or fused
    (`_fused_loss`); the recorder and the serial numbers of the gradients' storages (a gradient
    ends the step as p.grad)."""
    for p in model.parameters():
        p.grad = None
    gen = torch.Generator().manual_seed(0)
    # Floating inputs (pixels) take the model's dtype, as the worker casts them (suite/engines.py).
    dtype = next(model.parameters()).dtype
    batch = make_batch(m, micro_batch, gen, "cpu")
    inputs = {k: fake_mode.from_tensor(v.to(dtype) if v.is_floating_point() else v) for k, v in batch.items()}
    # Parameters, buffers and inputs exist before the step: a view of one (a weight's
    # transpose) is not an allocation of the step.
    before = [*model.parameters(), *model.buffers(), *inputs.values()]
    rec = _Recorder({id(x.untyped_storage()) for x in before})
    with fake_mode, _unpacked(), rec:
        out = _fused_loss(model, inputs) if loss == "fused" else model(**inputs).loss
        rec.phase = "backward"
        out.backward()
    del out
    grads = {rec.alive[id(p.grad.untyped_storage())] for p in model.parameters() if p.grad is not None}
    return rec, grads


def _lines(rec: _Recorder, grads: set[int]) -> tuple[list[int], list[int], list[int]]:
    """Per event: live bytes excluding gradients, gradient bytes created at that event, and
    gradient bytes created so far."""
    grad_live = 0
    act, fresh, cum = [], [], []
    # A gradient's storage is never freed during the step (it ends as p.grad), so the live
    # total minus the gradients created so far is everything else.
    for ev, created in zip(rec.events, rec.created, strict=True):
        new_grad = sum(rec.size[s] for s in created if s in grads)
        grad_live += new_grad
        act.append(ev.act - grad_live)
        fresh.append(new_grad)
        cum.append(grad_live)
    return act, fresh, cum


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


def _record(
    model, m, micro_batch, fake_mode, loss: str = "model"
) -> tuple[list[_Event], list[int], list[int], list[int]]:
    rec, grads = _run(model, m, micro_batch, fake_mode, loss)
    return (rec.events, *_lines(rec, grads))


def _affine(v1: float, v2: float) -> tuple[float, float]:
    """(a, c) of the line through (B1, v1) and (B2, v2)."""
    c = (v2 - v1) / (B2 - B1)
    return (v1 - c * B1, c)


def trace_key(m: ModelConfig, attention: str, recompute: str, dtype: str, loss: str = "model") -> str:
    import transformers

    fields = {
        "model": dataclasses.asdict(m),
        "attention": attention,
        "recompute": recompute,
        "dtype": dtype,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "format": FORMAT,
    }
    if loss != "model":  # the model's own loss keeps the keys (and cached traces) it always had
        fields["loss"] = loss
    blob = json.dumps(fields, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def cache_dir() -> Path:
    from suite import paths

    return paths.cache_dir() / "traces"


_memo: dict[str, Trace] = {}


def traced(m: ModelConfig, attention: str, recompute: str, dtype: str, loss: str = "model") -> Trace:
    """The trace of one micro-step of `m` (cached in memory and on disk).

    `attention` flash_attention_2 is traced as sdpa (flash-attn runs on CUDA only; both keep
    O(sequence) memory per head and count the same FLOPs). `loss` "model" is the model's own
    loss (what the worker runs), "fused" a fused cross-entropy kernel's (causal LMs only)."""
    if loss not in LOSSES:
        raise ValueError(f"loss {loss!r}: allowed {', '.join(LOSSES)}")
    if loss == "fused" and m.task != "causal-lm":
        raise ValueError(f"loss fused: a fused cross-entropy over next tokens needs a causal-lm, not {m.task}")
    traced_attention = "sdpa" if attention == "flash_attention_2" else attention
    key = trace_key(m, traced_attention, recompute, dtype, loss)
    if key in _memo:
        return _memo[key]
    path = cache_dir() / f"{key}.json"
    if path.exists():
        try:
            _memo[key] = Trace.from_dict(json.loads(path.read_text()))
            return _memo[key]
        except (ValueError, KeyError, TypeError):
            pass  # a damaged cache file is traced again
    t = _trace(m, traced_attention, recompute, dtype, key, loss)
    write_json(path, t.to_dict())
    _memo[key] = t
    return t


def model_flops(m: ModelConfig, attention: str) -> float:
    """Model FLOPs per sample as the worker's MFU counts them (`suite.models.flops.count_flops`,
    no recomputation), cached on disk like the traces."""
    key = trace_key(m, attention, "none", "model-flops")
    path = cache_dir() / f"{key}.flops.json"
    if path.exists():
        return float(json.loads(path.read_text())["flops_per_sample"])
    flops = count_flops(m, attention, "none")[0]
    write_json(path, {"flops_per_sample": flops})
    return flops


def build_fake(m: ModelConfig, attention: str, recompute: str, dtype: str):
    """The worker's model with fake parameters, and the fake mode that holds them."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from suite.methods import DTYPES

    # Built on the meta device (transformers' initialisation then costs nothing), then given
    # fake CPU storage of the same shapes and dtypes.
    with torch.device("meta"):
        model = build(m, attention, recompute, dtype=DTYPES[dtype])
    fake_mode = FakeTensorMode(allow_non_fake_inputs=False)
    # A weight shared by two modules (tied input and output embeddings) stays one parameter:
    # one copy in memory, one gradient that both uses accumulate into, one optimizer state.
    made: dict[int, torch.nn.Parameter] = {}
    with fake_mode:
        for module in model.modules():
            for name, p in module._parameters.items():
                if p is not None:
                    if id(p) not in made:
                        empty = torch.empty(p.shape, dtype=p.dtype, device="cpu")
                        made[id(p)] = torch.nn.Parameter(empty, requires_grad=p.requires_grad)
                    module._parameters[name] = made[id(p)]
            for name, b in module._buffers.items():
                if b is not None:
                    module._buffers[name] = torch.empty(b.shape, dtype=b.dtype, device="cpu")
    return model, fake_mode


def _trace(m: ModelConfig, attention: str, recompute: str, dtype: str, key: str, loss: str) -> Trace:
    model, fake_mode = build_fake(m, attention, recompute, dtype)
    params = list(model.parameters())
    param_numels = tuple(p.numel() for p in params)
    block_numels = tuple(sum(p.numel() for p in blk.parameters()) for blk in blocks(model))
    owned = [tuple(p.numel() for p in mod.parameters(recurse=False)) for mod in model.modules()]
    ev1, act1, fresh1, cum1 = _record(model, m, B1, fake_mode, loss)
    ev2, act2, fresh2, cum2 = _record(model, m, B2, fake_mode, loss)
    same = len(ev1) == len(ev2) and all(a.op == b.op and a.phase == b.phase for a, b in zip(ev1, ev2, strict=True))
    if not same:
        raise NotAffine(f"{m.name}: the operators of micro-batch {B1} and {B2} differ; it cannot be traced affinely")
    lines = [_affine(a1 + f1, a2 + f2) for a1, f1, a2, f2 in zip(act1, fresh1, act2, fresh2, strict=True)]
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
    )


class NotAffine(RuntimeError):
    """The model runs different operators at different micro-batches."""
