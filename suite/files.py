"""Writing files so that a reader never sees a part of one: the one writer of the results store,
the architecture cache, the predictor's caches and calibrations, and the workers' reports.

A file is written to a unique temporary name in its own folder and renamed over the target
(`write_atomic`): a reader sees the old file or the new one, and concurrent writers (several
jobs, several threads) never corrupt each other. This module imports nothing of the suite, so
any layer can write through it.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_atomic(path: str | Path, text: str, durable: bool = False) -> Path:
    """Write `text` to `path` through a unique temporary file in the same folder and a rename:
    a reader sees the old file or the new one, never a part, whoever else writes it at once.
    `durable`: flushed to disk before the rename (a result that must survive a crash)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, target)
    return target


def write_json(
    path: str | Path, obj: Any, indent: int | None = None, sort_keys: bool = False, durable: bool = False
) -> Path:
    """`obj` as JSON, written atomically (`write_atomic`)."""
    return write_atomic(path, json.dumps(obj, indent=indent, sort_keys=sort_keys), durable)
