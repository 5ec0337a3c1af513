"""The sharding engines a trial runs under, behind the one small interface the worker's timed
loop calls: DeepSpeed ZeRO (`methods.engine=deepspeed`) and PyTorch FSDP2 (`fsdp2`).

    eng = make(t, device, gas)      # joins the process group
    eng.build()                     # the model (random init, seed t.measure.seed) and its optimizer
    loss = eng.micro_step(inputs, boundary)   # forward + backward of one micro-batch
    eng.step()                      # the optimizer update, after the boundary micro-step
    eng.step_applied()              # False when fp16 overflow made the engine skip the update
    eng.record()                    # what ran: {"engine", "optimizer", ...} for the trial's metrics
    eng.param_stats()               # {parameter: [elements, mean, std]} of the whole parameters (collective)
    eng.model                       # the model as built (inside the engine's wrappers), after build()

Both engines scale each micro-step's loss by 1/gas before backward and reduce gradients
across ranks as a mean; `micro_step` returns the unscaled loss. The settings of each come
from `suite.methods`; what follows is what each keeps in memory per rank and which
collectives run when, with P parameters over N ranks, 16-bit training (bf16 or fp16; under
fp32 every 16-bit copy below is fp32 and there is no separate master copy), AdamW.

DeepSpeed 0.19.8, as `methods.deepspeed_config` sets it up. The model is built in the trial's
dtype: ZeRO 0-2 build the whole model on each device (2P bytes) and ZeRO-1/2 then flatten it
(about twice that while they do); ZeRO-3 builds each parameter already partitioned
(`deepspeed.zero.Init`). The optimizer is DeepSpeed's FusedAdam with fp32 master weights and
two fp32 moments (12P bytes over the ranks that share them), or DeepSpeedCPUAdam on the host
under offload. ZeRO-0 (plain data parallel): every rank holds 16-bit parameters and gradients
(2P + 2P) and all 12P of optimizer state; gradients are all-reduced once per optimizer step,
at the boundary micro-step, in 16-bit. ZeRO-1: 2P + 2P + 12P/N; gradients reduced once, at the
boundary, in buckets of `reduce_bucket_size` elements (hidden^2), each rank keeping its
partition; after the step the updated 16-bit parameters are all-gathered (`allgather_bucket_size`).
ZeRO-2: 2P + 2P/N + 12P/N plus reduce buckets; gradients are reduce-scattered at every micro-step,
not only at the boundary (engine.py:3084-3086), and parameters all-gathered after the step.
ZeRO-3: 2P/N + 2P/N + 12P/N, plus parameters smaller than `stage3_param_persistence_threshold`
(10 x hidden elements: biases, norms) kept whole on every rank, plus the parameters gathered for
the module being computed and those prefetched (`stage3_prefetch_bucket_size`, 0.9 x hidden^2);
each module's parameters are all-gathered before its forward and again before its backward, and
gradients reduce-scattered at every micro-step. Offload `optimizer` moves the fp32 master weights,
moments and gradient partitions to pinned host memory (the step runs on the host CPU, then the
16-bit parameters are copied back); `optimizer+params` (ZeRO-3) moves the 16-bit parameter
partitions to the host as well.

FSDP2 (`torch.distributed.fsdp.fully_shard`, torch 2.13), as `FSDP2.build` sets it up. Each rank
builds the whole model in fp32 in host memory (4P bytes, as every rank of a Trainer run under FSDP
does), then `fully_shard` runs on each block (`suite.models.recompute.blocks`, or its checkpoint wrapper under
recomputation) and then on the root (embeddings, final norm, head): each unit's parameters are
moved to the device and cut into N dim-0 shards, one kept per rank. Per rank: fp32 parameter
shards 4P/N (the optimizer's master weights), fp32 gradient shards 4P/N, fp32 moments 8P/N
(torch's fused AdamW over the shards): 16P/N. Mixed precision (`methods.fsdp2_dtypes`): a unit's
parameters are all-gathered in 16-bit before its forward (over the whole model each rank
receives 2P(N-1)/N bytes per all-gather pass); with
`reshard_after_forward=true` (full_shard, like ZeRO-3) they are freed after its forward and
all-gathered again before its backward, so about two units are whole at a time; with `false`
(shard_grad_op, like ZeRO-2) they stay whole from the unit's forward until its backward, up to 2P
at the turn from forward to backward, with no second all-gather. Every unit, root included, gets
the same setting, as Hugging Face's FSDP2 path applies it. Gradients are reduce-scattered in fp32
only at the boundary micro-step: before it each rank accumulates its unsharded gradients in fp32
(FSDP2's no_sync, `set_requires_gradient_sync(False)`; torch/distributed/fsdp/_fully_shard/
_fsdp_param_group.py:607-612, _fsdp_param.py:802-813), which holds 4P per rank from the first
micro-step to the boundary when gas > 1; at gas = 1 only one unit's 16-bit gradients are whole at
a time. Gradient clipping all-reduces one norm; no collective follows the optimizer step (the next
forward's all-gathers read the updated shards). fp16 adds a loss scaler whose overflow flag is
all-reduced over the ranks (`torch.amp.GradScaler` on sharded gradients; torch/distributed/tensor/
_dispatch.py:117-157). Offload (`CPUOffloadPolicy`, accelerators only): the fp32 parameter,
gradient and moment shards (16P/N) live in pinned host memory, each shard is copied to the device
before its all-gather and each reduced gradient shard back, and the optimizer steps on the host.
"""

