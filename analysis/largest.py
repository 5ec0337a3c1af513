"""The largest model of a family a budget can train, per tier of the memory hierarchy: what
`suite-predict model=FAMILY hardware=... --largest` prints, every figure predicted.

    ladder("pythia", overrides)      # the family's members, smallest first, each composed
    largest(members, search, ...)    # per tier: the largest member predicted to fit, its best configuration
    report(["model=pythia", ...])    # both, as the lines `--largest` prints

A family is a ladder of models of one architecture: `pythia` is conf/model/pythia-*.yaml (each with
its own recipe, as the Pythia suite trained them); `llama` is Llama-style widths and depths
(`LLAMA`) on TinyLlama's recipe (conf/model/tinyllama-1.1b.yaml). The tiers (`TIERS`) widen
what may hold the model states: the device memory alone (no offload), then the host memory
(DeepSpeed's CPU offload, FSDP2's CPUOffloadPolicy), then the NVMe drive (ZeRO-Infinity). A
member trains in a tier when some configuration of the search space at that tier
(`suite.space.configurations`, eager) is predicted to fit every tier it uses
(`suite.predict.Prediction.short_of`); the best is the fastest of them at any micro-batch.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from analysis import ReportError
from analysis.predicted import rows, runs_in
from analysis.prices import gpu_keys, load_prices
from suite.config import compose
from suite.config.schema import SearchConfig, Trial
from suite.labels import recipe_label
from suite.predict import Predictor
from suite.predict.comm import Network
from suite.predict.trace import traced
from suite.space import configurations

TIERS = {
    "GPU memory only": {"offloads": ["none"], "devices": ["cpu"]},
    "+ host memory (CPU offload)": {"offloads": ["none", "optimizer", "optimizer+params"], "devices": ["cpu"]},
    "+ NVMe (ZeRO-Infinity)": {"offloads": ["none", "optimizer", "optimizer+params"], "devices": ["cpu", "nvme"]},
}
"""Each tier's offloads and where they may offload to (`methods.offload_device`)."""

