"""Warm starts (suite.warm): a CPU trial's ranks forked from a server that has imported the runtime
behave as ranks started afresh do (exit codes, logs, process groups), one server per environment
the ranks import in, and nothing outlives the launcher."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from conftest import ONE, ROOT, make_trial

from suite import launch, warm


@pytest.mark.parametrize("on", ["1", "0"])
def test_a_rank_reports_its_exit_code_and_writes_its_own_log(tmp_path, monkeypatch, on):
    """Forked (SUITE_WARM_START=1, the default on a CPU) or started afresh (0), a rank whose trial
    cannot be read exits 1 and says why in its log."""
    monkeypatch.setenv("SUITE_WARM_START", on)
    t = make_trial(ONE)
    env = launch.worker_env(t, 0, launch.free_port())
    log = tmp_path / "rank0.log"
    rank = launch.start_rank(t, [str(tmp_path / "missing.json"), str(tmp_path)], env, str(log))
    assert isinstance(rank, warm.Rank) == (on == "1")
    assert rank.wait() == 1 and rank.poll() == 1
    assert "FileNotFoundError" in log.read_text() and "missing.json" in log.read_text()


def test_cuda_ranks_start_afresh():
    assert warm.enabled("cpu") and not warm.enabled("cuda")


def test_one_server_per_environment_the_ranks_import_in(monkeypatch):
    """What differs by rank (RANK_VARS) shares a server; any other variable, or the small thread
    stacks of a trial under a memory budget, gets its own, and an idle one makes room."""
    started = []

    class Fake:
        gone = False
        idle = True

        def __init__(self, env, small_stacks):
            started.append((env, small_stacks))

        def close(self):
            self.gone = True

    monkeypatch.setattr(warm, "Server", Fake)
    monkeypatch.setattr(warm, "_servers", {})
    t = make_trial(ONE + ["hardware=cpu-x2"])
    rank0, rank1 = (launch.worker_env(t, r, 1234) for r in (0, 1))
    first = warm.server(rank0, False)
    assert warm.server(rank1, False) is first
    assert not any(k in started[0][0] for k in warm.RANK_VARS) and started[0][0]["DS_ACCELERATOR"] == "cpu"
    stacks = warm.server(rank0, True)
    assert stacks is not first and len(started) == 2
    third = warm.server(rank0 | {"OMP_NUM_THREADS": "7"}, False)
    assert len(started) == 3 and first.gone and stacks.gone is False  # the least recently made idle one
    assert warm.server(rank1 | {"OMP_NUM_THREADS": "7"}, False) is third


def test_a_signal_to_the_whole_job_ends_the_rank_and_the_server_says_so(tmp_path):
    """As Slurm ends a job (SIGTERM to each of its processes): the rank dies by SIGTERM, as one
    started afresh does, and the server, which ignores it, reports that."""
    t = make_trial(ONE + ["debug.fault=hang", "measure.timeout_s=600"])
    spec = tmp_path / "trial.json"
    spec.write_text(json.dumps(t.to_json()))
    env = launch.worker_env(t, 0, launch.free_port())
    rank = launch.start_rank(t, [str(spec), str(tmp_path)], env, str(tmp_path / "rank0.log"))
    deadline = time.monotonic() + 60
    while psutil.Process(rank.pid).name() != "suite.worker.0":  # its own signal handling is back
        assert time.monotonic() < deadline
        time.sleep(0.05)
    for pid in (rank.server.proc.pid, rank.pid):
        os.kill(pid, signal.SIGTERM)
    assert rank.wait() == -signal.SIGTERM
    assert rank.server.proc.poll() is None  # still serving


LAUNCHER = """
import json, sys
from suite.config import Trial
from suite.launch import run_trial
run_trial(Trial.from_json(json.loads(sys.argv[1])))
"""


@pytest.mark.slow
def test_a_launcher_killed_takes_its_server_and_ranks_with_it(tmp_path):
    """A launcher killed by SIGKILL (no cleanup runs) leaves no server and no rank behind; while it
    ran, each rank led its own process group and was named for what it is."""
    t = make_trial(ONE + ["debug.fault=hang", "measure.timeout_s=600"])
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, json.dumps(t.to_json())], cwd=ROOT)
    launcher = psutil.Process(proc.pid)
    deadline = time.monotonic() + 120
    ranks = []
    while not ranks and time.monotonic() < deadline:
        time.sleep(0.2)
        ranks = [p for p in launcher.children(recursive=True) if p.name().startswith("suite.worker")]
    assert ranks, "no rank started within 120 s"
    everything = launcher.children(recursive=True)
    (rank,) = ranks
    assert rank.name() == "suite.worker.0"
    assert os.getpgid(rank.pid) == rank.pid and os.getsid(rank.pid) == rank.pid
    assert any("suite.warm" in " ".join(p.cmdline()) for p in everything)  # the server
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    gone, alive = psutil.wait_procs(everything, timeout=30)
    assert not alive, f"left behind: {[(p.pid, p.name()) for p in alive]}"
