"""One rank of a trial: build the model under DeepSpeed, warm up, time a fixed window.

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

from suite.config import Trial

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


def run(t: Trial, rank: int, world: int, local_rank: int) -> dict | None:
    import deepspeed
    import torch
    import torch.distributed as dist

    from suite import methods, metrics, models

    cuda = t.hardware.device == "cuda"
    if cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        torch.backends.cuda.matmul.allow_tf32 = t.hardware.tf32
        torch.backends.cudnn.allow_tf32 = t.hardware.tf32
        sync = torch.cuda.synchronize
    else:
        device = torch.device("cpu")

        def sync() -> None:  # CPU kernels run synchronously
            pass

    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo", verbose=False)
    me = t.methods
    flops, n_params = models.count_flops(t.model, me.attention, "none")
    hw_flops = flops if me.recompute == "none" else models.count_flops(t.model, me.attention, me.recompute)[0]

    rss_base_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    if not cuda:
        enforce_memory_budget(t.hardware.mem_gib or machine_share_gib())

    gas = t.gas_measured
    ds_config = methods.deepspeed_config(t, gas)
    torch.manual_seed(t.measure.seed)
    if cuda and me.zero_stage == 3:
        with deepspeed.zero.Init(config_dict_or_path=ds_config):  # never hold the full model
            model = models.build(t.model, me.attention, me.recompute)
    else:
        with device:
            model = models.build(t.model, me.attention, me.recompute)
    opt = methods.client_optimizer(t, model.parameters())
    engine, *_ = deepspeed.initialize(
        model=model,
        optimizer=opt,
        model_parameters=model.parameters() if opt is None else None,
        config=ds_config,
    )
    if me.compile:
        engine.compile()

    gen = torch.Generator().manual_seed(t.measure.seed * 1000 + rank)
    pool = [models.batch(t.model, me.micro_batch, gen, device) for _ in range(2 * gas)]

    micro_s, boundary_s, optimizer_s, losses = [], [], [], []
    k = 0
    for step in range(t.measure.warmup_steps + t.measure.timed_steps):
        timed = step >= t.measure.warmup_steps
        if step == t.measure.warmup_steps and rank == t.debug.fault_rank:
            inject(t.debug.fault)
        micro, step_losses = [], []
        for i in range(gas):
            inputs = pool[k % len(pool)]
            k += 1
            sync()
            t0 = time.perf_counter()
            loss = engine(**inputs).loss
            if timed and t.debug.fault == "nan" and rank == t.debug.fault_rank:
                loss = loss * math.nan
            engine.backward(loss)
            if i < gas - 1:
                engine.step()  # not a boundary: no reduction, no update
                sync()
                micro.append(time.perf_counter() - t0)
            else:
                sync()
                t1 = time.perf_counter()
                engine.step()  # the optimizer update
                sync()
                t2 = time.perf_counter()
            step_losses.append(loss.detach())
        # .item() is a device sync point, so it stays outside the timers.
        step_loss = torch.stack(step_losses).float().mean().item()
        if not math.isfinite(step_loss):
            raise NonFiniteLoss(f"loss is {step_loss} at step {step} on rank {rank}")
        if timed:
            micro_s.append(micro)
            boundary_s.append(t1 - t0)
            optimizer_s.append(t2 - t1)
            losses.append(step_loss)

    # The slowest rank sets each timer: max over ranks, element by element.
    n = t.measure.timed_steps
    times = torch.tensor([boundary_s, optimizer_s] + [list(c) for c in zip(*micro_s, strict=True)], dtype=torch.float64)
    times = times.to(device)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    times = times.cpu().tolist()
    boundary_s, optimizer_s = times[0], times[1]
    micro_s = [[times[2 + j][i] for j in range(gas - 1)] for i in range(n)]

    if cuda:
        mem = {
            "allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
            "reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
            "device_name": torch.cuda.get_device_name(),
        }
    else:
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        mem = {"rss_gib": rss, "rss_base_gib": rss_base_gib, "trial_gib": rss - rss_base_gib}
    per_rank = [None] * world
    dist.all_gather_object(per_rank, mem)
    if rank != 0:
        return None
    peak_key = "allocated_gib" if cuda else "trial_gib"
    out = metrics.summarize(t, micro_s, boundary_s, optimizer_s, flops, hw_flops)
    out.update(
        n_params=n_params,
        peak_mem_gib=max(m[peak_key] for m in per_rank),
        peak_reserved_gib=max(m["reserved_gib"] for m in per_rank) if cuda else None,
        memory_per_rank=per_rank,
        loss_per_step=losses,
        optimizer=type(engine.optimizer).__name__,
        kernel_path=models.kernel_path(model),
    )
    return out


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
    if isinstance(e, (MemoryError, torch.OutOfMemoryError)) or any(m in text for m in OOM_MARKERS):
        return "oom"
    if isinstance(e, NonFiniteLoss):
        return "nan"
    return "crashed"


def write_json(path: str, obj: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


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
        t = Trial.from_dict(json.load(f))
    try:
        result = run(t, rank, world, int(os.environ.get("LOCAL_RANK", rank)))
    except BaseException as e:  # noqa: BLE001 - every failure becomes a recorded outcome
        outcome = classify(e)
        msg = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:500]
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