from __future__ import annotations

import contextlib
from typing import Any, Protocol

import torch

from suite import methods
from suite.config import Trial
from suite.models.build import build as build_model
from suite.models.recompute import blocks as model_blocks
from suite.ops import preload_built_ops, skip_shm_comm


class Engine(Protocol):
    name: str
    model: torch.nn.Module

    def build(self) -> None: ...

    def micro_step(self, inputs: dict[str, torch.Tensor], boundary: bool) -> torch.Tensor: ...

    def step(self) -> None: ...

    def step_applied(self) -> bool: ...

    def record(self) -> dict[str, Any]: ...

    def param_stats(self) -> dict[str, list[float]]: ...


def make(t: Trial, device: torch.device, gas: int) -> Engine:
    """The trial's engine, its process group joined; `gas` micro-steps make one optimizer step."""
    return {"deepspeed": DeepSpeed, "fsdp2": FSDP2}[t.methods.engine](t, device, gas)


class _ZeroConfig:
    """What transformers reads of its `HfDeepSpeedConfig` (transformers/integrations/deepspeed.py:
    284-295: `is_zero3()` and `.config`). That class itself needs `accelerate`, which is not
    installed; transformers honours any object registered with `set_hf_deepspeed_config`."""

    def __init__(self, config: dict[str, Any]):
        self.config = config

    def is_zero3(self) -> bool:
        return self.config["zero_optimization"]["stage"] == 3


