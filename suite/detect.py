"""Which hardware profile the local GPUs are, and whether a trial ran on the GPU its profile names.

    python -m suite.detect    # prints the profile, e.g. a100-80gb-x4
                              # exit 1: no GPU here; exit 2: GPUs this torch cannot use, or of no known profile

A GPU is known by its exact device name (as `torch.cuda.get_device_name` and `nvidia-smi` print
it) and its memory: `gpu` and `mem_gib` of conf/hardware/<gpu>.yaml, plus ALIASES for the other
names one model goes by. Names are never matched by substring: an H100 NVL is not an H100 SXM,
a V100-PCIE-16GB not a V100-SXM2-32GB, and a GPU without a profile is reported as such rather
than given the nearest one (a wrong profile gives a wrong MFU).

A GPU trial's `hardware.mem_gib` below its GPU's memory (the profile's) is a cap (`memory_cap_gib`):
every rank's caching allocator may hold that much (`suite.worker.device_of`), so one large GPU
stands in for a smaller card, e.g. `hardware=h200 hardware.mem_gib=24` for a 24 GB one. What the
cap leaves out, the CUDA context and NCCL's buffers, is counted as `suite.predict` counts it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from functools import cache
from typing import Any

from suite.config import compose

# Device memory as reported against the profile's datasheet figure: ECC and the driver keep
# 2-7% (an L40S of 48 GB reports 46068 MiB, 45.0 GiB), while the sizes one name comes in
# differ by 15% or more (H100 NVL 94 GB against 80 GB; 16 against 32 GB).
MEM_TOLERANCE = 0.12
# Further device names of a profile's GPU, each seen on real systems.
ALIASES = {
    "NVIDIA GH200 120GB": "gh200",  # the 96 GB HBM3 GPU beside another CPU memory size; both report 97871 MiB
    "NVIDIA A100-SXM-80GB": "a100-80gb",  # as DGX A100 systems name their SXM4 80 GB GPUs
}


def normalize(name: str) -> str:
    """Case and spacing aside, and the 'NVIDIA ' that older drivers did not print ('A100-SXM4-40GB')."""
    name = re.sub(r"\s+", " ", name.strip().lower())
    return name.removeprefix("nvidia ")


@cache
def gpu_profiles() -> dict[str, tuple[str, float]]:
    """Every GPU type in conf/hardware/: its key (e.g. `h100-nvl`) -> (device name, memory in GiB)."""
    return {key: (d["gpu"], float(d["mem_gib"])) for key, d in compose.gpu_profiles().items()}


def profile_named(name: str) -> str | None:
    """The GPU profile whose device is called `name`, whatever its memory."""
    names = {normalize(gpu): profile for profile, (gpu, _) in gpu_profiles().items()}
    names.update({normalize(alias): profile for alias, profile in ALIASES.items()})
    return names.get(normalize(name))


def profile_of(name: str, mem_gib: float) -> str | None:
    """The GPU profile of a device with this name and memory, or None when none fits."""
    profile = profile_named(name)
    if profile is None:
        return None
    expected = gpu_profiles()[profile][1]
    return profile if abs(mem_gib / expected - 1) <= MEM_TOLERANCE else None


def local_gpus() -> list[tuple[str, float]]:
    """(device name, memory in GiB) of each GPU this process's torch sees, in CUDA order."""
    import torch

    if not torch.cuda.is_available():
        return []
    props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
    return [(p.name, p.total_memory / 2**30) for p in props]


def nvidia_smi_gpus() -> list[str]:
    """The GPUs the driver lists (`nvidia-smi -L`), whatever torch can do with them."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line for line in out.stdout.splitlines() if line.startswith("GPU ")] if out.returncode == 0 else []


def profile_name(gpus: list[tuple[str, float]]) -> str | None:
    """`<profile>-x<n>` for the leading GPUs of one profile (a trial uses devices 0..n-1)."""
    if not gpus:
        return None
    first = profile_of(*gpus[0])
    if first is None:
        return None
    same = 0
    while same < len(gpus) and profile_of(*gpus[same]) == first:
        same += 1
    return f"{first}-x{max(c for c in (1, 2, 4, 8) if c <= same)}"


def detect() -> str | None:
    """The hardware profile of this machine's GPUs, e.g. `a100-80gb-x4`, or None."""
    return profile_name(local_gpus())


