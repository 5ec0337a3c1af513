"""Warm starts: a CPU trial's ranks forked from a process that has already imported the runtime.

A rank spends most of a small CPU trial importing: torch, DeepSpeed and transformers take about 5
CPU-seconds before it builds anything (`python -X importtime`), and every rank of every run pays
them. A launcher that runs CPU trials keeps a server (`serve`, `python -m suite.warm`) that has made
those imports once; each rank is a fork of it, so it starts as a fresh process with the runtime in
memory. Nothing else carries over: the server runs no trial and starts no thread, and a rank gets
its own session, log, environment and random seeds before `suite.worker` runs.

A server is started with the environment its ranks would have imported in (`worker_env` less what
differs by rank: `RANK_VARS`), and with the rank's small thread stacks where it has them (glibc
sizes thread stacks from RLIMIT_STACK when the process starts): one server per such environment,
so that what a library reads from the environment at import (OpenMP's thread count, DeepSpeed's
accelerator, glibc's malloc tunables) is what a rank started afresh would read.

CUDA trials start their ranks afresh (`subprocess`), as before: a CUDA driver initialized in the
server (an import that asks for the devices does) cannot be used in a fork. `SUITE_WARM_START=0`
starts CPU ranks afresh too.

The server lives as long as its launcher: the launcher's end closes the request pipe, and the
server then kills its ranks and exits; a rank gets SIGKILL when the server dies (PR_SET_PDEATHSIG,
`suite.worker.die_with_parent`). It ignores SIGTERM, SIGINT and SIGHUP (`IGNORED`), which a Slurm
job's end sends to every process of the job, so that it reports how each rank ended.
"""

from __future__ import annotations

import json
import os
import random
import resource
import runpy
import select
import signal
import subprocess
import sys
import threading
import traceback
from typing import Any

RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SUITE_PARENT_PID")
"""What differs between the ranks of one server: set in each rank after the fork."""

PRELOAD = (
    "torch",
    "torch.distributed",
    "deepspeed",
    "transformers",
    "suite.metrics",
    "suite.detect",
    "suite.engines",
    "suite.models.build",
    "suite.models.flops",
    "suite.models.kernels",
)
"""What every CPU rank imports (DeepSpeed's engines and the models' builder among them), but
`suite.worker` itself, which each rank runs as `__main__` as `python -m` does."""


def small_thread_stacks() -> None:
    """Run in the child before exec: glibc sizes each thread's stack from RLIMIT_STACK (8 MiB
    by default), and stacks count against a CPU memory budget (RLIMIT_DATA). At 2 MiB, how
    many threads torch, gloo and DeepSpeed start matters little to whether a trial fits."""
    resource.setrlimit(resource.RLIMIT_STACK, (2 * 2**20, resource.getrlimit(resource.RLIMIT_STACK)[1]))


IGNORED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
"""Signals the server ignores while it serves; each rank starts with Python's own handling of them."""
POLL_S = 0.02  # how often the server looks for requests and ended ranks


def enabled(device: str) -> bool:
    return device == "cpu" and os.environ.get("SUITE_WARM_START", "1") != "0"


# ---- the server (its own process) ----


def serve() -> None:
    """Import the runtime, then fork a rank per request (a JSON line on stdin) and report each
    rank's pid and, when it ends, its exit code (JSON lines on stdout) until stdin closes."""
    import importlib

    # The requests and replies move off stdin and stdout: what an import prints goes to stderr.
    requests, replies = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)
    os.close(null)
    for name in PRELOAD:
        importlib.import_module(name)
    # The server ends with its launcher (its requests end), not by a signal meant for the ranks: a
    # Slurm job's end (scancel) signals every process of the job, and the server must stay to
    # report how each rank ended (killed by SIGTERM, say); its ranks get the defaults back (`_rank`).
    for sig in IGNORED:
        signal.signal(sig, signal.SIG_IGN)
    ranks: set[int] = set()
    pending = b""
    while True:
        ready, _, _ = select.select([requests], [], [], POLL_S)
        if ready:
            chunk = os.read(requests, 1 << 16)
            if not chunk:  # the launcher is gone
                for pid in ranks:
                    _kill_group(pid)
                os._exit(0)
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                req = json.loads(line)
                started, signal_start = os.pipe()
                pid = os.fork()
                if pid == 0:
                    os.close(requests)
                    os.close(replies)
                    os.close(started)
                    _rank(req, signal_start)  # never returns
                os.close(signal_start)
                os.read(started, 1)  # the rank leads its own process group before its pid is known
                os.close(started)
                ranks.add(pid)
                _say(replies, {"id": req["id"], "pid": pid})
        while ranks:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            ranks.discard(pid)
            _say(replies, {"pid": pid, "rc": os.waitstatus_to_exitcode(status)})


