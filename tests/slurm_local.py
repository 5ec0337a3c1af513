"""A real single-node Slurm for tests: munged, slurmctld and slurmd, started and stopped by PID.

Debian's `slurm-wlm` and `munge` packages. The daemons run in the foreground as children
of the test process, with their config, state, socket and logs in one temporary folder
and on free ports, so nothing else on the machine is touched and nothing outlives the
tests. This Slurm keeps no accounting, so `sacct`, which submitit asks for job states, is
stood in for by tests/slurm_bin/sacct (answering from `squeue`).
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import time
from pathlib import Path

BIN = Path(__file__).parent / "slurm_bin"
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("munge", "sbatch", "squeue", "sinfo", "scancel")


def missing() -> str | None:
    """Why a local Slurm cannot run here (Slurm or munge absent, not root), or None."""
    absent = [d for d in DAEMONS + CLIENTS if shutil.which(d, path=f"{os.environ.get('PATH', '')}:/usr/sbin") is None]
    if absent:
        return f"Slurm is not installed ({', '.join(absent)} missing; apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "a local Slurm needs root (slurmd runs jobs as their user; munged runs as user munge)"
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return "user munge is missing (reinstall the munge package)"
    if not Path("/etc/munge/munge.key").exists():
        return "/etc/munge/munge.key is missing (reinstall the munge package)"
    return None  # the suite's own launchers are no reason to skip: test_slurm.py fails without them


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _which(name: str) -> str:
    return shutil.which(name, path=f"{os.environ.get('PATH', '')}:/usr/sbin") or name


class LocalSlurm:
    """One node named as this host, all its CPUs, one default partition `test`."""

    def __init__(self, root: Path):
        self.root = root
        self.conf = root / "slurm.conf"
        self.munge_socket = root / "munge" / "munge.socket"
        self.procs: list[subprocess.Popen] = []
        self.env = dict(os.environ, SLURM_CONF=str(self.conf), PATH=f"{BIN}:{os.environ.get('PATH', '')}")

    def _write_conf(self) -> None:
        host = socket.gethostname().split(".")[0]
        mem_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
        r = self.root
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=suitetest",
                    f"SlurmctldHost={host}",
                    f"SlurmctldPort={_free_port()}",
                    f"SlurmdPort={_free_port()}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={self.munge_socket}",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_CPU",  # two 1-CPU jobs run side by side
                    "AccountingStorageType=accounting_storage/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "JobCompType=jobcomp/none",
                    "MinJobAge=3600",  # finished jobs stay in squeue for the sacct stand-in
                    "KillWait=10",  # SIGTERM to SIGKILL on scancel or time limit (default 30)
                    "ReturnToService=2",
                    f"StateSaveLocation={r / 'state'}",
                    f"SlurmdSpoolDir={r / 'spool'}",
                    f"SlurmctldPidFile={r / 'slurmctld.pid'}",
                    f"SlurmdPidFile={r / 'slurmd.pid'}",
                    f"SlurmctldLogFile={r / 'slurmctld.log'}",
                    f"SlurmdLogFile={r / 'slurmd.log'}",
                    f"NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory={int(mem_mb * 0.9)}",
                    "PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
                    "",
                ]
            )
        )

    def _wait(self, what: str, ok, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not ok():
            if time.monotonic() > deadline:
                logs = {p.name: p.read_text()[-1500:] for p in self.root.rglob("*.log")}
                raise RuntimeError(f"local Slurm: {what} not ready within {timeout_s:g} s; logs: {logs}")
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"local Slurm: {p.args[0]} exited with {p.returncode}")
            time.sleep(0.1)

    def _run(self, *cmd: str) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=10)

    def start(self, timeout_s: float = 30) -> LocalSlurm:
        for d in ("state", "spool"):
            (self.root / d).mkdir(parents=True)
        munge_dir = self.munge_socket.parent
        munge_dir.mkdir()
        self.root.chmod(0o755)  # munged checks that every user can reach its socket
        shutil.chown(munge_dir, "munge", "munge")
        self._write_conf()
        m = munge_dir
        self.procs.append(
            subprocess.Popen(
                [_which("munged"), "-F", f"--socket={self.munge_socket}", f"--pid-file={m / 'munged.pid'}",
                 f"--log-file={m / 'munged.log'}", f"--seed-file={m / 'munged.seed'}"],
                user="munge", group="munge", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )  # fmt: skip
        self._wait("munged", self.munge_socket.exists, timeout_s)
        for daemon in ("slurmctld", "slurmd"):
            self.procs.append(
                subprocess.Popen(
                    [_which(daemon), "-D", "-f", str(self.conf)],
                    env=self.env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        self._wait("the node", lambda: self._run("sinfo", "-h", "-o", "%T").stdout.strip() == "idle", timeout_s)
        return self

    def stop(self) -> None:
        """Cancel every job, then stop each daemon by its PID, Slurm first."""
        if len(self.procs) == len(DAEMONS):
            self._run("scancel", "--full", "--user=root")
        for p in reversed(self.procs):
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs.clear()

    def jobs(self, states: str = "all") -> list[tuple[str, str]]:
        """(job id, state) of every job this Slurm knows."""
        out = self._run("squeue", "-h", "-r", "-t", states, "-o", "%i|%T").stdout
        return [tuple(line.split("|")) for line in out.split()]