def diagnose() -> tuple[int, str]:
    """(0, profile), or (1, why there is no GPU), or (2, why the GPUs here cannot be used)."""
    import torch

    listed = nvidia_smi_gpus()
    gpus = local_gpus()
    if not gpus and listed:
        build = f"torch {torch.__version__} " + (
            f"(built for CUDA {torch.version.cuda})" if torch.version.cuda else "(a CPU-only build)"
        )
        return 2, (
            f"nvidia-smi lists {len(listed)} GPU(s) ({listed[0]}) but {build} cannot use them. Install a CUDA "
            "build of torch that your driver supports (`nvidia-smi` shows the highest CUDA version it runs), e.g. "
            "`pip uninstall -y torch && pip install torch --index-url https://download.pytorch.org/whl/cu126` "
            "(pytorch.org lists the others), then run this again."
        )
    if not gpus:
        return 1, "no CUDA GPU here"
    found = profile_name(gpus)
    if found is None:
        name, gib = gpus[0]
        return 2, (
            f"GPU 0 is '{name}' with {gib:.1f} GiB, which matches no GPU type in conf/hardware/ "
            f"(known: {', '.join(gpu for gpu, _ in gpu_profiles().values())}). Add conf/hardware/<name>.yaml with its "
            "datasheet's figures and conf/hardware/<name>-x<n>.yaml, or pass hardware= yourself."
        )
    return 0, found


def gpu_mem_gib(hw: Any) -> float | None:
    """The memory of the hardware's GPU type, its conf/hardware profile's; None for a CPU or a GPU
    no profile names (a profile of the user's own)."""
    if hw.device != "cuda":
        return None
    profile = profile_named(hw.gpu)
    return gpu_profiles()[profile][1] if profile else None


def memory_cap_gib(hw: Any) -> float | None:
    """`hardware.mem_gib` where it caps a GPU's memory (above 0, below the GPU's `gpu_mem_gib`), else None."""
    full = gpu_mem_gib(hw)
    return float(hw.mem_gib) if full and 0 < hw.mem_gib < full else None


def mismatch(t: Any, devices: list[tuple[str, float | None]]) -> dict[str, Any] | None:
    """After a CUDA trial: None when every device it ran on is the GPU of its profile; else the
    first device that is not, the profile that fits it (`detected`, None when none does) and
    the profile the trial used.

    `devices`: (name, memory in GiB) per rank; memory None where it is not known (another node).
    """
    hw = t.hardware
    mem_gib = hw.mem_gib if memory_cap_gib(hw) is None else gpu_mem_gib(hw)  # a cap: the GPU is still its own
    expected = profile_of(hw.gpu, mem_gib)
    for name, gib in devices:
        got = profile_named(name) if gib is None else profile_of(name, gib)
        if expected is not None:
            fits = got == expected
        else:  # a profile of the user's own, not in conf/hardware/: its name and memory must still fit
            fits = normalize(name) == normalize(hw.gpu) and (gib is None or abs(gib / mem_gib - 1) <= MEM_TOLERANCE)
        if not fits:
            return {
                "device_name": name,
                "device_mem_gib": None if gib is None else round(gib, 2),
                "detected": got,
                "profile": hw.name,
                "profile_gpu": hw.gpu,
                "profile_mem_gib": hw.mem_gib,
            }
    return None


def main() -> None:
    code, text = diagnose()
    if code == 0:
        print(text)
    else:
        print(text, file=sys.stderr)
    sys.exit(code)


if __name__ == "__main__":
    main()
