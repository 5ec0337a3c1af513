"""Where the suite finds the files it ships and where it writes its own: the one owner of paths.

In a checkout (or an editable install) the Hydra configs are the repository's `conf/` and the
published prediction errors its `results/accuracy/`. A wheel (`pip install .`) carries both
inside the package, as `suite/conf/` and `suite/accuracy/` (pyproject.toml maps them), so the
commands work from any directory without a checkout.

What the suite writes on a machine (calibrations) goes under the checkout's `results/` when there
is one, else under `./results` of the working directory; `SUITE_CALIBRATION_DIR` overrides it.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
CHECKOUT = PACKAGE.parent if (PACKAGE.parent / "conf" / "config.yaml").is_file() else None
"""The repository this package runs from, or None for an installed wheel."""


def _shipped(packaged: str, in_checkout: str) -> Path:
    inside = PACKAGE / packaged
    if inside.is_dir() or CHECKOUT is None:
        return inside
    return CHECKOUT / in_checkout


def conf_dir() -> Path:
    """The Hydra config folder: model/, hardware/, prices/, experiment/, ..."""
    return _shipped("conf", "conf")


def accuracy_dir() -> Path:
    """The prediction errors `suite-report accuracy --publish` published, one JSON per device kind."""
    return _shipped("accuracy", "results/accuracy")


def publish_dir() -> Path:
    """Where `suite-report accuracy --publish` writes: the checkout's results/accuracy/ (what
    `accuracy_dir` reads there), or ./results/accuracy of an installed suite."""
    return results_dir() / "accuracy"


def results_dir() -> Path:
    """The checkout's results/ (or ./results of an installed suite): where machine-local files go."""
    return (CHECKOUT or Path.cwd()) / "results"


def calibration_dir() -> Path:
    """Where `suite-predict calibrate` keeps this machine's constants, per host."""
    return Path(os.environ.get("SUITE_CALIBRATION_DIR") or results_dir() / "calibration")


def cache_dir() -> Path:
    """Derived facts kept between runs (traces, architecture facts): `SUITE_CACHE_DIR`, default
    ~/.cache/suite. Each entry's name is a hash of everything it was derived from."""
    return Path(os.environ.get("SUITE_CACHE_DIR") or Path.home() / ".cache" / "suite")
