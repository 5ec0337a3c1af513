"""The results store: one JSON file per trial record, named by the trial id, written atomically,
and claims that let jobs sharing a store measure each run once.

A record is written atomically (`suite.files.write_json`: a unique temporary file in the same
folder, then a rename), so readers never see a torn file and concurrent writers (several jobs)
never corrupt each other. What a record holds is `suite.record`'s.

Jobs that share a store (a grid on Slurm, a resumed search) claim a trial before measuring a run
of it (`claim`), so each run is measured once: a second claimant waits for the first and then
finds the run in the record.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from suite.files import write_json
from suite.record import Record, UnknownSchema

CLAIM_SLACK_S = 60.0  # a holder ends within its trial's timeout plus this (start-up, store writes)


class Busy(RuntimeError):
    """Another process has held a trial for longer than that trial may take."""


def path_for(store_dir: str | Path, trial_id: str) -> Path:
    return Path(store_dir) / f"{trial_id}.json"


def load(store_dir: str | Path, trial_id: str) -> Record | None:
    """The stored record of a trial (a single-run record upgraded to the current schema), or None."""
    p = path_for(store_dir, trial_id)
    if not p.exists():
        return None
    with open(p) as f:
        try:
            return Record.from_json(json.load(f))
        except UnknownSchema as e:
            raise UnknownSchema(f"{p}: {e}") from None


def save(store_dir: str | Path, record: Record) -> Path:
    return write_json(path_for(store_dir, record.trial_id), record.to_json(), indent=1, sort_keys=True, durable=True)


def stamp(store_dir: str | Path, trial_id: str) -> tuple[int, int] | None:
    """Which write of the trial's file is there (each `save` makes a new file), or None."""
    try:
        st = path_for(store_dir, trial_id).stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


def wait_for_change(store_dir: str | Path, trial_id: str, before: tuple | None, timeout_s: float) -> bool:
    """Wait until the trial's file is written again after `stamp` gave `before`; False on timeout."""
    deadline = time.monotonic() + timeout_s
    while stamp(store_dir, trial_id) == before:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


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
