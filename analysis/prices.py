"""The price tables in `conf/prices/` and the GPU types (`conf/hardware/`) they are keyed by.

`cloud.yaml`: price per GPU-hour with a provider, source and date on every row.
`owned.yaml`: Khandelwal et al. 2024's purchase prices (node base by GPU count, price per GPU) and
the amortization period. Both are checked on load; every problem is reported at once.
A record names its GPU by the datasheet name in `hardware.gpu`; `gpu_keys()` maps that
name back to the profile key (`a100-80gb`) the price tables use.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from analysis import ReportError
from suite import paths
from suite.config.compose import gpu_profiles

PRICES_DIR = paths.conf_dir() / "prices"
CLOUD_FIELDS = ("usd_per_gpu_hour", "provider", "source", "date")


@dataclass(frozen=True)
class CloudPrice:
    usd_per_gpu_hour: float
    provider: str
    source: str
    date: str


@dataclass(frozen=True)
class Prices:
    cloud: dict[str, CloudPrice]
    """GPU profile key -> on-demand price per GPU-hour."""
    node_base_usd: dict[int, float]
    """GPUs in the node -> price of the node without its GPUs."""
    gpu_price_usd: dict[str, float]
    """GPU profile key -> purchase price of one GPU."""
    amortization_years: float
    owned_source: str


def gpu_keys() -> dict[str, str]:
    """Datasheet GPU name (as in a record's `hardware.gpu`) -> GPU type (a100-80gb)."""
    return {d["gpu"]: key for key, d in gpu_profiles().items()}


def _load_yaml(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise ReportError(f"price table {path} is missing")
    data = OmegaConf.to_container(OmegaConf.load(path))
    if not isinstance(data, dict):
        raise ReportError(f"price table {path} is not a mapping")
    return data


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def load_prices(prices_dir: str | Path = PRICES_DIR) -> Prices:
    d = Path(prices_dir)
    cloud_raw, owned = _load_yaml(d / "cloud.yaml"), _load_yaml(d / "owned.yaml")
    known = set(gpu_keys().values())
    problems: list[str] = []

    def check_gpu(where: str, key: str) -> None:
        if key not in known:
            problems.append(
                f"{where}: {key!r} is not a GPU profile in conf/hardware/; use one of {', '.join(sorted(known))}"
            )

    cloud = {}
    for key, entry in (cloud_raw.get("gpus") or {}).items():
        where = f"{d / 'cloud.yaml'} gpus.{key}"
        check_gpu(where, key)
        entry = entry if isinstance(entry, dict) else {}
        missing = [f for f in CLOUD_FIELDS if entry.get(f) in (None, "")]
        if missing:
            problems.append(f"{where}: needs {', '.join(missing)}")
        elif not _positive(entry["usd_per_gpu_hour"]):
            problems.append(f"{where}: usd_per_gpu_hour={entry['usd_per_gpu_hour']!r} must be a number > 0")
        else:
            cloud[key] = CloudPrice(float(entry["usd_per_gpu_hour"]), *(str(entry[f]) for f in CLOUD_FIELDS[1:]))

    where = d / "owned.yaml"
    for field in ("source", "date", "amortization_years", "node_base_usd", "gpu_price_usd"):
        if owned.get(field) in (None, "", {}):
            problems.append(f"{where}: needs {field}")
    tables = {"node_base_usd": owned.get("node_base_usd") or {}, "gpu_price_usd": owned.get("gpu_price_usd") or {}}
    for name, table in tables.items():
        for key, usd in table.items():
            if name == "node_base_usd" and not isinstance(key, int):
                problems.append(f"{where}: node_base_usd key {key!r} must be a GPU count (1, 2, 4, 8)")
            if not _positive(usd):
                problems.append(f"{where}: {name}.{key}={usd!r} must be a number > 0")
    for key in tables["gpu_price_usd"]:
        check_gpu(f"{where} gpu_price_usd", key)
    if owned.get("amortization_years") is not None and not _positive(owned["amortization_years"]):
        problems.append(f"{where}: amortization_years={owned['amortization_years']!r} must be a number > 0")
    if problems:
        raise ReportError("the price tables have problems:\n  - " + "\n  - ".join(problems))
    return Prices(
        cloud=cloud,
        node_base_usd={int(k): float(v) for k, v in tables["node_base_usd"].items()},
        gpu_price_usd={k: float(v) for k, v in tables["gpu_price_usd"].items()},
        amortization_years=float(owned["amortization_years"]),
        owned_source=f"{owned['source']} ({owned['date']})",
    )
