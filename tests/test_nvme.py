"""The memory hierarchy: the NVMe tier as a method (ZeRO-Infinity, DeepSpeed's async I/O), its
checks before a launch, the host in the hardware profiles, offload and NVMe predicted on GPUs,
and the largest model a budget can train per tier.

One real trial (marked slow): ZeRO-3 with optimizer and parameters on NVMe on two CPU workers,
against ZeRO-0 of the same model. It needs DeepSpeed's async I/O op, hence libaio (CI installs
libaio-dev); without it the trial is skipped, the reason naming the package.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import ROOT, TINY, make_trial, measured_all

from suite import methods, nvme
from suite.config import validate
from suite.config.validate import nvme_problems, problems, unsupported
from suite.ops import aio_problem
from suite.predict import Predictor, timing
from suite.predict import nvme as nvme_tier
from suite.predict.trace import traced
from suite.runner import run_one

# TINY with a vocabulary of 8192: its two embeddings' partitions on two ranks are 1 MiB of fp32,
# the smallest DeepSpeed swaps (smaller ones stay in host memory), so parameters really go to NVMe.
SWAPPED = TINY + ["model.config.vocab_size=8192"]
NVME = ["methods.zero_stage=3", "methods.offload=optimizer+params", "methods.offload_device=nvme"]


def test_the_nvme_tier_is_in_the_id_only_when_on_and_its_folder_never():
    plain = make_trial(TINY + ["methods.zero_stage=3", "methods.offload=optimizer"])
    cpu = make_trial(TINY + ["methods.zero_stage=3", "methods.offload=optimizer", "methods.offload_device=cpu"])
    assert cpu.id == plain.id
    on = make_trial(TINY + ["methods.zero_stage=3", "methods.offload=optimizer", "methods.offload_device=nvme"])
    assert on.id != plain.id
    elsewhere = make_trial(TINY + NVME[:2] + ["methods.offload_device=nvme", "methods.nvme_path=/elsewhere"])
    assert elsewhere.id == make_trial(TINY + NVME).id
    # The host block describes the node to the predictor: not what runs.
    host = make_trial(TINY + ["hardware.host.mem_gib=256", "hardware.host.nvme_read_gbps=7"])
    assert host.id == make_trial(TINY).id


def test_bad_nvme_combinations_are_refused_each_named():
    def says(*extra: str) -> str:
        return " | ".join(problems(make_trial(TINY + list(extra))))

    for stage in (0, 1, 2):
        assert "needs methods.zero_stage=3" in says(f"methods.zero_stage={stage}", *NVME[1:]), stage
    assert "methods.offload=none offloads nothing" in says("methods.zero_stage=3", "methods.offload_device=nvme")
    assert "FSDP2's CPUOffloadPolicy offloads to host memory only" in says(
        "methods.engine=fsdp2", "methods.offload=optimizer+params", "methods.offload_device=nvme"
    )
    assert "methods.offload_device='disk' is not allowed" in says("methods.offload_device=disk")
    assert problems(make_trial(TINY + NVME)) == []


def test_the_drive_is_checked_before_a_launch(tmp_path, monkeypatch):
    """An unwritable folder, too little free space for the predicted swap: each named, exit 2 for
    a single run, `invalid` in a sweep; a good folder passes and is left as found."""
    t = nvme.resolved(make_trial(SWAPPED + NVME), tmp_path)
    assert t.methods.nvme_path == str(tmp_path / "nvme") and nvme_problems(t) == []
    assert not (tmp_path / "nvme" / t.id).exists()
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    bad = replace(t, methods=replace(t.methods, nvme_path=str(blocked / "sub")))
    (why,) = nvme_problems(bad)
    assert f"methods.nvme_path={blocked / 'sub'}" in why and "not a folder this user can write" in why
    need = nvme_tier.swap_bytes(t) * t.hardware.count
    assert need > 2 * (16 + 4) * 2**18  # both ranks' fp32 states and gradients, and their parameters
    monkeypatch.setattr(validate.shutil, "disk_usage", lambda _: _Free(need / 2))
    (why,) = nvme_problems(t)
    assert "less than the" in why and "GiB this trial's 2 rank(s) swap (predicted)" in why
    with pytest.raises(SystemExit) as e:
        run_one(t, str(tmp_path), "test", in_sweep=False)
    assert e.value.code == 2
    rec = run_one(t, str(tmp_path), "test", in_sweep=True).record
    assert rec.outcome == "invalid" and "predicted" in rec.message


class _Free:
    def __init__(self, free: float):
        self.free = int(free)


def test_without_libaio_an_nvme_trial_is_unsupported_and_a_single_run_exits_2(tmp_path, monkeypatch, capsys):
    gone = "the NVMe tier needs DeepSpeed's async I/O op, which needs libaio, absent here: apt-get install libaio-dev"
    monkeypatch.setattr(validate, "aio_problem", lambda: gone)
    t = make_trial(SWAPPED + NVME)
    assert "libaio-dev" in unsupported(t)
    rec = run_one(t, str(tmp_path), "test", in_sweep=True).record
    assert rec.outcome == "unsupported" and "libaio-dev" in rec.message and rec.wall_s == 0.0
    with pytest.raises(SystemExit) as e:
        run_one(make_trial(SWAPPED + NVME + ["measure.seed=1"]), str(tmp_path), "test", in_sweep=False)
    assert e.value.code == 2 and "libaio-dev" in capsys.readouterr().err


def test_the_deepspeed_config_of_the_nvme_tier():
    t = nvme.resolved(make_trial(SWAPPED + NVME), "/store")
    numels = traced(t.model, t.methods.attention, "none", t.precision).param_numels
    cfg = methods.deepspeed_config(t, t.gas, numels)
    zero, folder = cfg["zero_optimization"], f"/store/nvme/{t.id}"
    assert zero["offload_optimizer"] == {"device": "nvme", "pin_memory": False, "nvme_path": folder, "buffer_count": 4}
    sizes = methods.nvme_sizes(t, numels)
    assert zero["offload_param"] == {
        "device": "nvme", "pin_memory": False, "nvme_path": folder, "buffer_count": 5,
        "buffer_size": sizes.param_buffer, "max_in_cpu": 0,
    }  # fmt: skip
    # One sub-group (the whole partition) and buffers that hold it and the largest partition.
    assert sizes.largest_sub_group == sum(methods.partitions(t, numels)) <= sizes.param_buffer
    assert zero["sub_group_size"] == methods.NVME_SUB_GROUP and zero["stage3_prefetch_bucket_size"] == 0
    assert cfg["aio"]["block_size"] == 2**20 and cfg["aio"]["queue_depth"] == 32
    with pytest.raises(ValueError, match="sized to the model"):
        methods.deepspeed_config(t, t.gas)
    assert "aio" not in methods.deepspeed_config(make_trial(TINY + NVME[:2]), 1)


def _gpu(*extra: str):
    base = ["model=pythia-1b", "hardware=rtx-3090", "hardware.count=2", "methods.zero_stage=3", "methods.micro_batch=4"]
    return make_trial(base + list(extra))


def test_offload_on_a_gpu_profile_costs_the_hosts_cpu_adam_and_the_host_link():
    """The README's offload prediction: finite, and slower than no offload by the host's CPU Adam
    over the node's ranks and the gradients and parameters across the host link."""
    predictor = Predictor()
    plain = predictor.predict(_gpu())
    for offload in ("optimizer", "optimizer+params"):
        t = _gpu(f"methods.offload={offload}")
        p = predictor.predict(t)
        d = p.time_detail
        assert math.isfinite(p.step_time_s) and p.fits and p.host_gib > 0
        owned = traced(t.model, t.methods.attention, "none", t.precision).n_params / 2
        assert d["host_adam_s"] == pytest.approx(owned * 2 / t.hardware.host.adam_elements_per_s)
        up = 0 if offload == "optimizer+params" else 2 * owned  # bf16 parameters back up, unless they live on the host
        assert d["host_transfer_s"] == pytest.approx((4 * owned + up) / (t.hardware.host_gbps * 1e9))
        assert p.t_optimizer_s - plain.t_optimizer_s == pytest.approx(
            d["host_adam_s"] + d["host_transfer_s"] - plain.time_detail["adam_s"], rel=1e-6
        )
        assert p.step_time_s > plain.step_time_s
    # The host of the profile, overridden: a host too small for the offloaded states does not fit.
    small = predictor.predict(_gpu("methods.offload=optimizer", "hardware.host.mem_gib=8"))
    assert not small.fits and small.short_of == "host memory"


