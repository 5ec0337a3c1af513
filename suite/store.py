"""The results store: one JSON file per trial, named by the trial id, written atomically.

A file is written to a unique temporary name in the same directory and renamed, so
readers never see a torn file and concurrent writers (several jobs) never corrupt each
other. Each record holds the resolved trial, its runs, their summary and provenance.

A record (schema suite.trial/2) keeps every run of the trial (`runs`: each run's outcome,
message, the worker's metrics, wall time and provenance with its date) and summarises them
in the fields every reader uses:

- `outcome`: `ok` only when every run was `ok`. A run that fails ends the trial's runs and
  gives the trial its outcome: a configuration that ran out of memory on run 3 of 5 is `oom`
  ("fits only sometimes"), its two good runs kept in `runs` but not summarised, since a
  configuration that fits only sometimes must not look like one that fits. `invalid` and
  `unsupported` are decided before any run (no runs).
- `metrics` (of an `ok` trial): the worker's figures of the median run, with
  `step_time_s`: the median step time of the runs, `step_time_ci_lo_s`/`step_time_ci_hi_s`:
  its interval (suite.stats), `step_time_ci_level`: the coverage that interval really has
  (0 for a single run, which has none), `runs`: how many, `step_time_between_std_s`: the
  spread between runs (None for one run), `step_time_within_std_s`: the spread of the timed
  steps inside each run (pooled; each run's own is its `step_time_std_s`); throughput and
  MFU at the median step time; every memory figure (`*_gib`) the largest of any run; the
  micro-step, boundary and optimizer times the median of each; `noisy` when any run's timed
  steps were.
- `wall_s`: the wall time of all runs; `provenance`: the latest run's.

Records of schema suite.trial/1 (one run, its figures at the top) load as single runs
(`load`, `current`).

Jobs that share a store (a grid on Slurm, a resumed search) claim a trial before
measuring a run of it (`claim`), so each run is measured once: a second claimant waits for
the first and then finds the run in the record.
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

from suite import metrics as trial_metrics
from suite import stats
from suite.config import Trial

SCHEMA = "suite.trial/2"
SINGLE_RUN_SCHEMA = "suite.trial/1"
"""Records written before repeats: one run, its figures at the top; `upgrade` reads them."""
SCHEMAS = (SCHEMA, SINGLE_RUN_SCHEMA)
DECIDED = ("invalid", "unsupported")  # outcomes decided before anything runs: records without runs
WITHIN_RUN = ("step_time_std_s", "step_time_min_s", "step_time_max_s")  # a run's own spread: kept in its run
PARTS = ("micro_time_s", "boundary_time_s", "optimizer_time_s")
PACKAGES = ("torch", "deepspeed", "transformers", "hydra-core", "flash-attn", "wandb")
CLAIM_SLACK_S = 60.0  # a holder ends within its trial's timeout plus this (start-up, store writes)


class Busy(RuntimeError):
    """Another process has held a trial for longer than that trial may take."""


def path_for(store_dir: str | Path, trial_id: str) -> Path:
    return Path(store_dir) / f"{trial_id}.json"


def load(store_dir: str | Path, trial_id: str) -> dict[str, Any] | None:
    """The stored record of a trial (a single-run record upgraded to the current schema), or None."""
    p = path_for(store_dir, trial_id)
    if not p.exists():
        return None
    with open(p) as f:
        return current(json.load(f))


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
    """A new record: one run with this outcome, or none for an outcome decided before running."""
    if outcome in DECIDED:
        return summarized(t.id, sweep, t.to_dict(), [], (outcome, message))
    return with_run(None, t, sweep, outcome, message, metrics, wall_s)


def with_run(
    rec: dict[str, Any] | None, t: Trial, sweep: str, outcome: str, message: str, metrics: dict, wall_s: float
) -> dict[str, Any]:
    """`rec` (or a new record) with one more run of `t`, summarised again. The trial is the
    latest asker's: its measure settings (repeats, timeout) say how the last run was asked for."""
    run = {
        "outcome": outcome,
        "message": message,
        "metrics": metrics,
        "wall_s": wall_s,
        "provenance": provenance(t.hardware.device),
    }
    runs = (rec["runs"] if rec else []) + [run]
    return summarized(t.id, sweep, t.to_dict(), runs)


