"""The results store: one JSON file per trial, named by the trial id, written atomically.

A file is written to a unique temporary name in the same directory and renamed, so
readers never see a torn file and concurrent writers (several jobs) never corrupt each
other. Each record holds the resolved trial, the outcome, the metrics and provenance.

Jobs that share a store (a grid on Slurm, a resumed search) claim a trial before
measuring it (`claim`), so each trial is measured once: a second claimant waits for the
first and then finds the result.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import platform
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from suite.config import Trial

SCHEMA = "suite.trial/1"
PACKAGES = ("torch", "deepspeed", "transformers", "hydra-core", "flash-attn", "wandb")
CLAIM_SLACK_S = 60.0  # a holder ends within its trial's timeout plus this (start-up, store writes)


class Busy(RuntimeError):
    """Another process has held a trial for longer than that trial may take."""


def path_for(store_dir: str | Path, trial_id: str) -> Path:
    return Path(store_dir) / f"{trial_id}.json"


def load(store_dir: str | Path, trial_id: str) -> dict[str, Any] | None:
    p = path_for(store_dir, trial_id)
    if not p.exists():
        return None
    with open(p) as f:
        return json.load(f)


def save(store_dir: str | Path, record: dict[str, Any]) -> Path:
    d = Path(store_dir)
    d.mkdir(parents=True, exist_ok=True)
    target = path_for(d, record["trial_id"])
    fd, tmp = tempfile.mkstemp(dir=d, prefix=f".{record['trial_id']}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, target)
    return target


@contextmanager
def claim(store_dir: str | Path, trial_id: str, timeout_s: float) -> Iterator[None]:
    """Hold `trial_id` while this process checks the store for it and measures it.

    An advisory lock (`flock`) on STORE/.claims/ID.lock: the kernel drops it when its holder
    ends in any way (SIGKILL, `scancel`), so a dead job never blocks a trial. A claimant waits
    at most the trial's `timeout_s` plus CLAIM_SLACK_S, then raises `Busy` naming the holder.
    The store needs a filesystem with working locks (local, NFSv4, Lustre mounted `-o flock`).
    """
    d = Path(store_dir) / ".claims"
    d.mkdir(parents=True, exist_ok=True)
    wait_s = timeout_s + CLAIM_SLACK_S
    deadline = time.monotonic() + wait_s
    with open(d / f"{trial_id}.lock", "a+") as f:
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    f.seek(0)
                    holder = f.read().strip() or "another process"
                    raise Busy(f"trial {trial_id} is still held by {holder} after {wait_s:g} s") from None
                time.sleep(0.2)
        f.seek(0)
        f.truncate()
        job = os.environ.get("SLURM_JOB_ID")
        f.write(f"pid {os.getpid()} on {socket.gethostname()}" + (f", Slurm job {job}" if job else "") + "\n")
        f.flush()
        yield  # closing the file releases the lock


def record(t: Trial, sweep: str, outcome: str, message: str, metrics: dict, wall_s: float) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "trial_id": t.id,
        "sweep": sweep,
        "outcome": outcome,
        "message": message,
        "trial": t.to_dict(),
        "metrics": metrics,
        "wall_s": wall_s,
        "provenance": provenance(t.hardware.device),
    }


def _version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def _run(cmd: list[str], cwd: str | None = None) -> str | None:
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


@cache
def _static_provenance() -> dict[str, Any]:
    repo = str(Path(__file__).resolve().parent.parent)
    rev = _run(["git", "rev-parse", "HEAD"], cwd=repo)
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo)
    return {
        "python": platform.python_version(),
        "versions": {p: _version(p) for p in PACKAGES},
        "git_revision": rev,
        "git_dirty": bool(dirty) if rev else None,
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
    }


@cache
def _cuda_provenance() -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        return {"cuda": None, "driver": None, "devices": []}
    driver = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    return {
        "cuda": torch.version.cuda,
        "driver": driver.splitlines()[0] if driver else None,
        "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
    }


def provenance(device: str) -> dict[str, Any]:
    p = dict(_static_provenance())
    p["date"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    p.update(_cuda_provenance() if device == "cuda" else {"cuda": None, "driver": None, "devices": ["cpu"]})
    return p
