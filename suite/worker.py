"""One rank of a trial: build the model under its engine, warm up, time a fixed window.

Run by the launcher as `python -m suite.worker SPEC.json OUT_DIR` with the usual
torch.distributed environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).
Rank 0 writes OUT_DIR/result.json; a failing rank writes OUT_DIR/error-rank<r>.json with
its outcome and exits with code 3 without waiting for its peers.
"""

from __future__ import annotations

import json
import math
import os
import resource
import signal
import sys
import time
import traceback
from dataclasses import dataclass

from suite import metrics
from suite.config import Trial
from suite.detect import memory_cap_gib
from suite.files import write_json
from suite.methods import on_nvme

EXTRA_WARMUP = 20  # warm-up steps allowed past measure.warmup_steps for compiles and the fp16 loss scale to settle
# Out-of-memory in an error's text (lower case), where it is not a MemoryError or
# torch.OutOfMemoryError. Where each comes from:
OOM_MARKERS = (
    "out of memory",  # CUDA: the caching allocator's "CUDA out of memory", cudaErrorMemoryAllocation's
    # "CUDA error: out of memory" (also pinned host memory), "CUDA driver error: out of memory",
    # and NCCL's "Cuda failure 'out of memory'" in the "Last error:" that torch appends (NCCLUtils.cpp)
    "can't allocate memory",  # torch's CPU allocator: "DefaultCPUAllocator: can't allocate memory: ..."
    "cannot allocate memory",  # strerror(ENOMEM), "[Errno 12] Cannot allocate memory"
    "alloc_failed",  # "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`" (torch's
    # TORCH_CUDABLAS_CHECK); cuDNN 8's "cuDNN error: CUDNN_STATUS_ALLOC_FAILED"; cuSPARSE, cuSOLVER, cuFFT alike
    "allocation_failed",  # cuDNN 9: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED (and _HOST_)
    "failed to malloc",  # NCCL's host allocation (alloc.h): "Failed to malloc N bytes"
    "failed to cuda host alloc",  # NCCL's pinned host allocation (alloc.h)
    "std::bad_alloc",  # a C++ allocation failure that torch passes on as a RuntimeError
)


class NonFiniteLoss(RuntimeError):
    pass


def vm_data_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("VmData not found in /proc/self/status")


def enforce_memory_budget(budget_gib: float) -> int:
    """Cap this process's data segment at what it holds now plus the budget.

    The imported runtime (torch, DeepSpeed, ...) is the baseline; the budget stands for a
    device's memory: model, optimizer state, activations and buffers must fit in it.
    """
    base = vm_data_bytes()
    limit = base + int(budget_gib * 2**30)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    return base


def machine_share_gib() -> float:
    """Without a budget, this rank's share of 90% of the machine's memory: a trial too big
    for the machine is then an `oom` result, not a victim of the kernel's OOM killer."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return 0.9 * total / int(os.environ.get("LOCAL_WORLD_SIZE", "1")) / 2**30


def host_hwm_gib() -> float:
    """This process's resident-set high-water mark (VmHWM) since it started or since
    `reset_peaks`."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**20
    raise RuntimeError("VmHWM not found in /proc/self/status")