LLAMA = {
    "llama-1.1b": ({"hidden_size": 2048, "num_hidden_layers": 22, "num_attention_heads": 32,
                    "num_key_value_heads": 4, "intermediate_size": 5632}, "TinyLlama (Zhang et al. 2024)"),
    "llama-3b": ({"hidden_size": 3200, "num_hidden_layers": 26, "num_attention_heads": 32,
                  "num_key_value_heads": 32, "intermediate_size": 8640}, "OpenLLaMA 3B config (openlm-research)"),
    "llama-7b": ({"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                  "num_key_value_heads": 32, "intermediate_size": 11008}, "LLaMA 7B (Touvron et al. 2023, Table 2)"),
    "llama-13b": ({"hidden_size": 5120, "num_hidden_layers": 40, "num_attention_heads": 40,
                   "num_key_value_heads": 40, "intermediate_size": 13824}, "LLaMA 13B (Touvron et al. 2023, Table 2)"),
    "llama-33b": ({"hidden_size": 6656, "num_hidden_layers": 60, "num_attention_heads": 52,
                   "num_key_value_heads": 52, "intermediate_size": 17920}, "LLaMA 33B (Touvron et al. 2023, Table 2)"),
    "llama-65b": ({"hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64,
                   "num_key_value_heads": 64, "intermediate_size": 22016}, "LLaMA 65B (Touvron et al. 2023, Table 2)"),
}  # fmt: skip
"""The Llama-style ladder: widths, depths and heads as published (intermediate sizes as the
released configs have them), on TinyLlama's vocabulary, positions and recipe."""
LLAMA_BASE = "tinyllama-1.1b"


def _size(name: str) -> float:
    """Parameters a member's name states (pythia-1.4b: 1.4e9), for ordering the ladder."""
    m = re.search(r"(\d+(?:\.\d+)?)([mb])$", name)
    return float(m.group(1)) * (1e6 if m.group(2) == "m" else 1e9) if m else math.inf


def families() -> list[str]:
    """The families `--largest` takes."""
    return ["llama", "pythia"]


def ladder(family: str, overrides: list[str]) -> list[Trial]:
    """The family's members composed with `overrides` (hardware, methods, ...), smallest first,
    each at the precision its GPU trains the recipe in (`analysis.predicted.runs_in`)."""
    if family == "pythia":
        names = sorted((n for n in compose.options("model") if n.startswith("pythia-")), key=_size)
        return [runs_in(compose.trial([f"model={n}", *overrides]))[0] for n in names]
    if family == "llama":
        out = []
        for name, (shape, source) in sorted(LLAMA.items(), key=lambda kv: _size(kv[0])):
            shaped = [f"model.config.{k}={v}" for k, v in shape.items()]
            t = compose.trial([f"model={LLAMA_BASE}", *shaped, f"model.name={name}", *overrides])
            out.append(runs_in(replace(t, model=replace(t.model, source=source)))[0])
        return out
    raise ReportError(f"--largest takes model=FAMILY, one of {', '.join(families())} (got model={family or '?'})")


@dataclass
class Largest:
    """One tier's answer: the largest member predicted to train there, and its best configuration."""

    tier: str
    member: Trial | None
    row: dict | None
    """`analysis.predicted.rows`' row of the best configuration (fastest of those that fit)."""
    params: int = 0
    tried: int = 0
    """Configurations predicted for this tier."""


def tier_trials(base: Trial, search: SearchConfig, tier: str, micro_batch: int | None = None) -> list[Trial]:
    """The valid configurations of `base` in a tier (at one micro-batch where given)."""
    spec = TIERS[tier]
    out = []
    for device in spec["devices"]:
        offloads = [o for o in spec["offloads"] if device == "cpu" or o != "none"]
        b = replace(base, methods=replace(base.methods, offload_device=device))
        for t in configurations(b, replace(search, offloads=offloads, compiles=[False])):  # eager, as predicted
            if micro_batch is None or t.methods.micro_batch == micro_batch:
                out.append(t)
    return out


def largest(members: list[Trial], search: SearchConfig, predictor, prices, keys) -> list[Largest]:
    """Per tier, the largest member some configuration of which is predicted to fit: scanned from
    the largest down at micro-batch 1 (the least memory), then its every configuration predicted
    for the fastest that fits."""
    out = []
    for tier in TIERS:
        found = Largest(tier, None, None)
        for member in reversed(members):
            small = tier_trials(member, search, tier, micro_batch=1)
            if not any(r["fits"] for r in rows(small, predictor, prices, keys)):
                continue
            every = rows(tier_trials(member, search, tier), predictor, prices, keys)
            best = next(r for r in every if r["fits"])
            params = traced(member.model, member.methods.attention, "none", member.precision).n_params
            found = Largest(tier, member, best, params, len(every))
            break
        out.append(found)
    return out


def _num(x: float, fmt: str) -> str:
    width = int("".join(c for c in fmt.split(".")[0] if c.isdigit()) or 0)
    return "n/a".rjust(width) if math.isnan(x) else format(x, fmt)


def report(overrides: list[str]) -> list[str]:
    """What `suite-predict model=FAMILY ... --largest` prints: the budget's host, then per tier
    the largest member, its best configuration, memory per GPU, host memory and NVMe of the
    node, tokens/s and days, every figure labelled predicted; under them each tier's error labels,
    its best configuration's regime's (`analysis.predicted.labels`)."""
    family = next((o.split("=", 1)[1] for o in overrides if o.startswith("model=")), "")
    rest = [o for o in overrides if not o.startswith("model=")]
    members = ladder(family, rest)
    cfg = compose.config([f"model={members[0].model.name if family == 'pythia' else LLAMA_BASE}", *rest])
    predictor = Predictor(network=Network(cfg.cluster.network_gbps, cfg.cluster.network))
    found = largest(members, SearchConfig(**cfg.search), predictor, load_prices(), gpu_keys())
    hw, h = members[0].hardware, members[0].hardware.host
    adam = predictor.machine(members[0]).host_adam_elements_per_s
    head = (
        f"{'tier':<28} {'largest':<12} {'params':>7}  {'best configuration':<66} {'GiB/GPU':>8} {'host GiB':>9} "
        f"{'NVMe GiB':>9} {'tokens/s':>9} {'days':>8}"
    )
    out = [
        f"PREDICTED, not measured: the largest {family} that trains on {hw.name} ({hw.mem_gib:g} GiB per device)",
        f"  host per node: {h.mem_gib:g} GiB memory, CPU Adam {adam:.3g} parameters/s, NVMe {h.nvme_gib:g} GiB at "
        f"{h.nvme_read_gbps:g} GB/s read, {h.nvme_write_gbps:g} GB/s write (the profile's host block; hardware.host.*)",
        f"  {head}",
        f"  {'-' * len(head)}",
    ]
    for f in found:
        if f.member is None:
            out.append(f"  {f.tier:<28} none: not even {members[0].model.name} fits")
            continue
        r, n = f.row, f.member.hardware.count
        out.append(
            f"  {f.tier:<28} {f.member.model.name:<12} {f.params / 1e9:>6.2f}B  {r['config']:<66} "
            f"{_num(r['device_gib'], '8.2f')} {_num(r['host_gib'] * n, '9.1f')} {_num(r['nvme_gib'] * n, '9.1f')} "
            f"{_num(r['tokens_per_s'], '9,.0f')} {_num(r['days'], '8,.0f')}"
        )
    out.append(f"  days: each member's own recipe ({recipe_label(members[-1])} for {members[-1].model.name})")
    out.append("  error labels, each tier's best configuration in its regime (docs/predictor.md, the error label):")
    out += [f"    {f.tier}: {f.row['labels'].detail}" for f in found if f.member is not None]
    return out
