"""GPU detection: real device names map to the right profile, a trial on another GPU is flagged,
and a machine whose torch cannot use its GPUs says so instead of running the CPU demo."""

from __future__ import annotations

import importlib.util
import os
import stat

import pytest
from conftest import TINY, make_trial

from suite import detect
from suite.config.validate import unsupported
from suite.record import Record
from suite.runner import Ran, summary_line

MIB = 1 / 1024  # GiB per MiB
# Device names as `nvidia-smi --query-gpu=name,memory.total` and torch.cuda.get_device_name print
# them on real machines, with the memory nvidia-smi reports (torch reports up to ~1.5% less).
REAL = [
    ("NVIDIA H100 80GB HBM3", 81559, "h100-sxm"),
    ("NVIDIA H100 PCIe", 81559, "h100-pcie"),
    ("NVIDIA H100 NVL", 95830, "h100-nvl"),
    ("NVIDIA H200", 143771, "h200"),
    ("NVIDIA H200 NVL", 143771, "h200-nvl"),
    ("NVIDIA GH200 480GB", 97871, "gh200"),
    ("NVIDIA GH200 120GB", 97871, "gh200"),
    ("NVIDIA GH200 144G HBM3e", 146831, "gh200-144gb"),
    ("NVIDIA A100-SXM4-40GB", 40960, "a100-40gb"),
    ("A100-SXM4-40GB", 40536, "a100-40gb"),  # drivers that printed no "NVIDIA "
    ("NVIDIA A100-SXM4-80GB", 81920, "a100-80gb"),
    ("NVIDIA A100-SXM-80GB", 81920, "a100-80gb"),
    ("NVIDIA A100-PCIE-40GB", 40960, "a100-pcie-40gb"),
    ("NVIDIA A100 80GB PCIe", 81920, "a100-pcie-80gb"),
    ("Tesla V100-SXM2-32GB", 32510, "v100"),
    ("Tesla V100-SXM2-16GB", 16160, "v100-16gb"),
    ("Tesla V100-PCIE-16GB", 16384, "v100-pcie-16gb"),
    ("Tesla V100-PCIE-32GB", 32768, "v100-pcie-32gb"),
    ("NVIDIA RTX A6000", 49140, "a6000"),
    ("NVIDIA L40S", 46068, "l40s"),
    ("NVIDIA GeForce RTX 4090", 24564, "rtx-4090"),
    ("NVIDIA GeForce RTX 3090", 24576, "rtx-3090"),
    # No profile fits these: none is guessed.
    ("NVIDIA GeForce RTX 3090 Ti", 24564, None),
    ("NVIDIA GeForce RTX 4090 D", 24564, None),
    ("NVIDIA H800", 81559, None),
    ("NVIDIA L40", 46068, None),
    ("Tesla V100S-PCIE-32GB", 32768, None),
    ("NVIDIA RTX 6000 Ada Generation", 49140, None),
    ("NVIDIA A100-SXM4-40GB MIG 3g.20gb", 19968, None),
    ("NVIDIA H100 80GB HBM3", 65536, None),  # the name of one size, the memory of another
]


@pytest.mark.parametrize("name,mib,profile", REAL, ids=[f"{n} {m}" for n, m, _ in REAL])
def test_real_device_names_map_to_their_own_profile(name, mib, profile):
    assert detect.profile_of(name, mib * MIB) == profile
    assert detect.profile_of(name, mib * MIB * 0.985) == profile  # as torch reports it


def test_every_gpu_profile_is_found_by_its_own_name_and_has_every_gpu_count():
    for profile, (gpu, mem_gib) in detect.gpu_profiles().items():
        assert detect.profile_of(gpu, mem_gib) == profile
        for n in (1, 2, 4, 8):  # what detection names a machine is a hardware= value that composes
            t = make_trial([f"hardware={profile}-x{n}"])
            assert (t.hardware.name, t.hardware.count, t.hardware.gpu) == (f"{profile}-x{n}", n, gpu)


def test_a_machine_is_named_by_its_leading_gpus_of_one_profile():
    h100 = ("NVIDIA H100 80GB HBM3", 79.1)
    assert detect.profile_name([h100] * 8) == "h100-sxm-x8"
    assert detect.profile_name([h100] * 3) == "h100-sxm-x2"
    assert detect.profile_name([h100, h100, ("NVIDIA L40S", 44.4)]) == "h100-sxm-x2"
    assert detect.profile_name([("NVIDIA H100 NVL", 93.1)] * 4) == "h100-nvl-x4"
    assert detect.profile_name([("NVIDIA H800", 79.1)]) is None
    assert detect.profile_name([]) is None


