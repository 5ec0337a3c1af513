"""The one owner of the time-to-train and cost formulas.

    days               = train_steps * step_time_s / 86400
    gpu_hours          = days * 24 * n_gpus
    cloud_cost_usd     = gpu_hours * usd_per_gpu_hour[gpu]
    owned_hardware_usd = n_nodes * (node_base_usd[gpus_per_node] + gpus_per_node * gpu_price_usd[gpu])
    owned_cost_usd     = owned_hardware_usd * days / (amortization_years * 365)
    total_flops        = train_steps * tokens_per_step * model_flops_per_token
    analytic_days      = total_flops / (n_gpus * peak_flops * mfu * 86400)   (predicted, FLOPs only)
    implied_mfu        = analytic_days at 100% MFU / days                    (of a published time)
    speedup_pct        = (naive step_time_s / best step_time_s - 1) * 100
    energy_kwh         = power_w * n_gpus * days * 24 * pue / 1000         (board power at its maximum)
    electricity_usd    = energy_kwh * usd_per_kwh
    co2e_kg            = energy_kwh * grid_g_per_kwh / 1000
    error_band         = [x / (1 + e), x / (1 - e)]   where x would lie were a prediction's |error| e

`add_estimates` adds to a frame from `analysis.load` (NaN wherever an input is missing:
a trial that did not run, a CPU with no peak or price, a GPU without a price row):

    gpu                      profile key of the GPU (a100-80gb), "" on CPU
    days, gpu_days, gpu_hours                        at the median step time
    days_lo, days_hi, gpu_hours_lo, gpu_hours_hi,    the same formulas at the ends of the
    cloud_cost_lo_usd, cloud_cost_hi_usd,            interval of the median step time
    owned_cost_lo_usd, owned_cost_hi_usd             (equal to the median's for a single run)
    original_gpu_days        GPUs x days of the model's original run
    gpu_days_vs_original     gpu_days / original_gpu_days
    cloud_usd_per_gpu_hour, cloud_price_source, cloud_cost_usd
    owned_hardware_usd, owned_cost_usd
    peak_tflops              dense peak of one device at the trial's precision (suite.metrics)
    analytic_mfu             the MFU stated for the FLOPs-only estimate (a fraction)
    analytic_days            predicted days from FLOPs alone at analytic_mfu; never mixed with `days`
"""

from __future__ import annotations

import math

import pandas as pd

from analysis import ReportError
from analysis.load import Results
from analysis.prices import Prices, gpu_keys
from suite.config import Trial
from suite.metrics import peak_flops

SECONDS_PER_DAY = 86_400
DAYS_PER_YEAR = 365
ANALYTIC_MFU = 0.5
"""Default MFU of the FLOPs-only estimate: well-tuned published runs reach 46-64% (MosaicML
llm-foundry's benchmarks, 7B on 8x H100 and on 8x A100-80GB)."""
PLAUSIBLE_MFU = 0.65
"""Above this a time is implausible: the best published run we know of reaches 64.2% (llm-foundry,
7B on 8x A100-80GB)."""


def training_days(step_time_s, train_steps):
    return train_steps * step_time_s / SECONDS_PER_DAY


def gpu_hours(days, n_gpus):
    return days * 24 * n_gpus


def cloud_cost_usd(gpu_hours, usd_per_gpu_hour):
    return gpu_hours * usd_per_gpu_hour


def owned_hardware_usd(prices: Prices, gpu: str, gpus_per_node: int, n_nodes: int = 1) -> float:
    """Purchase price of `n_nodes` nodes of `gpus_per_node` GPUs; NaN where the paper gives no price."""
    if gpus_per_node not in prices.node_base_usd or gpu not in prices.gpu_price_usd:
        return math.nan
    return n_nodes * (prices.node_base_usd[gpus_per_node] + gpus_per_node * prices.gpu_price_usd[gpu])


def owned_cost_usd(hardware_usd, days, amortization_years):
    return hardware_usd * days / (amortization_years * DAYS_PER_YEAR)


def total_flops(train_steps, tokens_per_step, flops_per_token):
    return train_steps * tokens_per_step * flops_per_token


def analytic_days(flops, n_gpus, peak_flops_per_gpu, mfu=1.0):
    return flops / (n_gpus * peak_flops_per_gpu * mfu * SECONDS_PER_DAY)


def implied_mfu(days, flops, n_gpus, peak_flops_per_gpu):
    """The MFU a training time implies: the time at 100% MFU over the time given."""
    return analytic_days(flops, n_gpus, peak_flops_per_gpu) / days


