"""Real multi-process trials on CPU: every ZeRO stage, the failure outcomes, the store.

Each test launches real worker processes (gloo, DeepSpeed on its CPU accelerator) and
takes seconds; nothing here is mocked.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import psutil
import pytest
from conftest import CPU_RECIPE, TINY, make_trial

from suite import launch, models, store
from suite.cli import run_one

pytestmark = pytest.mark.slow

STAGES = [
    (0, "none"),
    (1, "none"),
    (2, "none"),
    (3, "none"),
    (1, "optimizer"),
    (2, "optimizer"),
    (3, "optimizer"),
    (3, "optimizer+params"),
]


def workers_of(t) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "suite.worker" in cmd and f"trial-{t.id}-" in cmd:
            found.append(p)
    return found


@pytest.fixture(scope="module")
def zero_results(tmp_path_factory):
    """One real 2-process trial per (stage, offload), run once for the tests below."""
    d = tmp_path_factory.mktemp("zero")
    out = {}
    for stage, offload in STAGES:
        t = make_trial(TINY + [f"methods.zero_stage={stage}", f"methods.offload={offload}"])
        out[(stage, offload)] = (t, run_one(t, str(d), "test", in_sweep=True))
    return out


@pytest.mark.parametrize("stage,offload", STAGES)
def test_every_zero_stage_and_offload_trains_across_two_processes(zero_results, stage, offload):
    t, rec = zero_results[(stage, offload)]
    assert rec["outcome"] == "ok", rec["message"]
    m = rec["metrics"]
    assert len(m["memory_per_rank"]) == 2
    assert m["step_time_s"] > 0 and m["tokens_per_s"] > 0 and m["timed_steps"] == 3
    run = rec["runs"][0]["metrics"]  # the spread of the timed steps is the run's own
    assert run["step_time_min_s"] <= m["step_time_s"] == run["step_time_s"] <= run["step_time_max_s"]
    # gas = 8 / (2 ranks * 2) = 2 micro-steps, all measured: one plain and one boundary.
    assert m["gas"] == 2 and m["gas_measured"] == 2 and not m["extrapolated"]
    expected = m["micro_time_s"] + m["boundary_time_s"] + m["optimizer_time_s"]
    assert m["step_time_s"] == pytest.approx(expected, rel=1e-9)
    assert m["optimizer"] == (
        "DeepSpeedZeroOptimizer_Stage3" if stage == 3 else "DeepSpeedZeroOptimizer" if stage else "AdamW"
    )
    assert workers_of(t) == []


def test_zero_stages_give_the_loss_of_stage_0(zero_results):
    base = zero_results[(0, "none")][1]["metrics"]["loss_per_step"]
    assert base[0] != base[-1]  # it really trains
    for (stage, offload), (_, rec) in zero_results.items():
        # Offload steps with DeepSpeed's CPU Adam instead of torch's AdamW: same maths,
        # another kernel, so a looser tolerance.
        tol = 1e-5 if offload == "none" else 1e-3
        assert rec["metrics"]["loss_per_step"] == pytest.approx(base, rel=tol), (stage, offload)


def test_recomputation_is_really_applied(tiny, tmp_path):
    plain_flops, _ = models.count_flops(tiny().model, "sdpa", "none")
    rc_flops, _ = models.count_flops(tiny().model, "sdpa", "full")
    # Backward re-runs each block's forward: 2 of the tiny model's ~6.9e7 FLOPs per sample
    # are blocks, so the rise is the blocks' forward, not the embedding or the head.
    assert rc_flops > 1.1 * plain_flops
    rec = run_one(tiny("methods.recompute=full"), str(tmp_path), "test", in_sweep=True)
    assert rec["outcome"] == "ok", rec["message"]
    m = rec["metrics"]
    assert m["hardware_flops_per_token"] == pytest.approx(rc_flops / 64)
    assert m["model_flops_per_token"] == pytest.approx(plain_flops / 64)


def test_out_of_memory_under_a_cpu_budget_is_oom(tmp_path):
    # Pythia-14M in fp32 with Adam holds about 0.21 GiB of weights, gradients and state:
    # over a 0.15 GiB budget per worker.
    t = make_trial(CPU_RECIPE + ["hardware.mem_gib=0.15"])
    rec = run_one(t, str(tmp_path), "test", in_sweep=True)
    assert rec["outcome"] == "oom", rec["message"]
    assert "allocate" in rec["message"] or "MemoryError" in rec["message"]
    assert workers_of(t) == []


def test_a_worker_killed_mid_trial_is_crashed(tiny, tmp_path):
    t = tiny("debug.fault=kill", "debug.fault_rank=1")
    rec = run_one(t, str(tmp_path), "test", in_sweep=True)
    assert rec["outcome"] == "crashed"
    assert "rank 1 killed by SIGKILL" in rec["message"]
    assert workers_of(t) == []


def test_a_hung_worker_times_out_and_is_gone(tiny, tmp_path):
    t = tiny("debug.fault=hang", "debug.fault_rank=0", "measure.timeout_s=25")
    start = time.monotonic()
    rec = run_one(t, str(tmp_path), "test", in_sweep=True)
    assert rec["outcome"] == "timeout"
    assert 25 <= time.monotonic() - start < 40
    assert workers_of(t) == []


def test_a_non_finite_loss_is_nan(tiny, tmp_path):
    rec = run_one(tiny("debug.fault=nan"), str(tmp_path), "test", in_sweep=True)
    assert rec["outcome"] == "nan"
    assert "loss is nan" in rec["message"]


def test_a_repeated_trial_is_served_from_the_store(tmp_path):
    cmd = [sys.executable, "-m", "suite.cli", *TINY, f"store.dir={tmp_path}"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert first.returncode == 0, first.stderr[-2000:]
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1
    rec = json.loads(files[0].read_text())
    assert rec["outcome"] == "ok" and rec["provenance"]["versions"]["torch"]
    mtime = files[0].stat().st_mtime_ns
    start = time.monotonic()
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert second.returncode == 0
    assert "from store" in second.stdout
    assert time.monotonic() - start < 10  # no workers launched
    assert files[0].stat().st_mtime_ns == mtime
    third = subprocess.run(cmd + ["measure.rerun=true"], capture_output=True, text=True, timeout=180)
    assert third.returncode == 0 and "from store" not in third.stdout
    assert files[0].stat().st_mtime_ns != mtime


def test_store_writes_are_atomic_and_complete(tmp_path):
    rec = {"trial_id": "abc", "outcome": "ok", "metrics": {"x": 1}}
    store.save(tmp_path, rec)
    assert [p.name for p in tmp_path.iterdir()] == ["abc.json"]  # no temp file left behind
    assert store.load(tmp_path, "abc") == rec


def test_free_port_and_env_give_each_rank_its_identity(tiny):
    t = tiny()
    env = launch.worker_env(t, 1, 12345)
    assert (env["RANK"], env["WORLD_SIZE"], env["MASTER_PORT"], env["DS_ACCELERATOR"]) == ("1", "2", "12345", "cpu")
