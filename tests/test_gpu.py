"""Real trials on this machine's first GPU, under both engines (marked `gpu`: they skip without a
CUDA GPU; on a GPU machine `pytest -m gpu` runs them). The GPU check (scripts/gpu-check.sh)
judges the figures at full size; these check that the GPU path runs end to end."""

from __future__ import annotations

import pytest
from conftest import TINY, make_trial

from suite import detect
from suite.runner import run_one

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


@pytest.fixture(scope="module")
def profile() -> str:
    """The local GPUs' profile (one GPU of it), or a failure saying none fits them."""
    found = detect.detect()
    assert found, f"no profile in conf/hardware/ fits this machine's GPUs: {detect.local_gpus()}"
    return found.rsplit("-x", 1)[0]


@pytest.mark.parametrize("engine", ["deepspeed", "fsdp2"])
def test_a_tiny_trial_runs_on_the_gpu_with_its_figures(profile, engine, tmp_path):
    model = [o for o in TINY if o.startswith("model") and "precision" not in o]  # conftest's test model
    gpu = [f"hardware={profile}", "hardware.count=1", "methods.precision=bf16", f"methods.engine={engine}"]
    t = make_trial([*model, *gpu, "methods.micro_batch=2", "measure.timed_steps=3"])
    rec = run_one(t, str(tmp_path), "test", in_sweep=True).record
    assert rec.outcome == "ok", rec.message
    m = rec.metrics
    assert m["engine"] == engine and m["precision"] == "bf16" and m["timed_steps"] == 3
    assert 0 < m["mfu"] < 1 and m["hfu"] >= m["mfu"]  # against the datasheet's bf16 peak
    assert 0 < m["peak_mem_gib"] <= m["peak_reserved_gib"]  # the CUDA allocator's own figures
    assert m["profile_mismatch"] is None  # the GPU it ran on is its profile's