def speedup_pct(naive_step_time_s, best_step_time_s):
    """How much faster the best configuration trains than the naive one, in percent."""
    return (naive_step_time_s / best_step_time_s - 1) * 100


def energy_kwh(power_w, n_gpus, days, pue):
    """Energy of `n_gpus` boards at `power_w` for `days`, with the facility's overhead (PUE)."""
    return power_w * n_gpus * days * 24 * pue / 1000


def electricity_usd(kwh, usd_per_kwh):
    return kwh * usd_per_kwh


def co2e_kg(kwh, grid_g_per_kwh):
    return kwh * grid_g_per_kwh / 1000


def error_band(x, err_pct):
    """Where a measurement lies if a prediction `x` is off by |error| `err_pct` percent, (predicted -
    measured) / measured: (x / (1 + e), x / (1 - e)), the high end NaN from 100% on (a Series or a number)."""
    e = err_pct / 100
    lo, hi = x / (1 + e), x / (1 - e)
    if isinstance(hi, pd.Series):
        return lo, hi.where(e < 1)
    return lo, hi if e < 1 else math.nan


def mfu_verdict(mfu: float) -> str:
    if math.isnan(mfu):  # no peak known
        return "n/a"
    if mfu > 1:
        return "impossible: above 100% of peak"
    if mfu > PLAUSIBLE_MFU:
        return f"implausible: above {PLAUSIBLE_MFU:.0%}, the best published runs"
    return "plausible"


def _peak_tflops(trial: dict) -> float:
    peak = peak_flops(Trial.from_json(trial))
    return peak / 1e12 if peak else math.nan


def add_estimates(df: pd.DataFrame, prices: Prices, analytic_mfu: float = ANALYTIC_MFU) -> pd.DataFrame:
    """`df` with the estimate columns of this module's docstring added."""
    out = df.copy()
    keys = gpu_keys()
    out["gpu"] = [
        keys.get(name, "") if dev == "cuda" else "" for name, dev in zip(out["gpu_name"], out["device"], strict=True)
    ]
    cloud = [prices.cloud.get(g) for g in out["gpu"]]
    out["cloud_usd_per_gpu_hour"] = [c.usd_per_gpu_hour if c else math.nan for c in cloud]
    out["cloud_price_source"] = [f"{c.provider}, {c.source} ({c.date})" if c else "" for c in cloud]
    out["owned_hardware_usd"] = [
        owned_hardware_usd(prices, g, n, nodes)
        for g, n, nodes in zip(out["gpu"], out["gpus_per_node"], out["n_nodes"], strict=True)
    ]
    # The median and both ends of its interval go through the same formulas.
    for end, step_col in (("", "step_time_s"), ("_lo", "step_time_ci_lo_s"), ("_hi", "step_time_ci_hi_s")):
        days = training_days(out[step_col].astype(float), out["train_steps"])
        out[f"days{end}"] = days
        out[f"gpu_hours{end}"] = gpu_hours(days, out["n_gpus"])
        out[f"cloud_cost{end}_usd"] = cloud_cost_usd(out[f"gpu_hours{end}"], out["cloud_usd_per_gpu_hour"])
        out[f"owned_cost{end}_usd"] = owned_cost_usd(out["owned_hardware_usd"], days, prices.amortization_years)
    out["gpu_days"] = out["days"] * out["n_gpus"]
    original = (out["original_gpus"] * out["original_days"]).astype(float)
    out["original_gpu_days"] = original.where(original > 0)
    out["gpu_days_vs_original"] = out["gpu_days"] / out["original_gpu_days"]
    out["peak_tflops"] = [_peak_tflops(t) for t in out["trial"]]
    out["analytic_mfu"] = analytic_mfu
    flops = total_flops(
        out["train_steps"], out["tokens_per_step"].astype(float), out["model_flops_per_token"].astype(float)
    )
    out["analytic_days"] = analytic_days(flops, out["n_gpus"], out["peak_tflops"] * 1e12, analytic_mfu)
    return out


def estimated_results(results: Results, prices: Prices, analytic_mfu: float = ANALYTIC_MFU) -> pd.DataFrame:
    """The frame of `results` (`analysis.load.read_results`) with its estimates; ReportError when
    it has no row, or the MFU asked for is not a fraction."""
    if not 0 < analytic_mfu <= 1:
        raise ReportError(f"--analytic-mfu={analytic_mfu} must be a fraction in (0, 1], e.g. 0.5")
    if results.frame.empty:
        raise ReportError(
            f"no trial results under {results.path}; run suite-bench first (results land in results/runs)"
        )
    return add_estimates(results.frame, prices, analytic_mfu)
