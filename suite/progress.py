"""Progress of a sweep or search: trial i of N, current best, elapsed, estimated time left.

On a terminal, rich's live display keeps a status line ticking below the finished trials'
lines (what runs, how long, the best so far, the time left); in a log (not a terminal) each
finished trial's line is followed by that status as a line of text.
"""

from __future__ import annotations

import atexit
import sys
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.progress import Progress as Live

from suite.labels import methods_label
from suite.record import Record


def clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class Progress:
    def __init__(self, total: int | None = None, stream=None):
        self.total = total
        self.stream = stream or sys.stdout
        self.start = time.monotonic()
        self.done = 0
        self.best: dict[tuple[str, str], tuple[float, str]] = {}  # (model, hardware) -> (step s, methods)
        self.live = None
        if self.stream.isatty():
            console = Console(file=self.stream, highlight=False, soft_wrap=True)
            columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
            self.live = Live(*columns, TimeRemainingColumn(), TextColumn("{task.fields[best]}"), console=console)
            self.task = self.live.add_task("", total=total, best="")
            atexit.register(self.live.stop)  # restores the terminal however the sweep ends

    def _best(self) -> str:
        return "".join(f"; best {m} on {h}: {s:.3f} s/step ({w})" for (m, h), (s, w) in self.best.items())

    def status(self) -> str:
        elapsed = time.monotonic() - self.start
        n = f"{self.done}/{self.total}" if self.total else f"{self.done}"
        eta = ""
        if self.total and self.done:
            eta = f", ~{clock(elapsed / self.done * (self.total - self.done))} left"
        return f"{n} trials done, {clock(elapsed)} elapsed{eta}{self._best()}"

    def begin(self, what: str) -> None:
        """Show what runs now (terminals only)."""
        if self.live is not None:
            self.live.start()
            self.live.update(self.task, description=f"running {what}")

    def end(self, rec: Record, line: str) -> None:
        """Record a finished trial and print its line and the sweep's status."""
        self.done += 1
        if rec.ok:
            t = rec.trial
            key = (t.model.name, t.hardware.name)
            if key not in self.best or rec.step_time_s < self.best[key][0]:
                self.best[key] = (rec.step_time_s, f"{methods_label(t)} mb={t.methods.micro_batch}")
        if self.live is None:
            self.stream.write(f"{line}\n    [{self.status()}]\n")
            self.stream.flush()
            return
        self.live.console.print(line, markup=False)
        self.live.update(self.task, completed=self.done, description="", best=self._best())
        if self.total and self.done >= self.total:
            self.live.stop()
