"""Run one trial in fresh worker processes and turn whatever happens into an outcome.

A multi-node trial runs one such launcher per node (its `Node`: node rank and rank 0's
address, see `suite.cluster`); each starts its node's ranks and only node 0's rank 0
writes the result.

Each rank is its own process group, so a timeout or a failure kills every rank and all
their children; no worker outlives its trial and no failure reaches the caller.

Outcomes: ok, oom, timeout, crashed, nan (from workers); invalid, unsupported (decided
before anything launches, see `suite.config`).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from suite.config import Trial

GRACE_S = 1.0  # after one rank fails, how long its peers may take to report their own cause


@dataclass
class Outcome:
    outcome: str
    message: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0


@dataclass(frozen=True)
class Node:
    """This launcher's part of a trial: which node it is and where rank 0 listens."""

    rank: int = 0
    master_addr: str = "127.0.0.1"
    port: int = 0
    """0: any free local port (a one-node trial)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env(t: Trial, local_rank: int, port: int, node: Node = Node()) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        RANK=str(node.rank * t.hardware.count + local_rank),
        LOCAL_RANK=str(local_rank),
        WORLD_SIZE=str(t.devices),
        LOCAL_WORLD_SIZE=str(t.hardware.count),
        MASTER_ADDR=node.master_addr,
        MASTER_PORT=str(port),
        PYTHONUNBUFFERED="1",
        SUITE_PARENT_PID=str(os.getpid()),
    )
    if t.hardware.device == "cpu":
        env["DS_ACCELERATOR"] = "cpu"
        # Share the cores this launcher may use (a Slurm job's, not the whole machine's)
        # between its ranks instead of oversubscribing them.
        env.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // t.hardware.count)))
        # glibc reserves 64 MiB of address space per malloc arena and thread; capped, the
        # RLIMIT_DATA budget measures what the trial allocates, not how many threads it has.
        env.setdefault("MALLOC_ARENA_MAX", "2")
        # glibc raises its mmap threshold to the size of each large block freed (up to 32 MiB)
        # and then keeps up to twice that of freed memory per arena (mallopt(3)); fixed, every
        # tensor of 128 KiB or more is returned on free, so resident memory (the CPU worker's
        # "device" memory) follows what the trial holds, as a GPU's allocated memory does.
        env.setdefault("MALLOC_MMAP_THRESHOLD_", "131072")
    return env


def small_thread_stacks() -> None:
    """Run in the child before exec: glibc sizes each thread's stack from RLIMIT_STACK (8 MiB
    by default), and stacks count against a CPU memory budget (RLIMIT_DATA). At 2 MiB, how
    many threads torch, gloo and DeepSpeed start matters little to whether a trial fits."""
    resource.setrlimit(resource.RLIMIT_STACK, (2 * 2**20, resource.getrlimit(resource.RLIMIT_STACK)[1]))


def kill_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for p in procs:
        p.wait()


def _tail(path: str, n: int = 2000) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:]
    except OSError:
        return ""


def _failure(out_dir: str, procs: list[subprocess.Popen], first: int, base: int) -> Outcome:
    """The root cause: an out-of-memory or NaN on any rank, else the first rank to fail.

    `procs[i]` is global rank `base + i`; `first` is a global rank.
    """
    errors = {}
    for rank in range(base, base + len(procs)):
        path = os.path.join(out_dir, f"error-rank{rank}.json")
        if os.path.exists(path):
            with open(path) as f:
                errors[rank] = json.load(f)
    for kind in ("oom", "nan"):
        for rank, e in errors.items():
            if e["outcome"] == kind:
                return Outcome(kind, f"rank {rank}: {e['message']}")
    if first in errors:
        return Outcome("crashed", f"rank {first}: {errors[first]['message']}")
    rc = procs[first - base].returncode  # died without a word: a signal or a hard crash
    cause = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit code {rc}"
    if rc == -signal.SIGTERM and "SLURM_JOB_ID" in os.environ:
        cause += f" (Slurm is ending job {os.environ['SLURM_JOB_ID']}: scancel, its time limit or preemption)"
    log = _tail(os.path.join(out_dir, f"rank{first}.log"), 600).strip().splitlines()
    return Outcome("crashed", f"rank {first} {cause}" + (f"; last output: {log[-1]}" if log else ""))


def run_trial(t: Trial, keep_logs: str | None = None, node: Node = Node()) -> Outcome:
    """Launch the trial's ranks on this node, wait for them within the timeout, and collect
    the outcome. On a node other than 0, `ok` means its ranks finished (node 0 has the metrics).
    """
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"trial-{t.id}-") as out_dir:
        spec = os.path.join(out_dir, "trial.json")
        with open(spec, "w") as f:
            json.dump(t.to_dict(), f)
        port = node.port or free_port()
        base = node.rank * t.hardware.count  # global rank of this node's first rank
        procs: list[subprocess.Popen] = []
        try:
            for local in range(t.hardware.count):
                log = open(os.path.join(out_dir, f"rank{base + local}.log"), "w")
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "suite.worker", spec, out_dir],
                        env=worker_env(t, local, port, node),
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                        preexec_fn=small_thread_stacks if t.hardware.mem_gib and t.hardware.device == "cpu" else None,
                    )
                )
                log.close()
            result = _wait(t, procs, out_dir, start, base)
        finally:
            kill_all(procs)
            if keep_logs:
                os.makedirs(keep_logs, exist_ok=True)
                for rank in range(base, base + len(procs)):
                    src = os.path.join(out_dir, f"rank{rank}.log")
                    if os.path.exists(src):
                        os.replace(src, os.path.join(keep_logs, f"{t.id}-rank{rank}.log"))
    result.wall_s = time.monotonic() - start
    return result


def _wait(t: Trial, procs: list[subprocess.Popen], out_dir: str, start: float, base: int) -> Outcome:
    deadline = start + t.measure.timeout_s
    failed_at, first = None, -1
    while True:
        codes = [p.poll() for p in procs]
        if all(c == 0 for c in codes) and base > 0:
            return Outcome("ok", f"its ranks {base}..{base + len(procs) - 1} finished; node 0 records the result")
        if all(c == 0 for c in codes):
            path = os.path.join(out_dir, "result.json")
            if not os.path.exists(path):
                return Outcome("crashed", "workers exited cleanly without a result")
            with open(path) as f:
                return Outcome("ok", metrics=json.load(f))
        if failed_at is None and any(c not in (None, 0) for c in codes):
            failed_at = time.monotonic()
            # Of ranks seen failing together, one killed by a signal is the cause; a peer's
            # error (a closed connection) is its consequence.
            failed = sorted((c > 0, r) for r, c in enumerate(codes) if c not in (None, 0))
            first = base + failed[0][1]
        if failed_at is not None and (all(c is not None for c in codes) or time.monotonic() - failed_at > GRACE_S):
            kill_all(procs)
            return _failure(out_dir, procs, first, base)
        if time.monotonic() > deadline:
            kill_all(procs)
            return Outcome("timeout", f"no result within measure.timeout_s={t.measure.timeout_s:g}")
        time.sleep(0.05)
