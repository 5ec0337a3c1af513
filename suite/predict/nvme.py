"""What ZeRO-Infinity's NVMe tier keeps on the drive and in pinned host memory, per rank.

The NVMe tier (`methods.offload_device=nvme`, ZeRO-3, DeepSpeed's swappers): each optimizer
sub-group (`suite.methods.sub_groups`) of at least 1 MiB of fp32 keeps its fp32 parameter, two
moments and fp32 gradient on the drive, 16 bytes an element (stage3.py:1117-1128,
optimizer_utils.py `swap_out_gradients`), through 4 pinned host buffers of the largest sub-group
(partitioned_optimizer_swapper.py:79-110); under optimizer+params each parameter partition of at
least 1 MiB too (partition_parameters.py:1820-1826, `max_in_cpu` 0), through 5 pinned buffers
(`offload_param.buffer_size`) and one of the largest sub-group's 16-bit parameters for their
swap-out after the step (stage3.py:1005-1018). What is smaller stays in host memory.
"""

from __future__ import annotations

from suite import methods
from suite.config import Trial
from suite.predict.peaks import Layout, Term, bytes_per_element
from suite.predict.trace import Trace, traced


def swapped(t: Trial, tr: Trace) -> tuple[float, float]:
    """(optimizer elements, parameter elements) one rank swaps to the NVMe drive: the sub-groups
    and the partitions of at least `methods.MIN_SWAP_BYTES` (fp32 and the trial's dtype)."""
    if not methods.on_nvme(t):
        return 0.0, 0.0
    opt = sum(g for g in methods.sub_groups(t, tr.param_numels) if 4 * g >= methods.MIN_SWAP_BYTES)
    if t.methods.offload != "optimizer+params":
        return opt, 0.0
    w = bytes_per_element(t.precision)
    return opt, sum(x for x in methods.partitions(t, tr.param_numels) if w * x >= methods.MIN_SWAP_BYTES)


def terms(t: Trial, tr: Trace) -> list[Term]:
    """What one rank keeps on the NVMe drive (the module's docstring)."""
    opt, par = swapped(t, tr)
    out = []
    if opt:
        states = "fp32 parameters, moments and gradients of the swapped sub-groups"
        out.append(Term(states, 16 * opt, "stage3.py:1117-1128"))
    if par:
        w = bytes_per_element(t.precision)
        out.append(Term("swapped parameter partitions", w * par, "partition_parameters.py:1820-1826"))
    return out


def swap_bytes(t: Trial) -> float:
    """Bytes one rank of an NVMe trial swaps to the drive (0 for any other trial): what the drive
    must have free (`suite.config.validate.nvme_problems`)."""
    if not methods.on_nvme(t):
        return 0.0
    tr = traced(t.model, t.methods.attention, "none", t.precision)
    return Layout.total(terms(t, tr))


def buffers(t: Trial, tr: Trace) -> list[Term]:
    """The NVMe tier's pinned host buffers, per rank (the module's docstring)."""
    if not methods.on_nvme(t):
        return []
    sizes = methods.nvme_sizes(t, tr.param_numels)
    out = [
        Term(
            "optimizer swap buffers (pinned, fp32)",
            4 * methods.OPTIMIZER_SWAP_BUFFERS * sizes.largest_sub_group,
            "partitioned_optimizer_swapper.py:79-110",
        )
    ]
    if t.methods.offload == "optimizer+params":
        w = bytes_per_element(t.precision)
        out.append(
            Term(
                "parameter swap buffers (pinned)",
                w * methods.PARAM_SWAP_BUFFERS * sizes.param_buffer,
                "partitioned_param_swapper.py:104-130",
            )
        )
        out.append(Term("parameter swap-out buffer (pinned)", w * sizes.largest_sub_group, "stage3.py:1005-1018"))
    return out