def _say(fd: int, msg: dict[str, Any]) -> None:
    os.write(fd, (json.dumps(msg) + "\n").encode())


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _rank(req: dict[str, Any], started: int) -> None:
    """In the forked rank: its own session, log and environment, fresh seeds, then the worker."""
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as a Python process starts
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        os.setsid()  # its own process group, as `start_new_session` gives a spawned rank
        os.write(started, b"s")
        os.close(started)
        log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        os.environ.clear()
        os.environ.update(req["env"])
        _name(f"suite.worker.{req['env'].get('RANK', '')}")
        random.seed()  # a fresh process seeds itself from the OS; a fork would share the server's state
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        sys.argv = [sys.argv[0], *req["argv"]]
        runpy.run_module("suite.worker", run_name="__main__", alter_sys=True)  # `python -m`: ends the process
    except BaseException:  # noqa: BLE001 - a rank's failure is its exit code and its log
        traceback.print_exc()
    finally:
        os._exit(1)


def _name(name: str) -> None:
    """The rank's process name (`ps -o comm`, `top`, psutil's name): its command line is the server's.
    No space: Slurm's process tracking (proctrack/linuxproc) reads /proc/PID/stat word by word, and
    a name with a space there hides the rank from the signals that end a job."""
    import ctypes  # deferred: only a forked rank names itself

    PR_SET_NAME = 15
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, name.encode()[:15])


# ---- the launcher's side ----


class Rank:
    """A rank forked by a server, as the launcher waits for and kills it (`subprocess.Popen`'s
    pid, poll and wait)."""

    def __init__(self, server: Server, pid: int):
        self.server, self.pid = server, pid

    def poll(self) -> int | None:
        return self.server.exit_code(self.pid)

    def wait(self) -> int:
        return self.server.wait(self.pid)


class Server:
    """One server and the thread that reads its replies."""

    def __init__(self, env: dict[str, str], small_stacks: bool):
        import tempfile

        self.err = tempfile.TemporaryFile()  # what the imports say; shown if the server ends
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "suite.warm"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.err,
            start_new_session=True,  # a Ctrl-C in the terminal is the launcher's to handle
            preexec_fn=small_thread_stacks if small_stacks else None,
        )
        self.cond = threading.Condition()
        self.pids: dict[int, int] = {}  # request id -> pid
        self.codes: dict[int, int] = {}  # pid -> exit code
        self.live: set[int] = set()
        self.next_id = 0
        self.gone = False
        threading.Thread(target=self._read, name="warm-start", daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            msg = json.loads(line)
            with self.cond:
                if "rc" in msg:
                    self.codes[msg["pid"]] = msg["rc"]
                    self.live.discard(msg["pid"])
                else:
                    self.pids[msg["id"]] = msg["pid"]
                    self.live.add(msg["pid"])
                self.cond.notify_all()
        self.proc.wait()
        with self.cond:
            # The server is gone, and its ranks with it (PR_SET_PDEATHSIG): each ended by SIGKILL.
            for pid in self.live:
                self.codes.setdefault(pid, -signal.SIGKILL)
            self.live.clear()
            self.gone = True
            self.cond.notify_all()

    def ended(self) -> str:
        self.err.seek(0)
        said = self.err.read().decode(errors="replace").strip().splitlines()
        return f"the warm-start server ended (exit code {self.proc.returncode})" + (f": {said[-1]}" if said else "")

    def start(self, argv: list[str], env: dict[str, str], log: str) -> Rank:
        with self.cond:
            if self.gone:
                raise RuntimeError(self.ended())
            rid = self.next_id
            self.next_id += 1
            req = {"id": rid, "argv": argv, "env": env | {"SUITE_PARENT_PID": str(self.proc.pid)}, "log": log}
            try:
                self.proc.stdin.write((json.dumps(req) + "\n").encode())
                self.proc.stdin.flush()
            except OSError as e:
                raise RuntimeError(self.ended()) from e
            while rid not in self.pids and not self.gone:
                self.cond.wait()
            if rid not in self.pids:
                raise RuntimeError(self.ended())
            return Rank(self, self.pids.pop(rid))

    def exit_code(self, pid: int) -> int | None:
        with self.cond:
            return self.codes.get(pid)

    def wait(self, pid: int) -> int:
        with self.cond:
            while pid not in self.codes:
                self.cond.wait()
            return self.codes[pid]

    @property
    def idle(self) -> bool:
        with self.cond:
            return not self.live

    def close(self) -> None:
        self.proc.stdin.close()  # the server kills its ranks and exits
        self.proc.wait()
        self.err.close()


_servers: dict[tuple, Server] = {}
_lock = threading.Lock()
os.register_at_fork(after_in_child=_servers.clear)  # a forked launcher starts its own: the replies come to the parent
KEEP = 2
"""Servers kept at once (each holds the imported runtime, about 0.7 GiB): an idle one of another
environment is closed to make room."""


def server(env: dict[str, str], small_stacks: bool) -> Server:
    """The running server for ranks of this environment (`RANK_VARS` aside), started if none."""
    key = (small_stacks, tuple(sorted((k, v) for k, v in env.items() if k not in RANK_VARS)))
    with _lock:
        s = _servers.get(key)
        if s is not None and not s.gone:
            return s
        for other, o in list(_servers.items()):
            if o.gone or (len(_servers) >= KEEP and o.idle):
                del _servers[other]
                o.close()
        base = {k: v for k, v in env.items() if k not in RANK_VARS}
        s = _servers[key] = Server(base, small_stacks)
        return s


if __name__ == "__main__":
    serve()
