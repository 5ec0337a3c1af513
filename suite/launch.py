"""Run one trial in fresh worker processes and turn whatever happens into an outcome.

A CPU trial's ranks are forked from a server that has imported the runtime (`suite.warm`); a
CUDA trial's start afresh (`python -m suite.worker`).

A multi-node trial runs one such launcher per node (its `Node`: node rank and rank 0's
address, see `suite.cluster`); each starts its node's ranks and only node 0's rank 0
writes the result. Their trial folder is then in the shared store (under `keep_logs`, which
is `store.dir/logs`): every rank's failure report lands there, so node 0 sees a failure on
any node, stops its own ranks (which would otherwise wait in a collective for a peer that is
gone, until the timeout), waits for every node's account and records the root cause.

Each rank is its own process group, so a timeout or a failure kills every rank and all
their children; no worker outlives its trial and no failure reaches the caller: `run_trial`
returns the run (`suite.record.Run`), whatever happened. The one exception is a further node
whose ranks failed while node 0 is gone (`NoAccount`): nothing records that trial, so the node's
job must fail.

Outcomes: ok, oom, timeout, crashed, nan (from workers); invalid, unsupported (decided
before anything launches, see `suite.config`). A rank the kernel's OOM killer ends (host
memory, e.g. under CPU offload) dies by SIGKILL without a word: it is `oom` when the
cgroup's count of OOM kills rose during the trial, else `crashed`.
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Any

from suite import detect, nvme, warm
from suite.config import Trial
from suite.files import write_json
from suite.record import Run, provenance

GRACE_S = 1.0  # after one rank fails, how long its peers may take to report their own cause
REPORT_POLL_S = 0.5  # how often a multi-node launcher looks for its peers' reports (a network filesystem)
NODES_GRACE_S = 30.0  # after a failure, how long a node waits for the others' accounts (filesystem latency)


class NoAccount(RuntimeError):
    """A further node's ranks failed and node 0 gave no account of the trial (it is gone)."""


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
        HF_HUB_OFFLINE="1",  # models are built from configs: nothing may come from a hub
        DS_ACCELERATOR=t.hardware.device,
    )
    # Share the cores this launcher may use (a Slurm job's, not the whole machine's) between
    # its ranks instead of oversubscribing them: torch's CPU ops and DeepSpeed's CPU Adam
    # (offload) each start one OpenMP thread per core otherwise, in every rank.
    env.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // t.hardware.count)))
    if t.hardware.device == "cpu":
        # glibc reserves 64 MiB of address space per malloc arena and thread; capped, the
        # RLIMIT_DATA budget measures what the trial allocates, not how many threads it has.
        env.setdefault("MALLOC_ARENA_MAX", "2")
        # glibc raises its mmap threshold to the size of each large block freed (up to 32 MiB)
        # and then keeps up to twice that of freed memory per arena (mallopt(3)); fixed, every
        # tensor of 128 KiB or more is returned on free, so resident memory (the CPU worker's
        # "device" memory) follows what the trial holds, as a GPU's allocated memory does.
        env.setdefault("MALLOC_MMAP_THRESHOLD_", "131072")
    return env


def start_rank(t: Trial, argv: list[str], env: dict[str, str], log: str):
    """Start one rank of `t` (`python -m suite.worker *argv`, its output to `log`) in its own
    process group: forked from a pre-imported server on a CPU (`suite.warm`), else afresh. Its
    handle has a pid, poll and wait."""
    small_stacks = bool(t.hardware.mem_gib) and t.hardware.device == "cpu"
    if warm.enabled(t.hardware.device):
        try:
            return warm.server(env, small_stacks).start(argv, env, log)
        except RuntimeError as e:
            print(f"warning: {e}; starting the rank afresh", file=sys.stderr)
    with open(log, "w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "suite.worker", *argv],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=warm.small_thread_stacks if small_stacks else None,
        )


def kill_all(procs: list) -> None:
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