def without(rec: dict[str, Any] | None, outcomes: tuple[str, ...]) -> dict[str, Any] | None:
    """`rec` without its runs of these outcomes (to run them again), or None when no run is left."""
    if rec is None or rec["outcome"] not in outcomes:
        return rec
    runs = [r for r in rec["runs"] if r["outcome"] not in outcomes]
    return summarized(rec["trial_id"], rec["sweep"], rec["trial"], runs) if runs else None


def ok_runs(rec: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in rec["runs"] if r["outcome"] == "ok"]


def interval(rec: dict[str, Any]) -> stats.Interval:
    """The interval of the median step time of an `ok` record."""
    m = rec["metrics"]
    return stats.Interval(m["step_time_ci_lo_s"], m["step_time_ci_hi_s"], m["step_time_ci_level"], m["runs"])


def summarized(
    trial_id: str, sweep: str, trial: dict, runs: list[dict], decided: tuple[str, str] | None = None
) -> dict[str, Any]:
    """A record of these runs with its summary fields (this module's docstring)."""
    outcome, message, summary = "ok", "", {}
    failed = [(k, r) for k, r in enumerate(runs, 1) if r["outcome"] != "ok"]
    if decided:
        outcome, message = decided
    elif failed:
        k, run = failed[0]
        outcome, message = run["outcome"], run["message"]
        if k > 1:  # it ran before: say so, and do not let it pass for a configuration that works
            before = ", ".join(f"{r['metrics']['step_time_s']:.3f}" for r in runs[: k - 1])
            what = "fits only sometimes: " if outcome == "oom" else ""
            message = f"{what}run {k} ended {outcome} after {k - 1} ok run(s) ({before} s/step): {message}"
    else:
        summary = _summary(trial, [r["metrics"] for r in runs])
    return {
        "schema": SCHEMA,
        "trial_id": trial_id,
        "sweep": sweep,
        "outcome": outcome,
        "message": message,
        "trial": trial,
        "metrics": summary,
        "wall_s": sum(r["wall_s"] for r in runs),
        "provenance": runs[-1]["provenance"] if runs else provenance(trial["hardware"]["device"]),
        "runs": runs,
    }


def _summary(trial: dict, per_run: list[dict]) -> dict[str, Any]:
    """One `ok` trial's metrics from its runs' (this module's docstring)."""
    times = [m["step_time_s"] for m in per_run]
    within = [m.get("step_time_std_s") for m in per_run]
    n = len(per_run)
    iv = stats.median_interval(times)
    median = stats.median(times)
    out = dict(sorted(per_run, key=lambda m: m["step_time_s"])[(n - 1) // 2])  # the median run (the lower of two)
    for k in WITHIN_RUN:
        out.pop(k, None)
    out.update(
        step_time_s=median,
        step_time_ci_lo_s=iv.lo,
        step_time_ci_hi_s=iv.hi,
        step_time_ci_level=iv.level,
        runs=n,
        step_time_between_std_s=stats.between_std(times),
        step_time_within_std_s=stats.pooled_std(within) if all(isinstance(w, (int, float)) for w in within) else None,
        noisy=any(m.get("noisy") for m in per_run),
    )
    for k in list(out):
        if k.endswith("_gib") and all(isinstance(m.get(k), (int, float)) for m in per_run):
            out[k] = max(m[k] for m in per_run)  # a configuration must fit every time
    for k in (*PARTS, "probe_flops"):  # the speed probe too: the machine's speed over the runs
        if all(isinstance(m.get(k), (int, float)) for m in per_run):
            out[k] = stats.median([m[k] for m in per_run])
    if n > 1:
        t = Trial.from_dict(trial)
        out.update(trial_metrics.rates(t, median, out["model_flops_per_token"], out["hardware_flops_per_token"]))
    return out


def current(rec: dict[str, Any]) -> dict[str, Any]:
    """A trial record in the current schema: a single-run one upgraded, any other as it is."""
    return upgrade(rec) if rec.get("schema") == SINGLE_RUN_SCHEMA else rec


def upgrade(rec: dict[str, Any]) -> dict[str, Any]:
    """A single-run record (suite.trial/1) as a record of the current schema with that one run."""
    runs = []
    if rec["outcome"] not in DECIDED:
        keys = ("outcome", "message", "metrics", "wall_s", "provenance")
        runs = [{k: rec.get(k) for k in keys}]
    decided = (rec["outcome"], rec.get("message", "")) if not runs else None
    out = summarized(rec["trial_id"], rec.get("sweep", ""), rec["trial"], runs, decided)
    if not runs:
        out["provenance"] = rec.get("provenance")
    return out


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