def reset_peaks(cuda: bool) -> None:
    """Start a new memory window: device peaks and the host high-water mark restart from now.
    Writing 5 to clear_refs resets VmHWM to the current RSS (Linux, proc(5))."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    if cuda:
        import torch

        torch.cuda.reset_peak_memory_stats()


def peaks(cuda: bool) -> dict[str, float]:
    """The current window's peaks: the host's, and the device's allocated and reserved memory."""
    out = {"host_peak_gib": host_hwm_gib()}
    if cuda:
        import torch

        out["allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
        out["reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
    return out


def io_bytes() -> tuple[int, int]:
    """(read_bytes, write_bytes): what this process, all its threads, has had the storage layer
    fetch and send so far (/proc/self/io; proc(5)). DeepSpeed's async I/O threads open the NVMe
    tier's swap files with O_DIRECT (csrc/aio/common/deepspeed_aio_common.cpp), past the page
    cache, so these count what the drive moved."""
    with open("/proc/self/io") as f:
        fields = dict(line.split(": ") for line in f.read().splitlines())
    return int(fields["read_bytes"]), int(fields["write_bytes"])


@dataclass
class Window:
    """Which steps warm up, which are timed, and the counts recorded about them.

    The warm-up runs `warmup` steps, then goes on (at most EXTRA_WARMUP more) until a step
    compiles nothing new and its update was applied (an fp16 loss scale that has settled). In
    the timed window a step whose update was skipped is discarded and run again (at most
    `timed` times); a compile there is counted, and flagged by the count.
    """

    warmup: int
    timed: int
    warmup_run: int = 0
    skipped_warmup: int = 0
    discarded: int = 0
    recompiles: int = 0
    kept: int = 0
    timing: bool = False

    @property
    def first_timed(self) -> bool:
        return self.timing and self.kept == 0 and self.discarded == 0

    def keep(self, new_graphs: int, skipped: bool) -> bool:
        """Account for a step just run (figures agreed by all ranks); True if its timing counts."""
        if not self.timing:
            self.warmup_run += 1
            self.skipped_warmup += skipped
            settled = not new_graphs and not skipped
            self.timing = self.warmup_run >= self.warmup and (settled or self.warmup_run >= self.warmup + EXTRA_WARMUP)
            return False
        self.recompiles += new_graphs
        if skipped:
            self.discarded += 1
            if self.discarded > self.timed:
                raise NonFiniteLoss(f"fp16 overflow: {self.discarded} steps of the timed window skipped their update")
            return False
        self.kept += 1
        return True


@dataclass
class Timings:
    """The timed window's figures of this rank: per kept step, the non-boundary micro-steps, the
    boundary micro-step and the optimizer step; the loss of each kept step and the first loss."""

    micro_s: list[list[float]]
    boundary_s: list[float]
    optimizer_s: list[float]
    losses: list[float]
    first_loss: float | None
    io: dict[str, float] | None = None
    """This rank's storage traffic over the window (`io_bytes`): read and written bytes, the
    window's seconds and steps (kept and discarded alike)."""


def device_of(t: Trial, local_rank: int):
    """This rank's device, its synchronize (a no-op on a CPU, whose kernels run synchronously) and
    the trial's memory cap, applied before anything is allocated on the device (`cap_memory`)."""
    import torch

    if t.hardware.device != "cuda":
        return torch.device("cpu"), lambda: None, None
    torch.cuda.set_device(local_rank)
    cap = cap_memory(t, local_rank)
    torch.backends.cuda.matmul.allow_tf32 = t.tf32
    torch.backends.cudnn.allow_tf32 = t.tf32
    return torch.device("cuda", local_rank), torch.cuda.synchronize, cap


def cap_memory(t: Trial, local_rank: int) -> dict | None:
    """Hold this rank's caching allocator to the trial's memory cap (`suite.detect.memory_cap_gib`:
    hardware.mem_gib below its GPU's memory), so that one large GPU stands in for a smaller card;
    what the cap was, and of which device, for the record (None: no cap). The allocator raises
    out-of-memory where its reserved memory would pass the cap; the CUDA context and NCCL's buffers
    are outside it (the predictor counts them so, `suite.predict`)."""
    import torch

    cap = memory_cap_gib(t.hardware)
    if cap is None:
        return None
    total = torch.cuda.get_device_properties(local_rank).total_memory
    fraction = cap * 2**30 / total
    if fraction > 1:  # refused before launch (suite.config.validate.cap_above_devices); a device changed since
        raise ValueError(f"hardware.mem_gib={cap:g} is above this GPU's {total / 2**30:.2f} GiB: a cap adds none")
    torch.cuda.set_per_process_memory_fraction(fraction, local_rank)
    name = torch.cuda.get_device_name(local_rank)
    return {"cap_gib": cap, "device_name": name, "device_total_gib": total / 2**30, "fraction": fraction}


def timed_window(t: Trial, eng, pool: list, device, sync, rank: int, w: Window) -> Timings:
    """Warm up, then time `t.measure.timed_steps` optimizer steps (the `Window` decides which)."""
    import torch
    import torch.distributed as dist

    gas = t.gas_measured
    graphs = compiled_graphs if t.methods.compile else lambda: 0

    def one_step(k: int, poison: bool) -> tuple[list[float], float, float, float]:
        micro, losses = [], []
        for i in range(gas):
            sync()  # the device is idle: the timer holds this micro-step's work only
            t0 = time.perf_counter()
            loss = eng.micro_step(pool[(k + i) % len(pool)], boundary=i == gas - 1)
            sync()
            t1 = time.perf_counter()
            if i < gas - 1:
                micro.append(t1 - t0)
            losses.append(loss * math.nan if poison else loss)
        eng.step()  # the optimizer update, timed apart from the boundary micro-step
        sync()
        t2 = time.perf_counter()
        # .item() is a device sync point, so it stays outside the timers.
        return micro, t1 - t0, t2 - t1, torch.stack(losses).float().mean().item()

    out = Timings([], [], [], [], None)
    k = 0
    io_start = None
    while w.kept < t.measure.timed_steps:
        if w.first_timed and rank == t.debug.fault_rank:
            inject(t.debug.fault)
        before = graphs()
        poison = w.timing and t.debug.fault == "nan" and rank == t.debug.fault_rank
        micro, boundary, optimizer, loss = one_step(k, poison)
        k += gas
        out.first_loss = loss if out.first_loss is None else out.first_loss
        if not math.isfinite(loss):
            raise NonFiniteLoss(f"loss is {loss} at step {w.warmup_run + w.discarded + w.kept} on rank {rank}")
        skipped = not eng.step_applied() or overflow_injected(t, rank, w)
        # Every rank must end the warm-up and discard a step together: agree on the figures.
        flags = torch.tensor([graphs() - before, int(skipped)], device=device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        was_timing = w.timing
        if w.keep(int(flags[0]), bool(flags[1])):
            out.micro_s.append(micro)
            out.boundary_s.append(boundary)
            out.optimizer_s.append(optimizer)
            out.losses.append(loss)
        elif w.timing and not was_timing:
            reset_peaks(t.hardware.device == "cuda")  # the timed window's peaks start here
            io_start = (io_bytes(), time.perf_counter())
    if io_start is not None:
        (read0, write0), start = io_start
        read1, write1 = io_bytes()
        out.io = {
            "read_bytes": read1 - read0,
            "write_bytes": write1 - write0,
            "window_s": time.perf_counter() - start,
            "steps": w.kept + w.discarded,
        }
    return out


def slowest_rank(tm: Timings, device, gas: int) -> Timings:
    """Each timer at its slowest rank's value (max over ranks, element by element)."""
    import torch
    import torch.distributed as dist

    n = len(tm.boundary_s)
    times = [tm.boundary_s, tm.optimizer_s] + [list(c) for c in zip(*tm.micro_s, strict=True)]
    both = torch.tensor(times, dtype=torch.float64).to(device)
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    times = both.cpu().tolist()
    micro = [[times[2 + j][i] for j in range(gas - 1)] for i in range(n)]
    return Timings(micro, times[0], times[1], tm.losses, tm.first_loss, tm.io)


def probe_speed(device, sync) -> float | None:
    """The machine's speed now, after the timed window (it changes nothing measured): every rank
    at once, the slowest one's, as a calibration keeps it. A trial near its memory limit may have
    no room for the probe's matrices: no figure then."""
    import torch
    import torch.distributed as dist

    from suite.microbench import speed_probe  # deferred with torch, as in every function here

    dist.barrier()
    try:
        speed = speed_probe(device, sync)
    except RuntimeError:  # out of memory (torch.OutOfMemoryError is one)
        speed = -1.0
    probe = torch.tensor([speed], dtype=torch.float64, device=device)
    dist.all_reduce(probe, op=dist.ReduceOp.MIN)
    return probe.item() if probe.item() > 0 else None


def run(t: Trial, rank: int, world: int, local_rank: int) -> dict | None:
    """Build, warm up and time the trial on this rank; rank 0 returns the metrics, the others None."""
    import torch
    import torch.distributed as dist

    # Deferred with torch, as in every function here: the module itself imports light (tests read `classify`).
    from suite import engines
    from suite.models.build import batch
    from suite.models.flops import count_flops
    from suite.models.kernels import kernel_path

    cuda = t.hardware.device == "cuda"
    device, sync, cap = device_of(t, local_rank)
    me, gas = t.methods, t.gas_measured
    eng = engines.make(t, device, gas)
    flops, n_params = count_flops(t.model, me.attention, "none")
    hw_flops = flops if me.recompute == "none" else count_flops(t.model, me.attention, me.recompute)[0]

    host_base_gib = host_hwm_gib()  # the imported runtime
    if not cuda:
        enforce_memory_budget(t.hardware.mem_gib or machine_share_gib())
    reset_peaks(cuda)
    eng.build()
    build = peaks(cuda)
    # Before any update, and outside both memory windows (the timed one starts after the warm-up).
    param_stats = eng.param_stats() if t.measure.param_stats else None

    gen = torch.Generator().manual_seed(t.measure.seed * 1000 + rank)
    pool = [batch(t.model, me.micro_batch, gen, device) for _ in range(2 * gas)]
    w = Window(t.measure.warmup_steps, t.measure.timed_steps)
    tm = timed_window(t, eng, pool, device, sync, rank, w)
    timed = peaks(cuda)
    probe = probe_speed(device, sync)
    tm = slowest_rank(tm, device, gas)

    mem = {**timed, **{f"build_{key}": v for key, v in build.items()}, "host_base_gib": host_base_gib}
    if cuda:
        mem["device_name"] = torch.cuda.get_device_name()
    per_rank = [None] * world
    dist.all_gather_object(per_rank, mem)
    io_per_rank = [None] * world
    if on_nvme(t):
        dist.all_gather_object(io_per_rank, tm.io)
    if rank != 0:
        return None
    out = metrics.step_metrics(t, tm.micro_s, tm.boundary_s, tm.optimizer_s, flops, hw_flops)
    out.update(metrics.memory(per_rank, cuda))
    if on_nvme(t):
        out.update(metrics.nvme(io_per_rank))
    out.update(
        eng.record(),
        memory_cap=cap,
        n_params=n_params,
        memory_per_rank=per_rank,
        first_loss=tm.first_loss,
        loss_per_step=tm.losses,
        kernel_path=kernel_path(eng.model),
        warmup_steps_run=w.warmup_run,
        skipped_steps_warmup=w.skipped_warmup,
        skipped_steps_discarded=w.discarded,
        recompiles_timed=w.recompiles,
        probe_flops=probe,
    )
    if param_stats is not None:
        out["param_stats"] = param_stats
    return out


def compiled_graphs() -> int:
    """Graphs torch.compile has made in this process so far (a recompile makes one more)."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def overflow_injected(t: Trial, rank: int, w: Window) -> bool:
    """debug.fault=overflow, a stand-in for the engine's fp16 overflow flag (fp16 does not train
    on CPU): fault_rank reports an overflow on the run's first two steps and on the first step
    of the timed window."""
    if t.debug.fault != "overflow" or rank != t.debug.fault_rank:
        return False
    return (not w.timing and w.warmup_run < 2) or w.first_timed


def inject(fault: str) -> None:
    if fault == "oom":
        # One allocation beyond this rank's memory, through the real allocator: the GPU's
        # whole memory on CUDA, the RLIMIT_DATA budget (hardware.mem_gib) on CPU.
        import torch

        if torch.cuda.is_initialized():
            torch.empty(torch.cuda.mem_get_info()[1] + 2**30, dtype=torch.uint8, device="cuda")
        else:
            torch.empty(resource.getrlimit(resource.RLIMIT_DATA)[0], dtype=torch.uint8)
    if fault == "hang":
        while True:
            time.sleep(3600)
    if fault == "kill":
        os.kill(os.getpid(), signal.SIGKILL)


def classify(e: BaseException) -> str:
    import torch

    text = str(e).lower()
    # torch.OutOfMemoryError is a newer name of torch.cuda.OutOfMemoryError (the same class); older torch lacks it.
    oom = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    if isinstance(e, (MemoryError, oom)) or any(m in text for m in OOM_MARKERS):
        return "oom"
    if isinstance(e, NonFiniteLoss):
        return "nan"
    return "crashed"


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this rank when its launcher dies, even by SIGKILL."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != int(os.environ.get("SUITE_PARENT_PID", os.getppid())):
        os._exit(1)  # the launcher died before the request took effect


def main() -> None:
    die_with_parent()
    spec_path, out_dir = sys.argv[1], sys.argv[2]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    with open(spec_path) as f:
        t = Trial.from_json(json.load(f))
    try:
        result = run(t, rank, world, int(os.environ.get("LOCAL_RANK", rank)))
    except BaseException as e:  # noqa: BLE001 - every failure becomes a recorded outcome
        outcome = classify(e)
        msg = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:500]
        if outcome == "oom" and memory_cap_gib(t.hardware) is not None:
            msg += f" [under a cap of {memory_cap_gib(t.hardware):g} GiB on {t.hardware.gpu}: hardware.mem_gib]"
        write_json(
            os.path.join(out_dir, f"error-rank{rank}.json"),
            {"outcome": outcome, "message": msg, "traceback": traceback.format_exc()[-4000:]},
        )
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(3)  # peers may be blocked in a collective: do not wait for them
    if result is not None:
        write_json(os.path.join(out_dir, "result.json"), result)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown of process groups and threads


if __name__ == "__main__":
    main()
