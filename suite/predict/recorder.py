"""One forward and backward of the worker's model under fake tensors, every aten operator
recorded: its FLOPs, the bytes it reads and writes, its shapes, and the live bytes of the
storages the step has created (`suite.predict.trace` turns two such recordings into a trace).

The model is the one the worker trains (`suite.models.build`, same attention, same
recomputation through PyTorch's checkpoint per block, same dtype), run on a batch of the
recipe's shape (`suite.models.build.batch`) under `FakeTensorMode` (built on the meta device,
then given fake CPU storage): every operator runs its shape function only, so recording
Pythia-12B costs no memory and seconds. A `TorchDispatchMode` under it sees each aten operator
as it would run for real, forward, backward and the recomputed forward alike, and follows each
tensor storage the step creates from its operator to its release (a weak reference on the
storage, as PyTorch's own `torch.distributed._tools.mem_tracker.MemTracker` does); storages
that exist before the step (parameters, buffers, the batch) are never counted, though views of
them (a weight's transpose) pass through operators. FLOPs come from torch.utils.flop_counter's
formulas (the formulas `suite.models.flops.count_flops` counts with), bytes as
torch.utils._runtime_estimation.get_num_bytes counts them (a broadcast dimension once).

A run whose loss is a fused cross-entropy kernel (`loss="fused"`, a causal LM only) runs with
that kernel in place of the model's own loss (`_FusedCrossEntropy`): transformers' loss
upcasts the logits to fp32 and keeps fp32 log-probabilities and two fp32 gradients of them, the
fused kernel none of these.

Autograd sums the gradients a tensor receives from several uses (a residual stream, tied input
and output embeddings) in the input buffer of the node that consumes them; the real engine adds
the second into the first in place when the first is a plain tensor it alone holds
(torch/csrc/autograd/input_buffer.cpp, `accumulate`: `old_var.add_(var)` if
`can_accumulate_inplace(old_var)`, else `old_var + var`), which under fake tensors (a tensor
subclass) it never does. The recorder counts such a sum in place where the real engine would: the
first gradient is no view (`_base` is None: the weight gradient of `F.linear` is a transposed
view of its matrix multiply, summed out of place for real too) and nothing else holds it (its
storage dies with the sum). Measured (gemma-shaped model, tied 64k-vocabulary embedding, one CPU
step): the tied gradient's sum holds three copies of the embedding under `F.linear`, two under
DeepSpeed ZeRO-3's linear (`linear="zero3"`, below), as recorded.

Under ZeRO-3 the worker's model runs DeepSpeed's linear: `deepspeed.zero.Init` replaces
`torch.nn.functional.linear` with `zero3_linear_wrap` for the life of the process
(runtime/zero/partition_parameters.py:412-419, 603-604), whose weight gradient is a fresh
matrix multiply (runtime/zero/linear.py:125-130), so a tied weight's two gradients are summed
in place; such a micro-step is recorded with it (`linear`).

The worker's synthetic batches never pack sequences, so transformers' check for packed
sequences, which reads tensor values and therefore assumes packing under fake tensors, is
answered as the real run answers it (`_unpacked`); otherwise the fake run would build and keep
an explicit attention mask per layer that the real run never has.
"""

from __future__ import annotations

import contextlib
import sys
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from suite.config import ModelConfig
from suite.methods import torch_dtype
from suite.models.build import batch as make_batch
from suite.models.build import build
from suite.predict.operators import ATTENTION_PREFIX, MATMULS, METADATA, VIEWS