def memory_event_files() -> list[str]:
    """The files where the kernel counts this process's cgroup's OOM kills: `memory.events`
    (cgroup v2) or `memory.oom_control` (v1), each with an `oom_kill N` line. In a container
    the cgroup's own folder is mounted as the root, hence the second place to look."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0":
            places = [f"/sys/fs/cgroup{path}/memory.events", "/sys/fs/cgroup/memory.events"]
        elif "memory" in controllers.split(","):
            places = [f"/sys/fs/cgroup/memory{path}/memory.oom_control", "/sys/fs/cgroup/memory/memory.oom_control"]
        else:
            continue
        found += [p for p in dict.fromkeys(places) if os.path.exists(p)][:1]
    return found


def oom_kills(path: str | None = None) -> int | None:
    """Processes of this cgroup the kernel's OOM killer has killed so far (any OOM killer, the
    machine's or the cgroup's limit: Linux's cgroup-v2 documentation, `oom_kill`); None where
    no such count can be read."""
    paths = [path] if path else memory_event_files()
    for p in paths:
        try:
            with open(p) as f:
                for line in f:
                    if line.startswith("oom_kill "):
                        return int(line.split()[1])
        except (OSError, ValueError):
            continue
    return None


def death_report(rc: int, kills_before: int | None, kills_now: int | None, log_path: str) -> dict[str, Any]:
    """What a launcher reports for one of its ranks that ended without a report of its own."""
    if rc < 0 and -rc == signal.SIGKILL and kills_before is not None and kills_now is not None:
        if kills_now > kills_before:
            return {
                "outcome": "oom",
                "message": f"killed by SIGKILL from the kernel's OOM killer: out of host memory "
                f"(the cgroup counted {kills_now - kills_before} OOM kill(s) during the trial)",
                "by": "launcher",
                "signal": True,
            }
    cause = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit code {rc}"
    if rc == -signal.SIGTERM and "SLURM_JOB_ID" in os.environ:
        cause += f" (Slurm is ending job {os.environ['SLURM_JOB_ID']}: scancel, its time limit or preemption)"
    log = _tail(log_path, 600).strip().splitlines()
    message = cause + (f"; last output: {log[-1]}" if log else "")
    return {"outcome": "crashed", "message": message, "by": "launcher", "signal": rc < 0}


def _read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None  # not there (yet), or being replaced


def _numbered(out_dir: str, prefix: str) -> dict[int, dict[str, Any]]:
    """The readable `<prefix><N>.json` files of the trial folder, by N."""
    found = {}
    for path in glob.glob(os.path.join(out_dir, f"{prefix}*.json")):
        m = re.fullmatch(rf"{re.escape(prefix)}(\d+)\.json", os.path.basename(path))
        doc = _read_json(path) if m else None
        if doc is not None:
            found[int(m.group(1))] = doc
    return found


def reports(out_dir: str) -> dict[int, dict[str, Any]]:
    """Every rank's failure report in the trial folder, by global rank."""
    return _numbered(out_dir, "error-rank")


def node_accounts(out_dir: str) -> dict[int, dict[str, Any]]:
    """Each node's account of its part (multi-node): written by its launcher when its ranks end."""
    return _numbered(out_dir, "node")


def root_cause(reps: dict[int, dict[str, Any]], first: int | None) -> Run:
    """An out-of-memory or NaN on any rank; else a rank that died by a signal (its peers'
    errors, a closed connection, are the consequence); else the first rank seen failing."""

    def said(rank: int) -> str:
        r = reps[rank]
        return f"rank {rank} {r['message']}" if r.get("by") == "launcher" else f"rank {rank}: {r['message']}"

    for kind in ("oom", "nan"):
        for rank in sorted(reps):
            if reps[rank]["outcome"] == kind:
                return Run(kind, said(rank))
    died = [rank for rank in sorted(reps) if reps[rank].get("signal")]
    rank = died[0] if died else first if first in reps else min(reps, default=None)
    if rank is None:
        return Run("crashed", "a rank failed without a report")
    return Run("crashed", said(rank))


