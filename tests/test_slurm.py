"""Sweeps on a real Slurm through the submitit launcher, and what each job asks for.

The end-to-end tests start a single-node Slurm (tests/slurm_local.py) and skip, saying
why, where Slurm itself is not installed or cannot be started (no root). The suite's own
launchers and the submitit plugin, both installed with the suite, never make them skip: a
broken install fails `test_the_suites_slurm_launchers_are_installed`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import slurm_local
from conftest import TINY, compose_cfg, make_trial
from test_trial import workers_of

from suite import slurm
from suite.config import ClusterConfig

MISSING = slurm_local.missing()
needs_slurm = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
# One CPU worker per trial, so two trials' jobs run side by side on two cores.
ONE_CPU = [*TINY, "hardware=cpu-x1", "model.recipe.global_batch=4"]
OFFLOAD = ["methods.zero_stage=2", "methods.offload=optimizer"]


@pytest.fixture(scope="module")
def cluster():
    root = Path(tempfile.mkdtemp(prefix="suite-slurm-"))  # under /tmp: user munge must reach its socket
    local = slurm_local.LocalSlurm(root)
    try:
        yield local.start()
    finally:
        local.stop()
        shutil.rmtree(root, ignore_errors=True)


def sweep(cluster, tmp_path, *overrides: str) -> subprocess.Popen:
    """`suite-bench -m hydra/launcher=slurm ...` into tmp_path/runs, its output in one stream."""
    cmd = [sys.executable, "-m", "cli.bench", "-m", "hydra/launcher=slurm", f"store.dir={tmp_path / 'runs'}"]
    out = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return subprocess.Popen([*cmd, *overrides], cwd=tmp_path, env=cluster.env, **out)


def test_the_suites_slurm_launchers_are_installed():
    """Hydra's submitit plugin (a core dependency) and the suite's launchers import as a Slurm
    job imports them: from outside the repository, as installed."""
    probe = [sys.executable, "-c", "import hydra_plugins.hydra_submitit_launcher, hydra_plugins.suite_launcher"]
    out = subprocess.run(probe, cwd="/", capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"reinstall the suite (pip install -e .): {out.stderr[-2000:]}"


def test_each_job_asks_for_its_trials_gpus_cpus_memory_and_time():
    t = make_trial(["model=pythia-1b", "hardware=a100-80gb-x8", "cluster.nodes=2", "measure.timeout_s=600"])
    r = slurm.resources(t, ClusterConfig())
    assert r == {
        "nodes": 2,
        "tasks_per_node": 1,
        "gpus_per_node": 8,
        "cpus_per_task": 64,
        "mem_gb": 32,
        "timeout_min": 26,  # twice the trial's timeout (a claim may wait out another job), start-up, slack
    }
    offload = make_trial(["model=pythia-1b", "hardware=a100-80gb-x8", *OFFLOAD])
    assert slurm.resources(offload, ClusterConfig())["mem_gb"] == 8 * (4 + 80)
    cpu = slurm.resources(make_trial(TINY + ["hardware.mem_gib=1.5"]), ClusterConfig())
    assert (cpu["gpus_per_node"], cpu["cpus_per_task"], cpu["mem_gb"]) == (None, 2, 11)
    repeated = make_trial(["model=pythia-1b", "hardware=a100-80gb-x8", "measure.timeout_s=600", "measure.repeats=3"])
    assert slurm.resources(repeated, ClusterConfig())["timeout_min"] == 68  # (3 x (2 x 600 + 60) + 300) / 60
    mine = ClusterConfig(cpus_per_node=32, mem_gb=500, time_min=90)
    assert [slurm.resources(t, mine)[k] for k in ("cpus_per_task", "mem_gb", "timeout_min")] == [32, 500, 90]


def test_partition_account_qos_and_sbatch_options_come_from_the_cluster_conf():
    cfg = compose_cfg(["cluster.partition=gpu", "cluster.account=lab", "+cluster.sbatch.constraint=a100"])
    c = ClusterConfig(**cfg.cluster)
    assert slurm.site(c) == {"partition": "gpu", "account": "lab", "additional_parameters": {"constraint": "a100"}}
    assert slurm.site(ClusterConfig()) == {}  # nothing set: the cluster's defaults


@pytest.mark.slow
@needs_slurm
def test_a_grid_runs_as_slurm_jobs_and_every_result_lands_once(cluster, tmp_path):
    start = time.monotonic()
    p = sweep(cluster, tmp_path, *ONE_CPU, "methods.zero_stage=0,1")
    out = p.communicate(timeout=240)[0]
    assert p.returncode == 0, out[-3000:]
    runs = tmp_path / "runs"
    recs = [json.loads(f.read_text()) for f in sorted(runs.glob("*.json"))]
    assert sorted(r["trial"]["methods"]["zero_stage"] for r in recs) == [0, 1]
    assert all(r["outcome"] == "ok" for r in recs), [r["message"] for r in recs]
    assert not list(runs.glob(".*.tmp"))  # no torn or stray writes
    assert recs[0]["metrics"]["loss_per_step"] == pytest.approx(recs[1]["metrics"]["loss_per_step"], rel=1e-5)
    script = next((runs / "logs" / "slurm").rglob("*_submission.sh")).read_text()
    for line in ("--array=0-1", "--cpus-per-task=1", "--mem=4GB", "--nodes=1", "--ntasks-per-node=1", "--time=12"):
        assert f"#SBATCH {line}" in script
    assert "--gpus-per-node" not in script
    assert len(cluster.jobs()) == 2  # one job per trial
    print(f"\ntwo-trial grid on the local Slurm: {time.monotonic() - start:.1f} s")

    # The same grid again, as after an interrupted sweep: every job finds its trial stored.
    mtimes = {f: f.stat().st_mtime_ns for f in runs.glob("*.json")}
    p = sweep(cluster, tmp_path, *ONE_CPU, "methods.zero_stage=0,1")
    out = p.communicate(timeout=120)[0]
    assert p.returncode == 0, out[-3000:]
    assert {f: f.stat().st_mtime_ns for f in runs.glob("*.json")} == mtimes
    logs = "".join(f.read_text() for f in (runs / "logs" / "slurm").rglob("*_log.out"))
    assert logs.count("(from store)") == 2


@pytest.mark.slow
@needs_slurm
def test_killed_jobs_end_as_a_recorded_outcome_or_a_clear_error_in_bounded_time(cluster, tmp_path):
    hang = [*ONE_CPU, "debug.fault=hang", "measure.timeout_s=600"]
    t0, t1 = make_trial(hang + ["methods.zero_stage=0"]), make_trial(hang + ["methods.zero_stage=1"])
    p = sweep(cluster, tmp_path, *hang, "methods.zero_stage=0,1")
    deadline = time.monotonic() + 120
    while not (workers_of(t0) and workers_of(t1)):  # both jobs are running their trials
        assert time.monotonic() < deadline and p.poll() is None, "the jobs never started their trials"
        time.sleep(0.5)
    jobs = dict(cluster.jobs("running"))
    assert len(jobs) == 2, jobs
    cancelled, killed = sorted(jobs)  # array tasks _0 and _1: trial 0 and trial 1
    # scancel: Slurm sends SIGTERM and, KillWait later, SIGKILL; the launcher records the trial.
    subprocess.run(["scancel", cancelled], env=cluster.env, check=True, timeout=10)
    # As on a node that fails, or under the kernel's OOM killer: the job's processes die at once.
    (task,) = [p for p in psutil.process_iter(["cmdline"]) if job_of(p) == killed]
    for proc in [task, *task.children(recursive=True)]:
        proc.kill()
    start = time.monotonic()
    out = p.communicate(timeout=120)[0]
    waited = time.monotonic() - start
    print(f"\nsweep ended {waited:.1f} s after the kills")
    assert waited < 110  # bounded (KillWait is 10 s), far below the trials' 600 s timeout; a loaded machine is slow
    assert p.returncode != 0, out[-3000:]
    assert f"slurm job {killed} (" in out and "before its result came back" in out, out[-3000:]
    rec = json.loads((tmp_path / "runs" / f"{t0.id}.json").read_text())
    assert rec["outcome"] == "crashed"  # measured again by the next run of the sweep
    assert "killed by SIGTERM (Slurm is ending job " in rec["message"]
    assert not (tmp_path / "runs" / f"{t1.id}.json").exists()
    deadline = time.monotonic() + 30  # the last workers may take a moment to be reaped
    while workers_of(t0) or workers_of(t1):
        assert time.monotonic() < deadline, "workers outlived their jobs"
        time.sleep(0.2)


def job_of(p: psutil.Process) -> str | None:
    """The Slurm array task a job's own process (submitit's, running the trial's launcher) is in."""
    if (p.info["cmdline"] or [])[1:4] != ["-u", "-m", "submitit.core._submit"]:  # the task, not srun
        return None
    try:
        env = p.environ()
    except psutil.Error:
        return None
    return f"{env.get('SLURM_ARRAY_JOB_ID')}_{env.get('SLURM_ARRAY_TASK_ID')}"