def tensor_bytes(t: torch.Tensor) -> int:
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
class Event:
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
        self.events: list[Event] = []
        self.alive: dict[int, int] = {}  # id of a live storage -> its serial number
        self.size: list[int] = []  # bytes of each storage, by serial number
        self.created: list[list[int]] = []  # serial numbers of the storages each event created
        self.live = 0
        self.accumulating = False  # between a backward node's end and the next node's start
        self.pending: tuple[int, int, int] | None = None  # (event, storage of the first gradient, bytes)

    def _free(self, key: int) -> None:
        serial = self.alive.pop(key, None)
        if serial is not None:
            self.live -= self.size[serial]

    def settle(self) -> None:
        """An input-buffer sum whose first gradient died with it was in place for real: its
        event held one tensor fewer (module docstring)."""
        if self.pending is not None:
            event, key, nbytes = self.pending
            self.pending = None
            if key not in self.alive:
                self.events[event].act -= nbytes

    def watch(self, root) -> None:
        """Hooks on every node of the backward graph from `root`: operators between a node's end
        and the next node's start are the engine's input-buffer sums (engine.cpp,
        evaluate_function: call_function, then InputBuffer::add for each output)."""
        seen, stack = set(), [root]
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            node.register_prehook(self._node_starts)
            node.register_hook(self._node_ends)
            stack.extend(f for f, _ in node.next_functions)

    def _node_starts(self, *_):
        self.accumulating = False

    def _node_ends(self, *_):
        self.accumulating = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.settle()
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
            moved = sum(tensor_bytes(t) for t in flat_in) + sum(tensor_bytes(t) for t in flat_out)
        allocs = tuple(self.size[s] for s in created)
        self.events.append(Event(name, self.phase, flops, moved, tuple(int(d) for d in dims), self.live, 0, allocs))
        self.created.append(created)
        if self.accumulating and func is torch.ops.aten.add.Tensor and len(created) == 1:
            first = args[0]
            if isinstance(first, torch.Tensor) and first._base is None:
                key = id(first.untyped_storage())
                if key in self.alive:
                    self.pending = (len(self.events) - 1, key, self.size[created[0]])
        return out


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


class _FusedRMSNorm(torch.autograd.Function):
    """The allocations of a fused RMSNorm kernel (torchtitan's Triton `fused_rms_norm`, apex's
    FusedRMSNorm, flash-attn's ops/triton/layer_norm.py): the forward reads the input once and
    writes the output, keeping the input, the weight and one fp32 reciprocal root mean square per
    row; the backward reads them and the output's gradient and writes the input's. transformers'
    eager RMSNorm instead keeps an fp32 copy of the input and the normalized 16-bit tensor beside
    it (4 + 2 bytes an element more than the kernel in 16-bit training)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        rstd = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
        ctx.save_for_backward(x, weight, rstd)
        return x * weight.to(x.dtype)  # one pass: read the input, write the output

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, weight, _ = ctx.saved_tensors
        return grad * x, torch.empty_like(weight)  # one pass over the input and the gradient


@contextlib.contextmanager
def norm_kernels(model: torch.nn.Module, norm: str):
    """The model's RMSNorms (transformers' `*RMSNorm` modules, with a `weight`) as `norm` runs
    them: "model" as written (eager operators), "fused" through `_FusedRMSNorm`. LayerNorm is one
    aten operator already (`native_layer_norm`, which keeps the input, mean and rstd, as fused
    kernels do)."""
    found = (
        [
            m
            for m in model.modules()
            if type(m).__name__.endswith("RMSNorm") and isinstance(getattr(m, "weight", None), torch.Tensor)
        ]
        if norm == "fused"
        else []
    )
    for m in found:
        m.forward = lambda x, m=m: _FusedRMSNorm.apply(x, m.weight)
    try:
        yield
    finally:
        for m in found:
            del m.forward


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
    model: torch.nn.Module,
    m: ModelConfig,
    micro_batch: int,
    fake_mode,
    loss: str = "model",
    linear: str = "torch",
    device: str = "cpu",
    norm: str = "model",
) -> tuple[_Recorder, dict[int, int]]:
    """Forward and backward of one micro-batch, the loss the model's own or fused
    (`_fused_loss`), the linear layers torch's or ZeRO-3's (`linear`), dropout as `device` runs it
    (`dropout_kernels`), RMSNorms the model's or fused (`norm_kernels`); the recorder and, by the
    serial number of each gradient's storage (a gradient ends the step as p.grad), the index of
    its parameter in `model.parameters()`."""
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
    with fake_mode, _unpacked(), linear_layers(linear), dropout_kernels(device), norm_kernels(model, norm), rec:
        out = _fused_loss(model, inputs) if loss == "fused" else model(**inputs).loss
        rec.phase = "backward"
        rec.watch(out.grad_fn)
        out.backward()
        rec.settle()
    del out
    grads = {rec.alive[id(p.grad.untyped_storage())]: i for i, p in enumerate(model.parameters()) if p.grad is not None}
    return rec, grads


@contextlib.contextmanager
def linear_layers(linear: str):
    """`torch.nn.functional.linear` as the worker's engine leaves it: torch's own ("torch"), or
    ZeRO-3's `zero3_linear_wrap` ("zero3", partition_parameters.py:412-419)."""
    if linear == "torch":
        yield
        return
    with contextlib.redirect_stdout(
        sys.stderr
    ):  # DeepSpeed logs its accelerator choice on import: never on a command's output
        from deepspeed.runtime.zero.linear import zero3_linear_wrap  # deferred: deepspeed, for ZeRO-3 traces only

    original = torch.nn.functional.linear
    torch.nn.functional.linear = zero3_linear_wrap
    try:
        yield
    finally:
        torch.nn.functional.linear = original


