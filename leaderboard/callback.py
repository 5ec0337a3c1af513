"""A Hydra callback that writes the leaderboard when a sweep ends: the CPU demo's last step.

    hydra:
      callbacks:
        leaderboard:
          _target_: leaderboard.callback.WriteLeaderboard

The page covers every result in `store.dir` and is written next to them (or to `out`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from analysis.load import read_results
from leaderboard.page import write_leaderboard


class WriteLeaderboard(Callback):
    """Writes the page to `out`, by default `<store.dir>/leaderboard.html`, and prints its path."""

    def __init__(self, out: str | None = None) -> None:
        self.out = out

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        results = Path(config.store.dir)
        path, _ = write_leaderboard(read_results(results), self.out or results / "leaderboard.html")
        print(f"Leaderboard: {path.resolve()}  (open it in a browser)", flush=True)
