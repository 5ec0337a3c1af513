"""Multi-node trials: two launcher agents on localhost stand in for two nodes of a Slurm job.

Each agent is a real `suite-bench` process with the SLURM_* variables a Slurm task of a
two-node job gets; the trial is the same as a one-node trial with the same global batch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY, make_trial, measured

from suite.config import Trial
from suite.config.validate import problems
from suite.launch import free_port

FIXTURES = Path(__file__).parent / "fixtures" / "results"


def agents(tmp_path, *extra: str) -> list[subprocess.Popen]:
    """Node 0 and node 1 of a Slurm job of two nodes, one task each, both on this machine."""
    port = str(free_port())
    procs = []
    for node in (0, 1):
        env = dict(
            os.environ,
            SLURM_JOB_ID="4242",
            SLURM_JOB_NUM_NODES="2",
            SLURM_NTASKS="2",
            SLURM_NODEID=str(node),
            SLURM_PROCID=str(node),
            SLURM_LOCALID="0",
            SLURM_JOB_NODELIST="localhost",
            MASTER_PORT=port,
            OMP_NUM_THREADS="1",  # as the one-node trial's two ranks get on two cores
        )
        cmd = [sys.executable, "-m", "cli.bench", *TINY, "hardware=cpu-x1", "cluster.nodes=2", f"store.dir={tmp_path}"]
        out = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        procs.append(subprocess.Popen([*cmd, *extra], env=env, **out))
    return procs


def finish(procs: list[subprocess.Popen]) -> list[tuple[int, str]]:
    outs = [p.communicate(timeout=240)[0] for p in procs]
    return [(p.returncode, out) for p, out in zip(procs, outs, strict=True)]


def test_the_global_batch_is_split_over_every_node():
    t = make_trial(["model=pythia-1b", "hardware=a100-80gb-x8", "cluster.nodes=2", "methods.micro_batch=16"])
    assert (t.devices, t.per_device_batch, t.gas) == (16, 64, 4)
    assert t.id != make_trial(["model=pythia-1b", "hardware=a100-80gb-x8", "methods.micro_batch=16"]).id
    # A one-node trial's id leaves `nodes` out: records stored before the field existed keep theirs.
    assert make_trial(TINY + ["cluster.nodes=1"]).id == make_trial(TINY).id != make_trial(TINY + ["cluster.nodes=2"]).id
    old = [json.loads(p.read_text()) for p in sorted(FIXTURES.glob("*.json"))]
    assert old and all("nodes" not in r["trial"] and Trial.from_json(r["trial"]).id == r["trial_id"] for r in old)
    found = problems(make_trial(TINY + ["model.recipe.global_batch=6", "cluster.nodes=4"]))
    assert "model.recipe.global_batch=6 is not divisible by hardware.count=2 x cluster.nodes=4" in found
    assert "cluster.nodes=0 must be > 0" in problems(make_trial(TINY + ["cluster.nodes=0"]))


@pytest.mark.slow
def test_two_agents_on_localhost_give_the_loss_of_the_one_node_trial(tmp_path, trial_store):
    one = measured(trial_store, TINY)  # the one-node trial, from the session's store
    assert one.outcome == "ok", one.message
    procs = agents(tmp_path / "two", "measure.repeats=2")  # node 1 joins each of node 0's runs
    (rc0, out0), (rc1, out1) = finish(procs)
    assert rc0 == 0 and rc1 == 0, out0[-2000:] + out1[-2000:]
    assert "[   follower]" in out1 and "node 1: its ranks 1..1 finished" in out1
    files = list((tmp_path / "two").glob("*.json"))
    assert len(files) == 1  # node 0 alone records the trial
    two = json.loads(files[0].read_text())
    assert two["outcome"] == "ok" and two["trial"]["nodes"] == 2
    m = two["metrics"]
    assert len(m["memory_per_rank"]) == 2 and m["gas"] == one.metrics["gas"] == 2
    # Same global batch, same data per global rank, same initial weights: the same training, in each run.
    assert len(two["runs"]) == m["runs"] == 2
    for run in two["runs"]:
        assert run["metrics"]["loss_per_step"] == pytest.approx(one.metrics["loss_per_step"], rel=1e-5)


@pytest.mark.slow
def test_an_oom_on_node_1_is_recorded_by_node_0_as_oom_naming_that_rank(tmp_path):
    # Rank 1 alone allocates more than its memory budget (RLIMIT_DATA) at the first timed step.
    # Node 0 waiting for its blocked rank would record a timeout; it records the oom.
    (rc0, out0), (rc1, out1) = finish(agents(tmp_path, "debug.fault=oom", "debug.fault_rank=1"))
    rec = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert rec["outcome"] == "oom", rec["message"]
    assert rec["message"].startswith("rank 1: RuntimeError:") and "can't allocate memory" in rec["message"]
    # Node 1 ends cleanly: the failure is a recorded outcome, not a failed job.
    assert rc0 == 0 and rc1 == 0, out0[-2000:] + out1[-2000:]
    assert "[   follower]" in out1 and "node 0 recorded oom: rank 1:" in out1


@pytest.mark.slow
def test_a_rank_killed_on_node_1_is_the_root_cause_node_0_records(tmp_path):
    (rc0, out0), (rc1, out1) = finish(agents(tmp_path, "debug.fault=kill", "debug.fault_rank=1"))
    rec = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert rec["outcome"] == "crashed", rec["message"]  # node 0 lost its peer: recorded, not hung
    assert rec["message"].startswith("rank 1 killed by SIGKILL"), rec["message"]  # not rank 0's lost connection
    # Both nodes end cleanly: a single run exits 0 with the outcome it records (oom above, crashed here).
    assert rc0 == 0, out0[-2000:]
    assert rc1 == 0 and "node 0 recorded crashed: rank 1 killed by SIGKILL" in out1, out1[-2000:]


@pytest.mark.slow
def test_a_multi_node_trial_outside_slurm_says_how_to_run_it(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    cmd = [sys.executable, "-m", "cli.bench", *TINY, "cluster.nodes=2", f"store.dir={tmp_path}"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "cluster.nodes=2 but this is not a Slurm job" in out.stderr
    assert "hydra/launcher=slurm" in out.stderr and "Traceback" not in out.stderr
    assert list(tmp_path.glob("*.json")) == []
