"""Map the local GPUs to a hardware profile name, e.g. `a100-80gb-x4`.

python -m suite.detect      # prints the profile, or exits 1 when there is no known GPU
"""

from __future__ import annotations

import sys

# (substring of torch.cuda.get_device_name, extra test on memory in GiB, profile)
PROFILES = [
    ("H200", None, "h200"),
    ("H100 PCIe", None, "h100-pcie"),
    ("H100", None, "h100-sxm"),
    ("A100", lambda gib: gib > 60, "a100-80gb"),
    ("A100", None, "a100-40gb"),
    ("A6000", None, "a6000"),
    ("L40S", None, "l40s"),
    ("4090", None, "rtx-4090"),
    ("3090", None, "rtx-3090"),
    ("V100", None, "v100"),
]


def detect() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(0)
    gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    count = max(c for c in (1, 2, 4, 8) if c <= torch.cuda.device_count())
    for key, test, profile in PROFILES:
        if key in name and (test is None or test(gib)):
            return f"{profile}-x{count}"
    return None


if __name__ == "__main__":
    found = detect()
    if found is None:
        sys.exit("no CUDA GPU with a known hardware profile (conf/gpu/)")
    print(found)
