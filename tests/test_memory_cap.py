"""A GPU's memory capped below its own (`hardware.mem_gib` under its profile's): one large GPU
standing in for a smaller card. Without a GPU: torch.cuda is mocked where a rank would touch it."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY, make_trial

from suite import detect, runner, store, worker
from suite.config import validate
from suite.labels import budget_label, describe
from suite.predict import Predictor
from suite.predict.machine import GIB

H200_MIB = 143771  # an H200's memory as the driver reports it (results/gpu-check/2026-12-04-h200/nvidia-smi.csv)
ON_H200 = [*TINY, "hardware=h200", "model.recipe.precision=bf16", "methods.micro_batch=2"]


def capped(gib: float, count: int = 1):
    return make_trial([*ON_H200, f"hardware.count={count}", f"hardware.mem_gib={gib:g}"])


def test_mem_gib_below_the_gpus_own_is_a_cap_with_a_budget_and_an_id_of_its_own():
    full, cap = make_trial([*ON_H200, "hardware.count=1"]), capped(24)
    assert detect.gpu_mem_gib(full.hardware) == 140 and detect.memory_cap_gib(full.hardware) is None
    assert detect.memory_cap_gib(cap.hardware) == 24 and cap.id != full.id
    assert budget_label(cap) == "h200-x1 capped at 24 GiB" and budget_label(full) == "h200-x1"
    assert "pythia-14m h200-x1 capped at 24 GiB DDP" in describe(cap)
    cpu = make_trial([*TINY, "hardware=cpu-x2-1gb"])  # a CPU budget is RLIMIT_DATA, never a GPU cap
    assert detect.memory_cap_gib(cpu.hardware) is None and budget_label(cpu) == cpu.hardware.name
    # The GPU it ran on is still its profile's: a cap is no profile mismatch.
    assert detect.mismatch(cap, [("NVIDIA H200", H200_MIB / 1024)]) is None
    assert detect.mismatch(cap, [("NVIDIA H100 80GB HBM3", 79.1)])["detected"] == "h100-sxm"


class FakeCuda:
    """What a rank asks of torch.cuda, on H200s, in the order it asks."""

    def __init__(self, mib: int = H200_MIB):
        self.calls: list[tuple] = []
        self.total = mib * 2**20

    def install(self, monkeypatch):
        props = type("Props", (), {"total_memory": self.total, "name": "NVIDIA H200"})
        monkeypatch.setattr(torch.cuda, "set_device", lambda i: self.calls.append(("set_device", i)))
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=None: "NVIDIA H200")
        fraction = lambda f, i=None: self.calls.append(("fraction", f, i))  # noqa: E731
        monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", fraction)
        return self


def test_every_rank_caps_its_allocator_when_it_sets_up_its_device(monkeypatch):
    cuda = FakeCuda().install(monkeypatch)
    t = capped(24, count=2)
    caps = [worker.device_of(t, rank)[2] for rank in (0, 1)]
    fraction = 24 * 2**30 / cuda.total
    assert cuda.calls == [("set_device", 0), ("fraction", fraction, 0), ("set_device", 1), ("fraction", fraction, 1)]
    assert caps[1] == {
        "cap_gib": 24.0,
        "device_name": "NVIDIA H200",
        "device_total_gib": H200_MIB / 1024,
        "fraction": pytest.approx(0.1709, abs=1e-4),
    }
    cuda.calls.clear()
    assert worker.device_of(make_trial([*ON_H200, "hardware.count=1"]), 0)[2] is None  # the GPU's own memory
    assert cuda.calls == [("set_device", 0)]


def test_a_cap_above_the_gpu_is_refused_before_anything_launches(tmp_path, monkeypatch, capsys):
    over = capped(200)
    assert "hardware.mem_gib=200 is above the 140 GiB of NVIDIA H200" in "; ".join(validate.problems(over))
    with pytest.raises(SystemExit) as exit_:  # a single run: every problem, exit 2
        runner.run_one(over, str(tmp_path), "adhoc", in_sweep=False)
    assert exit_.value.code == 2 and "caps the device's memory" in capsys.readouterr().err
    assert runner.run_one(over, str(tmp_path), "sweep", in_sweep=True).record.outcome == "invalid"
    # Below the profile's 80 but above what this H100 reports: refused against the device itself.
    near = make_trial(
        [*TINY, "hardware=h100-sxm", "hardware.count=1", "model.recipe.precision=bf16", "hardware.mem_gib=79.9"]
    )
    assert validate.problems(near) == [] and detect.memory_cap_gib(near.hardware) == 79.9
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(validate, "local_gpus", lambda: [("NVIDIA H100 80GB HBM3", 79.11)])
    why = validate.unsupported(near)
    assert why.startswith("hardware.mem_gib=79.9 caps each GPU's memory, but GPU 0 (NVIDIA H100 80GB HBM3) has 79.11")
    monkeypatch.setattr("suite.launch.run_trial", lambda *a, **k: pytest.fail("launched"))
    rec = runner.run_one(near, str(tmp_path), "sweep", in_sweep=True).record
    assert rec.outcome == "unsupported" and store.load(str(tmp_path), near.id).message == why


def test_under_a_cap_the_fit_is_the_allocators_memory_the_context_and_nccl_outside_it():
    full, cap = make_trial([*ON_H200, "hardware.count=2"]), capped(24, count=2)
    p, q = Predictor().predict(full), Predictor().predict(cap)
    overhead = Predictor().machine(full).overhead
    outside = sum(b for b, _, counted in overhead.values() if not counted) / GIB  # the context, NCCL's buffers
    assert outside > 0.3 and q.peak_mem_gib == p.peak_mem_gib
    assert q.device_gib == pytest.approx(p.device_gib - outside) and q.capacity_gib == 24 and q.fits
    # A capped trial fits on what it allocates (the allocator frees its cache before it fails), the
    # context and NCCL outside the cap; on the GPU's own memory they count.
    allocated = max(q.peak_mem_gib, q.build_peak_mem_gib)
    assert Predictor().predict(capped(allocated * 1.01, count=2)).fits
    assert not Predictor().predict(capped(allocated * 0.99, count=2)).fits
    assert q.reserved_gib == q.device_gib and p.device_gib == pytest.approx(p.reserved_gib + outside)