def test_a_trial_on_another_gpu_than_its_profile_is_flagged():
    t = make_trial(["model=pythia-160m", "hardware=h100-sxm-x2"])
    assert detect.mismatch(t, [("NVIDIA H100 80GB HBM3", 79.1)] * 2) is None
    assert detect.mismatch(t, [("NVIDIA H100 80GB HBM3", 79.1), ("NVIDIA H100 80GB HBM3", None)]) is None
    flag = detect.mismatch(t, [("NVIDIA H100 80GB HBM3", 79.1), ("NVIDIA H100 NVL", 93.1)])
    assert flag["detected"] == "h100-nvl" and flag["device_name"] == "NVIDIA H100 NVL"
    assert flag["profile"] == "h100-sxm-x2" and flag["device_mem_gib"] == 93.1
    mig = detect.mismatch(t, [("NVIDIA H100 80GB HBM3 MIG 3g.40gb", 39.5)] * 2)
    assert mig["detected"] is None
    small = make_trial(["model=pythia-160m", "hardware=v100-x1", "methods.precision=fp16"])  # SXM2 32 GB
    assert detect.mismatch(small, [("Tesla V100-SXM2-16GB", 15.8)])["detected"] == "v100-16gb"


def test_the_summary_line_warns_of_a_profile_mismatch():
    t = make_trial(["model=pythia-160m", "hardware=h100-sxm-x1"])
    m = {
        "step_time_s": 1.0,
        "step_time_std_s": 0.01,
        "step_time_within_std_s": 0.01,
        "runs": 1,
        "noisy": False,
        "tokens_per_s": 1000.0,
        "mfu": 0.4,
        "peak_mem_gib": 10.0,
        "profile_mismatch": detect.mismatch(t, [("NVIDIA H100 NVL", 93.1)]),
    }

    def line_of(m: dict) -> str:
        return summary_line(Ran(Record(t.id, "", "ok", "", t.to_json(), m, 10.0, None)), t)

    line = line_of(m)
    assert "WARNING: ran on NVIDIA H100 NVL, not the NVIDIA H100 80GB HBM3 of hardware=h100-sxm-x1" in line
    assert "profile h100-nvl fits it" in line
    m["profile_mismatch"] = None
    assert "WARNING" not in line_of(m)


@pytest.mark.parametrize("capability,why", [((7, 0), "compute capability 8.0 or newer"), ((9, 0), None)])
def test_flash_attention_before_ampere_is_unsupported_with_the_reason(capability, why):
    t = make_trial(TINY + ["hardware=a100-80gb-x1", "methods.attention=flash_attention_2", "methods.precision=bf16"])
    found = unsupported(t, capability=capability)
    if why:
        assert why in found and f"{capability[0]}.{capability[1]}" in found
    else:  # an Ampere or newer GPU: the next reason here is the package (or no GPU at all)
        assert "compute capability" not in found
        assert "flash-attn" in found or "needs 1 CUDA GPU" in found


def test_flash_attention_not_installed_names_a_command_that_works():
    if importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("flash-attn is installed here")
    t = make_trial(TINY + ["hardware=h100-sxm-x1", "methods.attention=flash_attention_2", "methods.precision=bf16"])
    found = unsupported(t, capability=(9, 0))
    assert "flash-attn is not installed" in found and "--no-build-isolation" in found


def test_detect_stops_when_torch_cannot_use_the_gpus_the_driver_lists(tmp_path, monkeypatch, capsys):
    """A CPU-only torch on a GPU machine (faked: an nvidia-smi that lists a GPU) must not pass for
    'no GPU': detect exits 2 and says what to install; with no GPU at all it exits 1."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this torch sees a GPU")
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with pytest.raises(SystemExit) as done:
        detect.main()
    err = capsys.readouterr().err
    assert done.value.code == 2, err
    assert "nvidia-smi lists 1 GPU(s) (GPU 0: NVIDIA H100 80GB HBM3" in err and "(a CPU-only build)" in err
    assert "download.pytorch.org/whl/cu" in err
    monkeypatch.setattr(detect, "nvidia_smi_gpus", lambda: [])
    with pytest.raises(SystemExit) as done:
        detect.main()
    assert done.value.code == 1 and "no CUDA GPU" in capsys.readouterr().err
