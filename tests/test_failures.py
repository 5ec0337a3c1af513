"""How a failure becomes its outcome, without a GPU: the OOM markers on the real message texts,
a rank the kernel's OOM killer ended (a fake cgroup events file), reports across nodes (processes
that sleep stand in for ranks blocked in a collective), and each rank's environment."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
import torch
from conftest import TINY, make_trial

from suite import files, launch
from suite.record import Run
from suite.worker import NonFiniteLoss, classify

# Real texts (sources in suite/worker.py's OOM_MARKERS), each as its library raises it.
NCCL = "NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, "
OOM_TEXTS = [
    "CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some other API call",
    "CUDA driver error: out of memory",
    "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
    "cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
    "cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED",
    NCCL + "unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.27.3\n"
    "ncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\nCuda failure 'out of memory'",
    NCCL + "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.27.3\n"
    "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error. "
    "\nLast error:\nFailed to malloc 1048576 bytes",
    "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to "
    "allocate 2147483648 bytes. Error code 12 (Cannot allocate memory)",
    "[Errno 12] Cannot allocate memory",
    "std::bad_alloc",
]
NOT_OOM_TEXTS = [
    "CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`",
    NCCL + "remote process exited or there was a network error, NCCL version 2.27.3\nncclRemoteError: A call "
    "failed possibly due to a network error or a remote process exiting prematurely.\nLast error:\n"
    "socket recv: Connection reset by peer",
    "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:29500",
    "out of resource: shared memory, Required: 262144, Hardware limit: 232448.",
]


@pytest.mark.parametrize("text", OOM_TEXTS, ids=[t[:50] for t in OOM_TEXTS])
def test_allocation_failures_of_every_library_are_oom(text):
    assert classify(RuntimeError(text)) == "oom"


@pytest.mark.parametrize("text", NOT_OOM_TEXTS, ids=[t[:50] for t in NOT_OOM_TEXTS])
def test_other_failures_are_not_oom(text):
    assert classify(RuntimeError(text)) == "crashed"


def test_exception_types_decide_before_the_text():
    assert classify(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")) == "oom"
    assert classify(MemoryError()) == "oom"
    assert classify(NonFiniteLoss("loss is nan at step 3 on rank 0")) == "nan"


V2_EVENTS = "low 0\nhigh 0\nmax 12\noom 2\noom_kill {n}\noom_group_kill 0\n"  # cgroup v2 memory.events
V1_OOM_CONTROL = "oom_kill_disable 0\nunder_oom 0\noom_kill {n}\n"  # cgroup v1 memory.oom_control


@pytest.mark.parametrize("layout", [V2_EVENTS, V1_OOM_CONTROL])
def test_a_rank_killed_while_the_oom_killer_counted_a_kill_is_oom(tmp_path, layout):
    events = tmp_path / "memory.events"
    events.write_text(layout.format(n=3))
    assert launch.oom_kills(str(events)) == 3
    log = tmp_path / "rank1.log"
    log.write_text("[rank1] step 2\n")
    oom = launch.death_report(-9, 3, 4, str(log))
    assert oom["outcome"] == "oom" and "OOM killer" in oom["message"]
    plain = launch.death_report(-9, 3, 3, str(log))
    assert plain["outcome"] == "crashed" and plain["message"] == "killed by SIGKILL; last output: [rank1] step 2"
    assert launch.death_report(-9, None, None, str(log))["outcome"] == "crashed"  # no count: no claim
    assert launch.death_report(1, 3, 4, str(log))["message"].startswith("exit code 1")  # not killed at all


def test_the_launcher_reads_the_count_before_and_after_and_names_the_rank(tmp_path, monkeypatch):
    events = tmp_path / "memory.events"
    events.write_text(V2_EVENTS.format(n=0))
    monkeypatch.setattr(launch, "memory_event_files", lambda: [str(events)])
    before = launch.oom_kills()
    events.write_text(V2_EVENTS.format(n=1))  # the kernel killed a rank meanwhile
    launch._report_deaths(str(tmp_path), [None, -9], base=0, kills_before=before)
    o = launch.root_cause(launch.reports(str(tmp_path)), first=1)
    assert o.outcome == "oom" and o.message.startswith("rank 1 killed by SIGKILL from the kernel's OOM killer")


def test_the_root_cause_is_an_oom_anywhere_then_a_death_by_signal_then_the_first_failure():
    crashed = {"outcome": "crashed", "message": "DistBackendError: connection closed"}
    oom = {"outcome": "oom", "message": "OutOfMemoryError: CUDA out of memory"}
    killed = {"outcome": "crashed", "message": "killed by SIGKILL", "by": "launcher", "signal": True}
    assert launch.root_cause({0: crashed, 3: oom}, first=0).message == "rank 3: OutOfMemoryError: CUDA out of memory"
    assert launch.root_cause({0: crashed, 2: killed}, first=0).message == "rank 2 killed by SIGKILL"
    assert launch.root_cause({1: crashed, 0: dict(crashed)}, first=1).message.startswith("rank 1:")


def sleepers(n: int) -> list[subprocess.Popen]:
    """Stand-ins for ranks blocked in a collective whose peer is gone: they never end by themselves."""
    return [subprocess.Popen(["sleep", "300"], start_new_session=True) for _ in range(n)]


def wait_on_node(node: int, out: str, reports: dict[str, dict]) -> tuple[Run, float, list]:
    """A 2-node trial's launcher on `node`, its one rank blocked, once `reports` are in the trial
    folder `out` (name -> report): its outcome, how long it waited, and its ranks."""
    t = make_trial(TINY + ["hardware=cpu-x1", "cluster.nodes=2", "measure.timeout_s=300"])
    for name, report in reports.items():
        files.write_json(f"{out}/{name}.json", report)
    procs = sleepers(1)
    start = time.monotonic()
    o = launch._wait(t, procs, out, start, launch.Node(rank=node))
    return o, time.monotonic() - start, procs


def test_node_0_stops_its_blocked_ranks_when_a_rank_of_node_1_reports_oom(tmp_path):
    out = str(tmp_path)
    o, waited, procs = wait_on_node(0, out, {
        "error-rank1": {"outcome": "oom", "message": "RuntimeError: can't allocate memory"},
        "node1": {"outcome": "oom", "message": "rank 1: RuntimeError: ..."},
    })  # fmt: skip
    assert waited < 60  # not the 300 s timeout
    assert (o.outcome, o.message) == ("oom", "rank 1: RuntimeError: can't allocate memory")
    assert all(p.poll() is not None for p in procs)
    assert json.load(open(f"{out}/node0.json"))["outcome"] == "oom"  # node 1 learns what was recorded
    assert not os.path.exists(f"{out}/error-rank0.json")  # killed by its launcher: no report of its own


def test_node_1_stops_when_node_0_has_recorded_the_trial(tmp_path):
    o, waited, procs = wait_on_node(1, str(tmp_path), {
        "error-rank0": {"outcome": "nan", "message": "NonFiniteLoss: loss is nan"},
        "node0": {"outcome": "nan", "message": "rank 0: NonFiniteLoss: loss is nan"},
    })  # fmt: skip
    assert waited < 60 and all(p.poll() is not None for p in procs)
    assert o.outcome == "nan" and "node 0 recorded nan: rank 0: NonFiniteLoss" in o.message


def test_node_1_raises_when_node_0_gives_no_account_of_the_trial(tmp_path, monkeypatch):
    # Node 0 is gone: nothing records the trial, so node 1's job must fail, not pass as a follower.
    monkeypatch.setattr(launch, "NODES_GRACE_S", 0.2)
    with pytest.raises(launch.NoAccount, match="^oom: rank 0: .*; node 0 gave no account of the trial$"):
        wait_on_node(1, str(tmp_path), {"error-rank0": {"outcome": "oom", "message": "MemoryError"}})


def test_each_rank_gets_its_share_of_the_cores_no_hub_and_its_accelerator(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cores = len(os.sched_getaffinity(0))
    gpu = make_trial(["model=pythia-160m", "hardware=a100-80gb-x2"])
    env = launch.worker_env(gpu, 1, 12345)
    assert env["OMP_NUM_THREADS"] == str(max(1, cores // 2))  # CPU Adam under offload: not every core per rank
    assert (env["HF_HUB_OFFLINE"], env["DS_ACCELERATOR"], env["RANK"]) == ("1", "cuda", "1")
    cpu = make_trial(TINY)
    assert launch.worker_env(cpu, 0, 12345)["DS_ACCELERATOR"] == "cpu"
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert launch.worker_env(gpu, 0, 12345)["OMP_NUM_THREADS"] == "3"  # the user's setting stands
