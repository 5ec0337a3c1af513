"""Optional fused kernels that transformers picks up when a package is installed (Mamba's
`mamba-ssm`, `causal-conv1d`): which implementation a model runs (`kernel_path`, so a trial says
which one it timed), and their PyTorch references swapped in for a while (`reference_kernels`:
a custom kernel neither runs on the meta device nor shows its FLOPs to FlopCounterMode)."""

from __future__ import annotations

import contextlib
import inspect
import sys
import types
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Fallback:
    """A function of a modeling module that transformers binds to an optional package's kernel
    when the package is installed, else to its PyTorch reference
    (`use_kernel_func_from_hub_with_fallback`: its closure holds `package` and
    `is_new_implementation`). `bound` is what the module holds under `name`: that function, or
    (transformers >= 5.2x) a module object whose `forward` calls it."""

    module: types.ModuleType
    name: str
    bound: Any
    reference: Any
    """The PyTorch reference implementation (the decorated function itself)."""
    package: str
    fast: bool


def _with_fallback(obj: Any) -> Any:
    """The `use_kernel_func_from_hub_with_fallback` wrapper behind `obj`, or None."""
    if isinstance(obj, torch.nn.Module):  # a function module: its class's forward closes over the function
        forward = getattr(type(obj), "forward", None)
        obj = inspect.getclosurevars(forward).nonlocals.get("func") if inspect.isfunction(forward) else None
    if not inspect.isfunction(obj) or not inspect.isfunction(getattr(obj, "__wrapped__", None)):
        return None
    free = inspect.getclosurevars(obj).nonlocals
    return obj if "is_new_implementation" in free and "package" in free else None


def fallbacks(model: torch.nn.Module) -> list[Fallback]:
    """Every `Fallback` of the modeling modules the model's classes come from."""
    found = []
    names = sorted({type(mod).__module__ for mod in model.modules()})
    for module in filter(None, (sys.modules.get(n) for n in names)):
        for name, obj in list(vars(module).items()):
            # Functions and module objects only: attribute lookups on transformers' lazy modules import them.
            if not (inspect.isfunction(obj) or isinstance(obj, torch.nn.Module)):
                continue
            fn = _with_fallback(obj)
            if fn is not None:
                free = inspect.getclosurevars(fn).nonlocals
                fast = bool(free["is_new_implementation"])
                found.append(Fallback(module, name, obj, fn.__wrapped__, str(free["package"]), fast))
    return found


def kernel_path(model: torch.nn.Module) -> str | None:
    """Which implementation the model's optional fused kernels run: "fast (mamba-ssm, ...)" when
    every package transformers looks for is installed, "slow (PyTorch reference; ... not
    installed)" when none is, "mixed (...)" otherwise; None for a model without such kernels."""
    found = fallbacks(model)
    if not found:
        return None
    fast = sorted({f.package.replace("_", "-") for f in found if f.fast})
    slow = sorted({f.package.replace("_", "-") for f in found if not f.fast})
    if not slow:
        return f"fast ({', '.join(fast)})"
    if not fast:
        return f"slow (PyTorch reference; {', '.join(slow)} not installed)"
    return f"mixed (fast: {', '.join(fast)}; slow: {', '.join(slow)} not installed)"


@contextlib.contextmanager
def reference_kernels(model: torch.nn.Module):
    """Run the model's optional fused kernels as their PyTorch references for a while: a custom
    kernel neither runs on the meta device nor shows its FLOPs to FlopCounterMode."""
    swapped = [f for f in fallbacks(model) if f.fast]
    for f in swapped:
        setattr(f.module, f.name, f.reference)
    try:
        yield
    finally:
        for f in swapped:
            setattr(f.module, f.name, f.bound)