class DeepSpeed:
    name = "deepspeed"

    def __init__(self, t: Trial, device: torch.device, gas: int):
        import deepspeed

        preload_built_ops(nvme=methods.on_nvme(t))  # DeepSpeed's Adams (and async I/O), built by scripts/setup.sh
        if device.type == "cpu":
            skip_shm_comm()  # before init_distributed, which would build and load them
        deepspeed.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo", verbose=False)
        numels = param_numels(t) if methods.on_nvme(t) else ()  # the NVMe tier's buffers fit the model
        self.t, self.device, self.config = t, device, methods.deepspeed_config(t, gas, numels)
        self.dtype = methods.torch_dtype(t.precision)

    def build(self) -> None:
        import deepspeed
        from transformers.integrations.deepspeed import set_hf_deepspeed_config

        t, me = self.t, self.t.methods
        # Registered before the build and kept for the engine's life, as the Trainer keeps its
        # config: under ZeRO-3 transformers then builds the model in deepspeed.zero.Init, keeps the
        # RoPE buffers' dtype, and initializes the partitioned weights gathered on rank 0
        # (modeling_utils.py:1435-1462, integrations/deepspeed.py:298-334). Without it the weights
        # are never initialized under ZeRO-3 and RoBERTa's init crashes.
        self._hf_config = _ZeroConfig(self.config)
        set_hf_deepspeed_config(self._hf_config)
        torch.manual_seed(t.measure.seed)
        # ZeRO 0-2: the whole model on the device, already in the dtype DeepSpeed would cast it to
        # (engine.py:2080-2088, buffers keep theirs); ZeRO-3's zero.Init places each partition.
        where = contextlib.nullcontext() if me.zero_stage == 3 else self.device
        with where:
            model = build_model(t.model, me.attention, me.recompute, dtype=methods.torch_dtype(t.precision))
        # methods.optimizer=torch_fused: no optimizer section in the config, torch's handed in.
        handed = methods.torch_adamw(t, model.parameters()) if me.optimizer == "torch_fused" else None
        self.engine, *_ = deepspeed.initialize(
            model=model, optimizer=handed, model_parameters=model.parameters(), config=self.config
        )
        self.model = self.engine.module
        if me.compile:
            self.engine.compile()

    def micro_step(self, inputs: dict[str, torch.Tensor], boundary: bool) -> torch.Tensor:
        # DeepSpeed casts the model, not its inputs: floating inputs (pixels) take the model's
        # dtype here, as transformers' Trainer casts them under DeepSpeed (trainer.py:2379-2383).
        inputs = {k: v.to(self.dtype) if v.is_floating_point() else v for k, v in inputs.items()}
        loss = self.engine(**inputs).loss
        self.engine.backward(loss)  # loss / gas (engine.py:3413); reduces gradients where its stage does
        if not boundary:
            self.engine.step()  # before the boundary: only counts the micro-step, no update
        return loss.detach()

    def step(self) -> None:
        self.engine.step()

    def step_applied(self) -> bool:
        return self.engine.was_step_applied()  # False after an fp16 overflow (engine.py:3535-3541)

    def param_stats(self) -> dict[str, list[float]]:
        import deepspeed

        out = {}
        for name, p in self.model.named_parameters():
            with deepspeed.zero.GatheredParameters([p]):  # ZeRO-3: the whole parameter on every rank; below it, a no-op
                out[_plain_name(name)] = _stats(_moments(p.detach()))
        return out

    def record(self) -> dict[str, Any]:
        whose = "torch fused" if self.t.methods.optimizer == "torch_fused" else "deepspeed"
        return {
            "engine": self.name,
            "optimizer": f"{whose} {type(self.engine.basic_optimizer).__name__}",
            "optimizer_wrapper": type(self.engine.optimizer).__name__,
        }


def param_numels(t: Trial) -> tuple[int, ...]:
    """The sizes of the trial's parameters, in the model's order, from a build on the meta device
    (no memory, no compute)."""
    with torch.device("meta"):
        return tuple(p.numel() for p in build_model(t.model, t.methods.attention, "none").parameters())


def _plain_name(name: str) -> str:
    """A parameter's name as the model class names it, without the wrappers recomputation and
    torch.compile put in its path (so builds under different methods compare name by name)."""
    return name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")


def _moments(x: torch.Tensor) -> torch.Tensor:
    """[element count, sum, sum of squares] of a tensor, in fp64 (summed over ranks where sharded).
    By parts: an fp64 copy of 32 MiB at most, so the device memory the trial then measures (its
    allocator's reserved blocks) is not marked by a copy of the largest parameter."""
    total = torch.zeros(3, dtype=torch.float64, device=x.device)
    total[0] = x.numel()
    for part in x.reshape(-1).split(1 << 22):
        part = part.double()
        total[1] += part.sum()
        total[2] += part.square().sum()
    return total


def _stats(m: torch.Tensor) -> list[float]:
    """[element count, mean, std] from `_moments` (the population std; 0 for an empty tensor)."""
    n, s, ss = m.tolist()
    mean = s / n if n else 0.0
    return [n, mean, max(ss / n - mean * mean, 0.0) ** 0.5 if n else 0.0]


def shard_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules `fully_shard` wraps one by one: the model's blocks, or under recomputation the
    checkpoint wrappers around them (so that a block's parameters are gathered before its
    checkpointed forward and its recomputation, as torchtitan wraps them)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    blocks = model_blocks(model)
    inner = {id(b) for b in blocks}
    wrapped = [
        m for m in model.modules() if isinstance(m, CheckpointWrapper) and id(m._checkpoint_wrapped_module) in inner
    ]
    return wrapped or blocks


