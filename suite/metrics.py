"""Step time, throughput, MFU/HFU and memory figures of one trial: the one owner of them.

    step_time = (GAS - 1) * t_micro + t_boundary + t_optimizer     (steady state)
    MFU = model_flops_per_token * tokens_per_s / (n_devices * peak_flops[dtype])

A "token" is the task's unit (`Trial.unit`): a text token, or a whole image for image tasks.

MFU never counts recomputation; HFU does. An MFU above 100% means the timing is wrong,
so it raises instead of producing a record.
"""

from __future__ import annotations

import statistics
from typing import Any

from suite.config import Trial
from suite.models.arch import attention

NOISY_CV = 0.05  # a timed window whose step times vary more than 5% is flagged


class ImplausibleTiming(RuntimeError):
    pass


def peak_flops(t: Trial) -> float | None:
    """Dense peak FLOP/s of one device at the trial's precision, or None if not known."""
    key = {"fp32": "tf32" if t.tf32 else "fp32"}.get(t.precision, t.precision)
    tflops = t.hardware.peak_tflops.get(key)
    return tflops * 1e12 if tflops else None


def _spread(xs: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(xs),
        "std": statistics.stdev(xs) if len(xs) > 1 else 0.0,
        "min": min(xs),
        "max": max(xs),
        "n": len(xs),
    }


def step_metrics(
    t: Trial,
    micro_s: list[list[float]],
    boundary_s: list[float],
    optimizer_s: list[float],
    flops_per_sample: float,
    hw_flops_per_sample: float,
) -> dict[str, Any]:
    """Metrics from the slowest rank's timings of each timed step.

    micro_s[i] holds step i's non-boundary micro-step times (GAS_measured - 1 of them).
    Each timed step gives one estimate of the full step at the recipe's GAS.
    """
    gas = t.gas
    estimates = []
    for micro, boundary, opt in zip(micro_s, boundary_s, optimizer_s, strict=True):
        t_micro = statistics.fmean(micro) if micro else boundary
        estimates.append((gas - 1) * t_micro + boundary + opt)
    step = _spread(estimates)
    all_micro = [x for m in micro_s for x in m]
    out: dict[str, Any] = {
        "step_time_s": step["mean"],
        "step_time_std_s": step["std"],
        "step_time_min_s": step["min"],
        "step_time_max_s": step["max"],
        "timed_steps": step["n"],
        "noisy": step["std"] > NOISY_CV * step["mean"],
        "extrapolated": t.gas_measured < gas,
        "gas": gas,
        "gas_measured": t.gas_measured,
        "micro_time_s": statistics.fmean(all_micro) if all_micro else None,
        "boundary_time_s": statistics.fmean(boundary_s),
        "optimizer_time_s": statistics.fmean(optimizer_s),
        "tokens_per_step": t.model.recipe.global_batch * t.tokens_per_sample,
        "model_flops_per_token": flops_per_sample / t.tokens_per_sample,
        "hardware_flops_per_token": hw_flops_per_sample / t.tokens_per_sample,
    }
    out.update(rates(t, step["mean"], out["model_flops_per_token"], out["hardware_flops_per_token"]))
    return out


def rates(
    t: Trial, step_time_s: float, model_flops_per_token: float, hardware_flops_per_token: float
) -> dict[str, Any]:
    """Throughput and utilization at a step time: one run's mean, or the median of a trial's runs."""
    samples_per_step = t.model.recipe.global_batch
    tokens_per_s = samples_per_step * t.tokens_per_sample / step_time_s
    out: dict[str, Any] = {
        "tokens_per_s": tokens_per_s,
        "tokens_per_s_per_device": tokens_per_s / t.devices,
        "samples_per_s": samples_per_step / step_time_s,
        "mfu": None,
        "hfu": None,
        # What ran, where it differs from what was asked (Trial.precision, suite.models.arch.attention).
        "precision": t.precision,
        "attention": attention(t),
    }
    peak = peak_flops(t)
    if peak:
        denom = t.devices * peak
        out["mfu"] = model_flops_per_token * tokens_per_s / denom
        out["hfu"] = hardware_flops_per_token * tokens_per_s / denom
        if out["mfu"] > 1.0:
            raise ImplausibleTiming(
                f"implied MFU {out['mfu']:.0%} exceeds 100% of {t.hardware.name}'s peak: the timing is wrong"
            )
    return out


def memory(per_rank: list[dict[str, Any]], cuda: bool) -> dict[str, Any]:
    """The trial's memory figures from each rank's peaks (worker.peaks): the largest rank's.

    `peak_*` are the timed window's, `build_peak_*` those of building and initializing the model
    and engine, each window's peaks reset at its start. A GPU's figures are allocated and reserved
    device memory; a CPU worker's "device" memory is its resident set above the runtime it
    imported before the build (`host_base_gib`), and it has no reserved figure. `host_peak_gib`
    is the largest resident set of any rank in the timed window, the runtime included: the host
    memory a trial needs, which offload raises.
    """

    def top(key: str) -> float:
        return max(m[key] for m in per_rank)

    if cuda:
        device = {
            "peak_mem_gib": top("allocated_gib"),
            "peak_reserved_gib": top("reserved_gib"),
            "build_peak_mem_gib": top("build_allocated_gib"),
            "build_peak_reserved_gib": top("build_reserved_gib"),
        }
    else:
        device = {
            "peak_mem_gib": max(m["host_peak_gib"] - m["host_base_gib"] for m in per_rank),
            "peak_reserved_gib": None,
            "build_peak_mem_gib": max(m["build_host_peak_gib"] - m["host_base_gib"] for m in per_rank),
            "build_peak_reserved_gib": None,
        }
    return {**device, "host_peak_gib": top("host_peak_gib")}


def nvme(per_rank: list[dict[str, float]]) -> dict[str, Any]:
    """The NVMe tier's traffic from each rank's storage counters over the timed window
    (`suite.worker.io_bytes`): bytes read and written per step, summed over the ranks (what the
    drives moved), and the bandwidth that achieved over the window, bytes over its seconds (the
    slowest rank's window): the drive's load averaged over training, not its peak while swapping."""
    steps = max(r["steps"] for r in per_rank)
    seconds = max(r["window_s"] for r in per_rank)
    read = sum(r["read_bytes"] for r in per_rank)
    written = sum(r["write_bytes"] for r in per_rank)
    return {
        "nvme_read_bytes_per_step": read / steps,
        "nvme_write_bytes_per_step": written / steps,
        "nvme_read_gbps": read / seconds / 1e9,
        "nvme_write_gbps": written / seconds / 1e9,
    }