@contextlib.contextmanager
def dropout_kernels(device: str):
    """`torch.nn.functional.dropout` (what `nn.Dropout` and transformers' attention call) as
    `device` runs it. Out of place on a GPU, PyTorch runs one fused kernel (`at::native_dropout`,
    aten/src/ATen/native/Dropout.cpp, `is_fused_kernel_acceptable`: a CUDA tensor, 0 < p < 1) that
    keeps a 1-byte (bool) mask for the backward; on a CPU, which fake CPU tensors run, it draws a
    noise tensor of the input's dtype, scales it and multiplies by it (`_dropout_impl`), keeping
    the noise (4 bytes an element in fp32, 2 in 16 bits) in three passes over memory. In place
    (`inplace=True`) both run the noise path."""
    if device == "cpu":
        yield
        return
    original = torch.nn.functional.dropout

    def fused(input, p=0.5, training=True, inplace=False):
        if training and not inplace and 0 < p < 1 and input.numel() > 0:
            return torch.native_dropout(input, p, True)[0]
        return original(input, p, training, inplace)

    torch.nn.functional.dropout = fused
    try:
        yield
    finally:
        torch.nn.functional.dropout = original


def _lines(rec: _Recorder, grads: dict[int, int]) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
    """Per event: live bytes excluding gradients, gradient bytes created at that event,
    gradient bytes created so far and how many gradients exist; and the parameters' indices in
    the order their gradients were created."""
    grad_live = 0
    act, fresh, cum, count, order = [], [], [], [], []
    # A gradient's storage is never freed during the step (it ends as p.grad), so the live
    # total minus the gradients created so far is everything else.
    for ev, created in zip(rec.events, rec.created, strict=True):
        born = [s for s in created if s in grads]
        new_grad = sum(rec.size[s] for s in born)
        order += [grads[s] for s in born]
        grad_live += new_grad
        act.append(ev.act - grad_live)
        fresh.append(new_grad)
        cum.append(grad_live)
        count.append(len(order))
    return act, fresh, cum, count, order


def record(
    model,
    m,
    micro_batch,
    fake_mode,
    loss: str = "model",
    linear: str = "torch",
    device: str = "cpu",
    norm: str = "model",
) -> tuple[list[Event], list[int], list[int], list[int], list[int], list[int]]:
    """One micro-step of `micro_batch` samples: its events, and per event the live bytes without
    gradients, the gradient bytes it created, the gradient bytes created so far and how many
    gradients exist; and the parameters in the order their gradients appear (`_lines`)."""
    rec, grads = _run(model, m, micro_batch, fake_mode, loss, linear, device, norm)
    return (rec.events, *_lines(rec, grads))


def build_fake(m: ModelConfig, attention: str, recompute: str, dtype: str):
    """The worker's model with fake parameters, and the fake mode that holds them."""
    # Built on the meta device (transformers' initialisation then costs nothing), then given
    # fake CPU storage of the same shapes and dtypes.
    with torch.device("meta"):
        model = build(m, attention, recompute, dtype=torch_dtype(dtype))
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