_attempts: dict[str, int] = {}  # runs of each trial by this process: the nodes of a job count alike


def trial_dir(t: Trial, shared: str) -> str:
    """A multi-node trial's folder in the shared store: one per attempt, named alike on every node."""
    n = _attempts[t.id] = _attempts.get(t.id, 0) + 1
    job = os.environ.get("SLURM_JOB_ID", "nojob")
    step = os.environ.get("SLURM_STEP_ID", "")
    return os.path.join(shared, f"{t.id}-job{job}{'.' + step if step else ''}-{n}")


def run_trial(t: Trial, keep_logs: str | None = None, node: Node = Node()) -> Run:
    """Launch the trial's ranks on this node, wait for them within the timeout, and return the
    run: its outcome, message, metrics, wall time and this machine's provenance. On a node other
    than 0, `ok` means its ranks finished (node 0 has the metrics). A multi-node trial needs
    `keep_logs`, a folder every node shares.
    """
    start = time.monotonic()
    if t.nodes > 1:
        if keep_logs is None:
            raise ValueError("a multi-node trial needs keep_logs, a folder shared by every node")
        where = nullcontext(trial_dir(t, keep_logs))
    else:
        where = tempfile.TemporaryDirectory(prefix=f"trial-{t.id}-")
    with where as out_dir:
        os.makedirs(out_dir, exist_ok=True)
        spec = os.path.join(out_dir, "trial.json" if t.nodes == 1 else f"trial-node{node.rank}.json")
        with open(spec, "w") as f:
            json.dump(t.to_json(), f)
        port = node.port or free_port()
        base = node.rank * t.hardware.count  # global rank of this node's first rank
        procs: list = []
        try:
            for local in range(t.hardware.count):
                log = os.path.join(out_dir, f"rank{base + local}.log")
                procs.append(start_rank(t, [spec, out_dir], worker_env(t, local, port, node), log))
            result = _wait(t, procs, out_dir, start, node)
        finally:
            kill_all(procs)
            nvme.empty(t)  # the swap files go with the ranks, whatever the outcome
            if keep_logs:
                os.makedirs(keep_logs, exist_ok=True)
                for rank in range(base, base + len(procs)):
                    src = os.path.join(out_dir, f"rank{rank}.log")
                    if os.path.exists(src):
                        os.replace(src, os.path.join(keep_logs, f"{t.id}-rank{rank}.log"))
    if result.outcome == "ok" and node.rank == 0 and t.hardware.device == "cuda":
        result.metrics["profile_mismatch"] = profile_check(t, result.metrics)
    forked = bool(procs) and all(isinstance(p, warm.Rank) for p in procs)
    where = provenance(t.hardware.device) | {"ranks": "forked" if forked else "exec"}  # suite.warm, or afresh
    return replace(result, wall_s=time.monotonic() - start, provenance=where)


def profile_check(t: Trial, metrics: dict[str, Any]) -> dict[str, Any] | None:
    """Whether the GPUs the trial ran on are its profile's (`suite.detect.mismatch`): each rank's
    device name as the worker recorded it, with the memory of this node's devices."""

    local = detect.local_gpus()
    devices = [
        (
            m.get("device_name") or "unknown (not recorded)",
            local[rank][1] if rank < min(t.hardware.count, len(local)) else None,
        )
        for rank, m in enumerate(metrics["memory_per_rank"])
    ]
    return detect.mismatch(t, devices)


def _others_failed(out_dir: str, t: Trial, node: Node) -> bool:
    """Whether a rank of another node reported a failure, or another node ended its part badly."""
    mine = range(node.rank * t.hardware.count, (node.rank + 1) * t.hardware.count)
    if any(rank not in mine for rank in reports(out_dir)):
        return True
    return any(k != node.rank and a["outcome"] != "ok" for k, a in node_accounts(out_dir).items())


