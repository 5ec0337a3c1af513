"""W&B: one run per measured trial, grouped by sweep, tagged by model and hardware.

Offline by default (`wandb sync DIR/wandb/offline-run-*` uploads later). Tracking is a
side channel: any W&B failure is a warning and never changes the trial's outcome.
"""

from __future__ import annotations

import sys
from typing import Any

from suite.record import Record


def scalar_summary(rec: Record) -> dict[str, Any]:
    out = {"outcome": rec.outcome, "message": rec.message, "trial_id": rec.trial_id, "wall_s": rec.wall_s}
    out.update({k: v for k, v in rec.metrics.items() if isinstance(v, (int, float, bool, str)) or v is None})
    return out


def log_trial(rec: Record, mode: str, project: str, directory: str) -> None:
    if mode == "disabled":
        return
    try:
        import os

        import wandb

        os.makedirs(directory, exist_ok=True)
        t = rec.trial_json
        run = wandb.init(
            project=project,
            mode=mode,
            dir=directory,
            group=rec.sweep,
            job_type="trial",
            name=f"{t['model']['name']}/{t['hardware']['name']}/{rec.trial_id}",
            tags=[t["model"]["name"], t["hardware"]["name"], rec.outcome],
            config=t | {"trial_id": rec.trial_id, "sweep": rec.sweep},
            reinit="finish_previous",
            settings=wandb.Settings(silent=True, console="off"),
        )
        run.summary.update(scalar_summary(rec))
        run.finish()
    except Exception as e:  # noqa: BLE001 - tracking must never fail a trial
        print(f"warning: W&B logging failed, the trial result is kept: {type(e).__name__}: {e}", file=sys.stderr)
