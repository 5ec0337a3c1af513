"""The error label of a prediction: how far off predictions of the same regime were when scored.

    r = regime(t, n_params)                         # datacenter-sxm · FSDP · no offload · >8 GPUs · 1-7B
    error_label(t, "step", n_params).long           # step time ±9% median, 25% p90, n=41 published runs in ...
    error_label(t, "memory", n_params, "nvidia-smi").short   # ±19% (n=25, all regimes)
    fit_label(t, n_params).text                     # false "does not fit" / false "fits", each with its n

A regime is what changes a prediction's error: the GPU class (`gpu_class`, from the datasheet
name), the engine and ZeRO stage, offload, one GPU or several, and the model's size band. The
scorers (`analysis/accuracy.py` for the suite's own trials, `analysis/published_runs.py` for
published runs) summarise their rows under `by_regime`, one entry per key of every relaxation
level of each row's regime (`Regime.levels`):

    by_regime[key]["n"]                              rows in the regime
    by_regime[key]["step_time_err_pct"]              {n, median, p90, max} of |step-time error| %
    by_regime[key]["memory_err_pct_by_kind"][kind]   the same of memory, per kind (MEMORY_KINDS)
    by_regime[key]["fit"]                            `fit_counts`: ran, false_no_fit, oom, false_fit

and the kinds' overall memory figures at the top (`memory_err_pct_by_kind`). A label takes its
figure from the trial's own regime where it has MIN_N scored rows; else from the nearest regime,
relaxing one dimension after another in the order of `RELAX` (size band, offload, engine, GPU
count), saying so; the GPU class is never relaxed silently: where the class itself has fewer than
MIN_N, the label says the class is not scored and names the nearest regime of another class
(`NEAREST_CLASS`). At each level the suite's own GPU trials (results/accuracy/cuda.json) come
before published runs (cuda-published.json). A memory label is of one kind of figure: within the
regime's levels, else that kind's figure over every regime, said so. A CPU prediction has one
regime, the CPU workers of this machine (results/accuracy/cpu.json).

Pure: reads the summaries through `suite.predict.published_error`; never imports analysis.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from typing import Literal

from suite.config import Trial
from suite.predict import MEMORY_KINDS, Predictor, published_error
from suite.predict.trace import traced

MIN_N = 5
"""Scored rows a regime needs before its figure is printed as its own (fewer: the nearest regime's)."""

GpuClass = Literal["datacenter-sxm", "datacenter-pcie", "consumer-workstation", "cpu"]
Engine = Literal["ddp", "zero1", "zero2", "zero3", "fsdp"]
RELAX = ("size", "offload", "engine", "gpus")
"""The order in which the nearest regime relaxes dimensions; the GPU class is never relaxed."""
NEAREST_CLASS = {
    "consumer-workstation": ("datacenter-pcie", "datacenter-sxm"),
    "datacenter-pcie": ("datacenter-sxm", "consumer-workstation"),
    "datacenter-sxm": ("datacenter-pcie", "consumer-workstation"),
}
"""Where a class has fewer than MIN_N scored rows: the classes to take a figure from, nearest first
(PCIe cards share the SXM parts' chips at lower clocks and links; consumer cards are PCIe)."""
QUANTITIES = ("step", "memory")

# Datasheet names (conf/hardware/*.yaml `gpu`) -> class; first match wins.
_CONSUMER = re.compile(r"GeForce|\bRTX\b|TITAN|Quadro|\bL40S?\b|\bL4\b|\bA40\b|\bA10G?\b|\bA16\b", re.I)
_DATACENTER = re.compile(r"\b(?:V100|A100|A800|H100|H800|H200|GH200|B100|B200|GB200)\b", re.I)
_PCIE = re.compile(r"PCI-?E|\bNVL\b", re.I)
_ENGINES = {"ddp": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3", "fsdp": "FSDP"}
_GPUS = {"1": "1 GPU", "2-8": "2-8 GPUs", ">8": ">8 GPUs"}


def gpu_class(name: str) -> GpuClass:
    """The class of a GPU by its datasheet name: GeForce, RTX workstation (A-series, Ada), L40/L40S,
    A40, A10 are consumer-workstation; V100, A100, H100, H200, GH200 are datacenter-sxm, their PCIe
    and NVL parts datacenter-pcie. ValueError for a name none of these matches."""
    if _CONSUMER.search(name):
        return "consumer-workstation"
    if _DATACENTER.search(name):
        return "datacenter-pcie" if _PCIE.search(name) else "datacenter-sxm"
    raise ValueError(
        f"GPU {name!r}: no GPU class for it (GeForce/RTX/L40/A40/A10: consumer-workstation; "
        "V100/A100/H100/H200/GH200: datacenter-sxm, their PCIe or NVL parts datacenter-pcie)"
    )


def engine_of(t: Trial) -> Engine:
    """ddp, zero1-3 (DeepSpeed's stages; stage 0 is plain data parallel) or fsdp (FSDP2, either mode)."""
    me = t.methods
    if me.engine == "fsdp2":
        return "fsdp"
    return "ddp" if me.zero_stage == 0 else f"zero{me.zero_stage}"  # type: ignore[return-value]


def size_band(n_params: int) -> str:
    """<1B below 1e9 parameters, 1-7B to 7e9, >7B above."""
    return "<1B" if n_params < 1e9 else "1-7B" if n_params <= 7e9 else ">7B"


def gpus_band(devices: int) -> str:
    return "1" if devices == 1 else "2-8" if devices <= 8 else ">8"


@dataclass(frozen=True)
class Regime:
    """A regime, or a relaxed one: a dimension set to None stands for any value."""

    gpu_class: str
    engine: str | None = None
    offload: str | None = None
    """none or offload (any of DeepSpeed's offloads)."""
    gpus: str | None = None
    """1, 2-8 or >8 devices of the trial."""
    size: str | None = None
    """<1B, 1-7B or >7B parameters."""

    @property
    def key(self) -> str:
        """The key of `by_regime` in the scorers' summaries: the fields joined by |, * where relaxed."""
        return "|".join("*" if v is None else v for v in (getattr(self, f.name) for f in fields(self)))

    @classmethod
    def from_key(cls, key: str) -> Regime:
        return cls(*(None if v == "*" else v for v in key.split("|")))

    @property
    def text(self) -> str:
        """consumer-workstation · DDP · no offload · 1 GPU · <1B; a relaxed dimension is left out."""
        if self.gpu_class == "cpu":
            return "CPU workers of this machine"
        offload = {"none": "no offload", "offload": "offload"}.get(self.offload or "")
        parts = (self.gpu_class, _ENGINES.get(self.engine or ""), offload, _GPUS.get(self.gpus or ""), self.size)
        return " · ".join(p for p in parts if p)

    def levels(self) -> list[Regime]:
        """Itself, then relaxed one more dimension at a time in the order of RELAX, down to its class."""
        out, r = [self], self
        for dim in RELAX:
            r = replace(r, **{dim: None})
            out.append(r)
        return out

    def __str__(self) -> str:
        return self.text


def regime(t: Trial, n_params: int) -> Regime:
    """The regime of trial `t` of a model of `n_params` parameters (`n_params_of`)."""
    hw = t.hardware
    cls: GpuClass = gpu_class(hw.gpu) if hw.device == "cuda" else "cpu"
    offload = "none" if t.methods.offload == "none" else "offload"
    return Regime(cls, engine_of(t), offload, gpus_band(t.devices), size_band(n_params))


def n_params_of(t: Trial) -> int:
    """The parameters of `t`'s model as the predictor traces it (cached; traced on a miss)."""
    me = t.methods
    return traced(Predictor.model_as_run(t), me.attention, me.recompute, t.precision).n_params


def fit_counts(predicted_fits: list[bool], ran: list[bool]) -> dict[str, int]:
    """A fit score that cannot hide: of the rows that ran, how many were predicted not to fit
    (false "does not fit"); of those that ran out of memory, how many were predicted to fit
    (false "fits"). Published runs all ran, so they only ever give the first."""
    pairs = list(zip(predicted_fits, ran, strict=True))
    return {
        "ran": sum(r for _, r in pairs),
        "false_no_fit": sum(r and not f for f, r in pairs),
        "oom": sum(not r for _, r in pairs),
        "false_fit": sum(f and not r for f, r in pairs),
    }


ORIGINS = {"cuda": "GPU trials of the suite", "cuda-published": "published runs", "cpu": "CPU trials"}


@dataclass(frozen=True)
class ErrorLabel:
    """The error printed beside one predicted figure, and where it comes from."""

    quantity: str
    """step (step time, and so days and cost) or memory."""
    regime: Regime
    """The trial's regime."""
    source: Regime | None
    """The regime the figure comes from (relaxed where not the trial's own); None: every regime
    (a memory kind's overall figure) or nothing scored."""
    n: int
    """Scored rows behind the figure (0: none)."""
    median_pct: float | None
    p90_pct: float | None
    own: bool
    """Whether the figure is of the trial's own regime."""
    origin: str = ""
    """published runs, GPU trials of the suite, CPU trials."""
    regime_n: int = 0
    """Scored rows in the trial's own regime (fewer than MIN_N where `own` is False)."""
    kind: str = ""
    """The memory figure's kind (MEMORY_KINDS); '' for step time."""

    @property
    def scored(self) -> bool:
        return self.median_pct is not None

    @property
    def cell(self) -> str:
        """±12% for a narrow column; ±15%* where the figure is not the trial's own regime's."""
        if not self.scored:
            return "±?"
        return f"±{self.median_pct:.0f}%" + ("" if self.own else "*")

    @property
    def short(self) -> str:
        """±12% (n=23), ±15% (n=9, nearest), ±19% (n=25, all regimes), or ±? (not scored)."""
        if not self.scored:
            return "±? (not scored)"
        where = "" if self.own else ", all regimes" if self.source is None else ", nearest"
        return f"±{self.median_pct:.0f}% (n={self.n}{where})"

    @property
    def what(self) -> str:
        if self.quantity == "step":
            return "step time"
        return f"memory ({self.kind} figure)" if self.kind else "memory"

    @property
    def figure(self) -> str:
        p90 = "" if self.p90_pct is None else f", {self.p90_pct:.0f}% p90"
        return f"±{self.median_pct:.0f}% median{p90}, n={self.n} {self.origin}"

    @property
    def long(self) -> str:
        """The label naming its regime and n, or that the regime is not scored and what is shown instead."""
        mine = self.regime.text
        if self.own:
            return f"{self.what} {self.figure} in {mine}"
        if self.regime.gpu_class == "cpu":
            return f"{self.what}: not scored in {mine} (n={self.regime_n} < {MIN_N})"
        if self.source is None and self.scored:
            return f"{self.what}: not scored in {mine} (n={self.regime_n} < {MIN_N}); every regime: {self.figure}"
        if not self.scored:
            return f"{self.what}: not scored in {mine} (n={self.regime_n}), nor in any regime near it"
        assert self.source is not None
        if self.source.gpu_class != self.regime.gpu_class:
            head = f"not scored on {self.regime.gpu_class} cards (n={self.regime_n} < {MIN_N} in {mine})"
        else:
            head = f"not scored in {mine} (n={self.regime_n} < {MIN_N})"
        return f"{self.what}: {head}; nearest regime {self.source.text}: {self.figure}"


@dataclass(frozen=True)
class FitLabel:
    """How often a fit was called wrong in the trial's regime (or the nearest scored one), each
    way apart: runs that ran but were predicted not to fit, OOMs predicted to fit."""

    regime: Regime
    false_no: tuple[int, int, str] | None
    """(predicted not to fit, of so many that ran, which rows), or None: too few scored."""
    false_yes: tuple[int, int, str] | None
    """(predicted to fit, of so many OOMs, which rows), or None: too few scored."""
    note: str = ""
    """A summary published before fits were counted each way: its one figure, said so."""

    @property
    def text(self) -> str:
        def part(x: tuple[int, int, str] | None) -> str:
            return f"{x[0]} of {x[1]} {x[2]}" if x else f"not scored (fewer than {MIN_N})"

        no, yes = part(self.false_no), part(self.false_yes)
        head = f'false "does not fit" on runs that ran: {no}; false "fits" on OOMs: {yes}'
        return f"{head}; {self.note}" if self.note else head


def _summaries(device: str) -> list[tuple[str, dict]]:
    """(origin, summary) to read for `device`, in the order a label prefers them."""
    kinds = ("cuda", "cuda-published") if device == "cuda" else (device,)
    return [(ORIGINS.get(k, f"{k} trials"), s) for k in kinds if (s := published_error(k))]


def _entry(summary: dict, r: Regime) -> dict:
    return (summary.get("by_regime") or {}).get(r.key) or {}


def _stats_of(entry: dict, quantity: str, kind: str) -> dict:
    if quantity == "step":
        return entry.get("step_time_err_pct") or {}
    return (entry.get("memory_err_pct_by_kind") or {}).get(kind) or {}


def _label(r: Regime, quantity: str, kind: str, st: dict, origin: str, source, own: bool, regime_n: int):
    return ErrorLabel(quantity, r, source, st["n"], st["median"], st.get("p90"), own, origin, regime_n, kind)


def error_label(t: Trial, quantity: str, n_params: int, memory_kind: str = "nvidia-smi") -> ErrorLabel:
    """The error label of `t`'s predicted `quantity` (step or memory; memory of `memory_kind`,
    `suite.predict.MEMORY_KINDS`), for a model of `n_params` parameters (`n_params_of`)."""
    if quantity not in QUANTITIES:
        raise ValueError(f"quantity {quantity!r}: allowed {', '.join(QUANTITIES)}")
    if memory_kind not in MEMORY_KINDS:
        raise ValueError(f"memory_kind {memory_kind!r}: allowed {', '.join(MEMORY_KINDS)}")
    mine = regime(t, n_params)
    kind = memory_kind if quantity == "memory" and t.hardware.device == "cuda" else ""
    sources = _summaries(t.hardware.device)
    if t.hardware.device != "cuda":  # one regime: this machine's workers
        origin, s = sources[0] if sources else ("CPU trials", {})
        st = s.get("step_time_err_pct" if quantity == "step" else "peak_mem_err_pct") or {}
        n = st.get("n") or 0
        if n >= MIN_N:
            return _label(mine, quantity, kind, st, origin, mine, True, n)
        return ErrorLabel(quantity, mine, None, 0, None, None, False, origin, n, kind)

    def first(r: Regime) -> tuple[dict, str, Regime] | None:
        for level in r.levels():
            for origin, s in sources:
                st = _stats_of(_entry(s, level), quantity, kind)
                if (st.get("n") or 0) >= MIN_N:
                    return st, origin, level
        return None

    regime_n = max((_stats_of(_entry(s, mine), quantity, kind).get("n") or 0 for _, s in sources), default=0)
    found = first(mine)
    if found:
        st, origin, level = found
        return _label(mine, quantity, kind, st, origin, level, level == mine, regime_n)
    if quantity == "memory":  # the kind's figure over every regime, said so
        for origin, s in sources:
            st = (s.get("memory_err_pct_by_kind") or {}).get(kind) or {}
            if (st.get("n") or 0) >= MIN_N:
                return _label(mine, quantity, kind, st, origin, None, False, regime_n)
        return ErrorLabel(quantity, mine, None, 0, None, None, False, "", regime_n, kind)
    for other in NEAREST_CLASS.get(mine.gpu_class, ()):
        found = first(replace(mine, gpu_class=other))
        if found:
            st, origin, level = found
            return _label(mine, quantity, kind, st, origin, level, False, regime_n)
    return ErrorLabel(quantity, mine, None, 0, None, None, False, "", regime_n, kind)


def fit_label(t: Trial, n_params: int) -> FitLabel:
    """False "does not fit" (of runs that ran) and false "fits" (of OOMs), each from the nearest
    level of `t`'s regime (`Regime.levels`, within its class) with MIN_N of them, suite trials first."""
    mine = regime(t, n_params)
    sources = _summaries(t.hardware.device)

    def find(total: str, wrong: str) -> tuple[int, int, str] | None:
        if t.hardware.device != "cuda":
            for origin, s in sources:
                f = s.get("fit") or {}
                if (f.get(total) or 0) >= MIN_N:
                    return f[wrong], f[total], f"{origin} of {mine.text}"
            return None
        for level in mine.levels():
            for origin, s in sources:
                f = _entry(s, level).get("fit") or {}
                if (f.get(total) or 0) >= MIN_N:
                    return f[wrong], f[total], f"{origin} in {level.text}"
        return None

    note = ""
    if t.hardware.device != "cuda" and sources and "fit" not in sources[0][1] and sources[0][1].get("fit_n"):
        s = sources[0][1]
        note = (
            f"fit or OOM called right in {s['fit_right_pct']:.0f}% of {s['fit_n']} {sources[0][0]} "
            "(published before the two ways were counted apart)"
        )
    return FitLabel(mine, find("ran", "false_no_fit"), find("oom", "false_fit"), note)