def _wait(t: Trial, procs: list, out_dir: str, start: float, node: Node) -> Run:
    base = node.rank * t.hardware.count
    multi = t.nodes > 1
    # Node 0 decides a timeout and says so; a further node gives up on its own only later.
    deadline = start + t.measure.timeout_s + (NODES_GRACE_S if node.rank > 0 else 0.0)
    kills_before = oom_kills()
    failed_at, first, next_look = None, None, 0.0
    while True:
        codes = [p.poll() for p in procs]
        now = time.monotonic()
        if all(c == 0 for c in codes):
            if node.rank > 0:
                return _end(out_dir, t, node, Run("ok", f"its ranks {base}..{base + len(procs) - 1} finished"))
            result = _read_json(os.path.join(out_dir, "result.json"))
            if result is None:
                return _end(out_dir, t, node, Run("crashed", "workers exited cleanly without a result"))
            return _end(out_dir, t, node, Run("ok", metrics=result))
        if failed_at is None and any(c not in (None, 0) for c in codes):
            failed_at = now
            # Of ranks seen failing together, one killed by a signal is the cause; a peer's
            # error (a closed connection) is its consequence.
            failed = sorted((c > 0, r) for r, c in enumerate(codes) if c not in (None, 0))
            first = base + failed[0][1]
        elif failed_at is None and multi and now >= next_look:
            next_look = now + REPORT_POLL_S
            if _others_failed(out_dir, t, node):
                failed_at = now
        if failed_at is not None and (all(c is not None for c in codes) or now - failed_at > GRACE_S):
            ended = [p.poll() for p in procs]  # before the kill: the ranks that ended on their own
            kill_all(procs)
            _report_deaths(out_dir, ended, base, kills_before)
            if multi and node.rank == 0:  # once a node has given its account, its ranks' reports are in
                _await_accounts(out_dir, [k for k in range(1, t.nodes)], NODES_GRACE_S)
            return _end(out_dir, t, node, root_cause(reports(out_dir), first))
        if now > deadline:
            kill_all(procs)
            return _end(out_dir, t, node, Run("timeout", f"no result within measure.timeout_s={t.measure.timeout_s:g}"))
        time.sleep(0.05)


def _report_deaths(out_dir: str, codes: list[int | None], base: int, kills_before: int | None) -> None:
    """A report for each of this node's ranks that ended badly without writing one."""
    have = reports(out_dir)
    kills_now = oom_kills()
    for i, rc in enumerate(codes):
        rank = base + i
        if rc not in (None, 0) and rank not in have:
            log = os.path.join(out_dir, f"rank{rank}.log")
            write_json(os.path.join(out_dir, f"error-rank{rank}.json"), death_report(rc, kills_before, kills_now, log))


def _await_accounts(out_dir: str, nodes: list[int], wait_s: float) -> dict[int, dict[str, Any]]:
    """The accounts of `nodes` once all are there, or those there after `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        accounts = node_accounts(out_dir)
        if all(k in accounts for k in nodes) or time.monotonic() > deadline:
            return accounts
        time.sleep(REPORT_POLL_S)


def _end(out_dir: str, t: Trial, node: Node, o: Run) -> Run:
    """Close this node's part. Several nodes: each writes its account; a further node that
    failed then waits for node 0's, since that is the trial's recorded outcome (`NoAccount`
    when none comes)."""
    if t.nodes == 1:
        return o
    write_json(os.path.join(out_dir, f"node{node.rank}.json"), {"outcome": o.outcome, "message": o.message})
    if node.rank == 0 or o.outcome == "ok":
        return o
    # Node 0 may first wait out the accounts of all the other nodes.
    account = _await_accounts(out_dir, [0], 2 * NODES_GRACE_S).get(0)
    if account is None:
        raise NoAccount(f"{o.outcome}: {o.message}; node 0 gave no account of the trial")
    return Run(
        account["outcome"],
        f"{o.outcome} here ({o.message}); node 0 recorded {account['outcome']}: {account['message']}",
    )