def test_the_nvme_tier_predicted_on_a_gpu_and_its_drive_must_hold_it():
    t = _gpu(*NVME[1:])
    p = Predictor().predict(t)
    tr = traced(t.model, t.methods.attention, "none", t.precision)
    opt, par = nvme_tier.swapped(t, tr)
    assert opt == pytest.approx(tr.n_params / 2, rel=0.01) and par > 0.9 * tr.n_params / 2
    assert p.nvme_gib == pytest.approx((16 * opt + 2 * par) / 2**30)
    read, written = timing.nvme_traffic(t, tr)
    assert p.time_detail["nvme_read_bytes"] == 2 * read and read >= 16 * opt + 2 * par * t.gas
    h = t.hardware.host
    seconds = 2 * (16 * opt / (h.nvme_read_gbps * 1e9) + written / (h.nvme_write_gbps * 1e9))
    assert p.time_detail["nvme_s"] == pytest.approx(seconds)
    assert p.step_time_s > Predictor().predict(_gpu("methods.offload=optimizer+params")).step_time_s
    full = Predictor().predict(_gpu(*NVME[1:], "hardware.host.nvme_gib=10"))
    assert full.short_of == "NVMe" and not full.fits


def test_largest_takes_a_family_and_says_which(capsys):
    from cli import predict

    assert predict.main(["model=gpt", "hardware=rtx-3090", "--largest"]) == 2
    assert "--largest takes model=FAMILY, one of llama, pythia (got model=gpt)" in capsys.readouterr().err


