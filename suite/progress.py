"""Progress of a sweep or search: trial i of N, current best, elapsed, estimated time left.

On a terminal a status line ticks while a trial runs; in a non-interactive log only the
lines of finished trials are printed.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any


def clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class Progress:
    def __init__(self, total: int | None = None, stream=None):
        self.total = total
        self.stream = stream or sys.stdout
        self.live = self.stream.isatty()
        self.start = time.monotonic()
        self.done = 0
        self.best: dict[tuple[str, str], tuple[float, str]] = {}  # (model, hardware) -> (step s, methods)
        self._stop: threading.Event | None = None

    def status(self) -> str:
        elapsed = time.monotonic() - self.start
        n = f"{self.done}/{self.total}" if self.total else f"{self.done}"
        eta = ""
        if self.total and self.done:
            eta = f", ~{clock(elapsed / self.done * (self.total - self.done))} left"
        best = "".join(f"; best {m} on {h}: {s:.3f} s/step ({w})" for (m, h), (s, w) in self.best.items())
        return f"{n} trials done, {clock(elapsed)} elapsed{eta}{best}"

    def begin(self, what: str) -> None:
        """Start the ticking status line (terminals only)."""
        if not self.live:
            return
        stop = self._stop = threading.Event()
        began = time.monotonic()

        def tick() -> None:
            while not stop.wait(1.0):
                line = f"running {what} ({time.monotonic() - began:.0f} s) | {self.status()}"
                self.stream.write("\r\033[K" + line[:160])
                self.stream.flush()

        threading.Thread(target=tick, daemon=True).start()

    def end(self, rec: dict[str, Any], line: str) -> None:
        """Record a finished trial and print its line and the sweep's status."""
        if self._stop is not None:
            self._stop.set()
            self.stream.write("\r\033[K")
        self.done += 1
        if rec["outcome"] == "ok":
            t, m = rec["trial"], rec["metrics"]
            key = (t["model"]["name"], t["hardware"]["name"])
            if key not in self.best or m["step_time_s"] < self.best[key][0]:
                me = t["methods"]
                what = f"zero{me['zero_stage']} offload={me['offload']} rc={me['recompute']} mb={me['micro_batch']}"
                self.best[key] = (m["step_time_s"], what)
        self.stream.write(f"{line}\n    [{self.status()}]\n")
        self.stream.flush()
