"""The search space: which configurations of a model on a budget exist, as data.

`shardings` and `combinations` spell out the axes of `search.*` (DeepSpeed's ZeRO stages and
FSDP2's two modes, offload, recomputation, attention, compile), `micro_batches` the divisors of
the per-device batch, `configurations` the valid combinations at every micro-batch. The search
(`suite.search`) walks this space with real trials; `suite-predict` and the reports' `--predict`
(`analysis.predicted`) predict it. It imports neither the runner nor the predictor, so listing
configurations launches, tracks and traces nothing.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

from suite.config.schema import SearchConfig, Trial
from suite.config.validate import problems


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def micro_batches(t: Trial) -> list[int]:
    """The micro-batches a search may try for `t`: the divisors of its per-device batch (1 where it has none)."""
    return divisors(t.per_device_batch) if t.per_device_batch > 0 else [1]


def with_methods(t: Trial, **changes: Any) -> Trial:
    return replace(t, methods=replace(t.methods, **changes))


def shardings(cfg: SearchConfig) -> list[dict[str, Any]]:
    """The engine settings the search covers: each ZeRO stage under DeepSpeed, both FSDP2
    modes; an engine it does not know is kept, for `problems` to name."""
    out: list[dict[str, Any]] = []
    for engine in cfg.engines:
        if engine == "deepspeed":
            out += [{"engine": engine, "zero_stage": z, "reshard_after_forward": None} for z in cfg.zero_stages]
        elif engine == "fsdp2":
            out += [{"engine": engine, "zero_stage": 0, "reshard_after_forward": r} for r in (False, True)]
        else:
            out.append({"engine": engine, "zero_stage": 0, "reshard_after_forward": None})
    return out


def combinations(base: Trial, cfg: SearchConfig) -> list[Trial]:
    """Every combination of the search's axes, valid or not, at the smallest micro-batch."""
    axes = itertools.product(
        shardings(cfg),
        cfg.offloads,
        cfg.recomputes,
        cfg.attentions or [base.methods.attention],
        cfg.compiles or [base.methods.compile],
    )
    return [
        with_methods(base, **sh, offload=o, recompute=r, attention=a, compile=c, micro_batch=1)
        for sh, o, r, a, c in axes
    ]


def configurations(base: Trial, cfg: SearchConfig) -> list[Trial]:
    """Every valid combination of the search's axes at every micro-batch dividing the per-device
    batch (none where the batch does not divide among the devices)."""
    if base.per_device_batch <= 0:
        return []
    every = (with_methods(c, micro_batch=mb) for c in combinations(base, cfg) for mb in micro_batches(base))
    return [t for t in every if not problems(t)]