@pytest.mark.slow
def test_the_largest_model_per_tier_widens_with_each_tier():
    """Pythia-70M to 1B on a GPU of 3 GiB with 4 GiB of host memory: host memory trains a larger
    member than the GPU alone, and the NVMe drive a larger one still."""
    from analysis.largest import ladder, largest
    from analysis.prices import gpu_keys, load_prices
    from suite.config.schema import SearchConfig

    budget = ["hardware=rtx-3090", "hardware.mem_gib=3", "hardware.host.mem_gib=4"]
    sizes = ("pythia-70m", "pythia-160m", "pythia-410m", "pythia-1b")
    members = [m for m in ladder("pythia", budget) if m.model.name in sizes]
    search = SearchConfig(engines=["deepspeed"], recomputes=["full"])
    found = largest(members, search, Predictor(), load_prices(), gpu_keys())
    assert [f.member.model.name for f in found] == ["pythia-70m", "pythia-160m", "pythia-410m"]
    gpu, host, drive = (f.row for f in found)
    assert "offload" not in gpu["config"] and "offload" in host["config"] and "@nvme" in drive["config"]
    assert all(r["fits"] and r["days"] > 0 and r["tokens_per_s"] > 0 for r in (gpu, host, drive))
    # Each tier's error label is its best configuration's regime's: on a consumer card, never unnamed.
    assert all(r["labels"].regime.startswith("consumer-workstation · ") for r in (gpu, host, drive))
    assert all(r["labels"].regime in r["labels"].step.long for r in (gpu, host, drive))


@pytest.mark.slow
def test_a_zero3_trial_on_nvme_trains_as_zero0_and_records_what_it_swapped(trial_store):
    """Three steps of ZeRO-3 with optimizer states and parameters swapped to NVMe through
    DeepSpeed's async I/O on two CPU workers: the first loss of ZeRO-0 within 1%, the bytes each
    rank's counters saw move as the predictor says, the swap folder gone after the trial."""
    why = aio_problem()
    if why:
        pytest.skip(why)
    swapped, zero0 = measured_all(trial_store, [SWAPPED + NVME, SWAPPED + ["methods.zero_stage=0"]])
    assert swapped.outcome == "ok", swapped.message
    m, base = swapped.metrics, zero0.metrics
    assert m["optimizer"] == "deepspeed DeepSpeedCPUAdam" and m["optimizer_wrapper"] == "DeepSpeedZeroOptimizer_Stage3"
    assert m["first_loss"] == pytest.approx(base["first_loss"], rel=0.01)
    assert m["loss_per_step"][-1] < m["first_loss"]
    t = swapped.trial
    assert t.methods.nvme_path == str(Path(trial_store) / "nvme") and not Path(methods.swap_dir(t)).exists()
    read, written = timing.nvme_traffic(t, traced(t.model, t.methods.attention, "none", t.precision))
    assert m["nvme_read_bytes_per_step"] == pytest.approx(2 * read, rel=0.1)
    assert m["nvme_write_bytes_per_step"] == pytest.approx(2 * written, rel=0.1)
    assert m["nvme_read_gbps"] > 0 and m["nvme_write_gbps"] > 0


def test_the_ci_installs_libaio_and_setup_builds_its_op():
    assert "libaio-dev" in (ROOT / ".ci/run").read_text()
    out = subprocess.run([sys.executable, "-m", "suite.ops", "nonsense"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2 and "async_io" in out.stderr
    assert json.dumps(methods.aio_config(make_trial(TINY)))  # plain data, as the exports write it