def compiled_in_place(model: torch.nn.Module, unit: torch.nn.Module) -> torch.nn.Module:
    """`torch.compile(unit)` put where `unit` was in the model (per block, before sharding, as
    torchtitan compiles), so FSDP's hooks run around the compiled block, not inside it."""
    name = next(n for n, m in model.named_modules() if m is unit)
    parent, _, child = name.rpartition(".")
    compiled = torch.compile(unit)
    model.get_submodule(parent).register_module(child, compiled)
    return compiled


class FSDP2:
    name = "fsdp2"

    def __init__(self, t: Trial, device: torch.device, gas: int):
        import torch.distributed as dist

        cuda = device.type == "cuda"
        dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
        self.t, self.device, self.gas = t, device, gas

    def build(self) -> None:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

        t, me = self.t, self.t.methods
        torch.manual_seed(t.measure.seed)
        # fp32 on the host: the sharded fp32 parameters are the optimizer's master weights, and
        # fully_shard moves each unit to the device before cutting it (_fsdp_init.py:369-401).
        with torch.device("cpu"):
            model = build_model(t.model, me.attention, me.recompute)
        param_dtype, reduce_dtype = methods.fsdp2_dtypes(t)
        shard = {
            "mesh": init_device_mesh(self.device.type, (dist.get_world_size(),)),
            "reshard_after_forward": me.reshard_after_forward,
            "mp_policy": MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype),
            "offload_policy": CPUOffloadPolicy() if me.offload != "none" else OffloadPolicy(),
        }
        units = shard_units(model)
        if not units:
            raise ValueError(f"{type(model).__name__} has no repeated block to shard")
        for unit in units:
            fully_shard(compiled_in_place(model, unit) if me.compile else unit, **shard)
        fully_shard(model, **shard)
        self.model = model
        self.optimizer = methods.torch_adamw(t, model.parameters())
        self.scaler = torch.amp.GradScaler(self.device.type) if t.precision == "fp16" else None
        self._scale_before = 0.0

    def micro_step(self, inputs: dict[str, torch.Tensor], boundary: bool) -> torch.Tensor:
        # Gradients are reduce-scattered at the boundary only (FSDP2's no_sync before it), or
        # after every micro-step's backward with methods.reduce_every_micro_step.
        self.model.set_requires_gradient_sync(boundary or self.t.methods.reduce_every_micro_step)
        loss = self.model(**inputs).loss
        scaled = loss / self.gas  # as DeepSpeed's engine.backward scales it (engine.py:3413)
        (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
        return loss.detach()

    def step(self) -> None:
        if self.scaler is not None:
            self._scale_before = self.scaler.get_scale()
            self.scaler.unscale_(self.optimizer)  # before clipping, so the norm is the true one
        if self.t.model.recipe.grad_clip > 0:  # DeepSpeed's gradient_clipping: 0 = off
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.t.model.recipe.grad_clip)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)  # skips the update after an overflow
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def step_applied(self) -> bool:
        # An overflow backs the scale off (x0.5); an applied step keeps or grows it.
        return self.scaler is None or self.scaler.get_scale() >= self._scale_before

    def param_stats(self) -> dict[str, list[float]]:
        import torch.distributed as dist

        names, moments = [], []
        for name, p in self.model.named_parameters():
            local = p.to_local() if hasattr(p, "to_local") else p  # this rank's shard of a DTensor
            names.append(_plain_name(name))
            moments.append(_moments(local.detach()).cpu())
        total = torch.stack(moments).to(self.device)  # on the device: NCCL reduces no host tensor
        dist.all_reduce(total)  # the shards' sums make the whole parameter's
        return {name: _stats(m) for name, m in zip(names, total.cpu(), strict=True)}

    def record(self) -> dict[str, Any]:
        fused = "fused AdamW on the host" if self.t.methods.offload != "none" else "fused AdamW"
        return {"engine": self.name, "optimizer": f"torch {fused}", "grad_scaler": self.scaler is not None}
