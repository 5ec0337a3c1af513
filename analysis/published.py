"""Published time-to-train figures of Khandelwal et al. 2024 ("$100K or 100 Days") and what they imply.

Each figure is set beside the MFU it implies (the model's FLOPs per token, counted with
`suite.models.count_flops` as for every measured trial, against the GPU's dense peak from
`conf/hardware/`) and its owned-hardware cost, so a reader sees which published numbers are
physically plausible. These are published figures, never mixed with measured ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import pandas as pd

from analysis import estimates
from analysis.prices import Prices
from suite.config import Trial
from suite.config.compose import trial
from suite.metrics import peak_flops
from suite.predict.trace import model_flops

SOURCE = 'Khandelwal et al. 2024, "$100K or 100 Days", arXiv 2410.23261'


@dataclass(frozen=True)
class Published:
    model: str
    """Model config name in conf/model/."""
    gpu: str
    """GPU type in conf/hardware/; the paper's H100 peaks (756 TFLOP/s) are the PCIe card's."""
    n_gpus: int
    days: float
    note: str


PUBLISHED = (
    Published("pythia-1b", "a100-80gb", 4, 17.57, "best of all methods: ZeRO-1, mb 16 x GAS 16"),
    Published("pythia-1b", "h100-pcie", 4, 8.0, "about 8 days"),
    Published("pythia-1b", "h100-pcie", 8, 4.0, "about 4 days"),
    Published("pythia-1b", "rtx-3090", 2, 108.0, "about 108 days"),
)


def trial_for(p: Published) -> Trial:
    """The trial the paper's figure stands for: the model's recipe on its hardware, default methods."""
    return trial([f"model={p.model}", f"hardware={p.gpu}", f"hardware.count={p.n_gpus}"])


@cache
def flops_per_token(model: str) -> float:
    """A model's FLOPs (forward + backward) per unit of its task (a token, or an image) at its
    recipe's shape, counted on the meta device (a few seconds; then read from the predictor's
    cache, `suite.predict.trace.model_flops`)."""
    t = trial([f"model={model}"])
    return model_flops(t.model, "sdpa") / t.tokens_per_sample


def published_estimates(prices: Prices) -> pd.DataFrame:
    """One row per published figure, with the MFU it implies and its owned-hardware cost."""
    rows = []
    for p in PUBLISHED:
        t = trial_for(p)
        r = t.model.recipe
        flops = estimates.total_flops(r.train_steps, r.global_batch * t.tokens_per_sample, flops_per_token(p.model))
        mfu = estimates.implied_mfu(p.days, flops, p.n_gpus, peak_flops(t))
        hardware_usd = estimates.owned_hardware_usd(prices, p.gpu, p.n_gpus)
        rows.append(
            {
                "model": p.model,
                "hardware": t.hardware.name,
                "budget": t.hardware.name,
                "precision": t.precision,
                "published_days": p.days,
                "note": p.note,
                "model_flops_per_token": flops_per_token(p.model),
                "peak_tflops": peak_flops(t) / 1e12,
                "implied_mfu": mfu,
                "verdict": estimates.mfu_verdict(mfu),
                "owned_hardware_usd": hardware_usd,
                "owned_cost_usd": estimates.owned_cost_usd(hardware_usd, p.days, prices.amortization_years),
                "source": SOURCE,
            }
        )
    return pd.DataFrame(rows)
