"""Shared test helpers: compose a trial from the real conf/ with Hydra's compose API; the session's
store of real trials and its one quick calibration; the files the project ships; the `gpu` marker."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from suite.config import Trial
from suite.config.compose import config, trial

# Two test processes share the cores (scripts/test.sh): one OpenMP thread per process, as each of a
# cpu-x2 trial's two ranks gets on 2 cores anyway (suite.launch.worker_env). A one-rank trial would
# otherwise start a thread per core beside the other test process's work, and OpenMP threads that
# wait for a descheduled sibling spin.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# How a CPU test trial is run: two CPU workers, few steps.
CPU_RUN = [
    "hardware=cpu-x2",
    "methods.micro_batch=2",
    "measure.warmup_steps=1",
    "measure.timed_steps=3",
    "measure.max_micro_steps=2",
    "measure.timeout_s=180",
]
# Pythia-14M's recipe shrunk to CPU size, on two CPU workers.
CPU_RECIPE = [
    "model=pythia-14m",
    "model.recipe.seq_len=64",
    "model.recipe.global_batch=8",
    "model.recipe.precision=fp32",
    *CPU_RUN,
]
# A smaller Pythia (GPT-NeoX) for real multi-process trials: seconds each on 2 CPU cores.
TINY = CPU_RECIPE + [
    "model.config.hidden_size=64",
    "model.config.num_hidden_layers=2",
    "model.config.num_attention_heads=4",
    "model.config.intermediate_size=256",
    "model.config.vocab_size=1024",
]
# The same trial on one worker: for what does not depend on how many ranks there are (the store, the
# CLI, W&B, a recorded outcome, a resumed sweep); each rank costs seconds of imports.
ONE = TINY + ["hardware=cpu-x1"]
# The CPU-sized member of each task and architecture, at test size (batch 8; 64 tokens or 32x32 images).
TINY_MEMBERS = {
    "causal-lm": TINY,
    "masked-lm": ["model=roberta-cpu", "model.recipe.seq_len=64", "model.recipe.global_batch=8", *CPU_RUN],
    "image-classification": ["model=vit-cpu", "model.recipe.global_batch=8", *CPU_RUN],
    "convnext": ["model=convnext-cpu", "model.recipe.global_batch=8", *CPU_RUN],
    "mamba": ["model=mamba-cpu", "model.recipe.seq_len=64", "model.recipe.global_batch=8", *CPU_RUN],
}


# The real trials whose facts several tests read (the fixture that reads each: its trials), measured
# once per session into `trial_store`, in the background from the session's start (`prefetch`).
STAGES = [
    (0, "none"),
    (1, "none"),
    (2, "none"),
    (3, "none"),
    (1, "optimizer"),
    (2, "optimizer"),
    (3, "optimizer"),
    (3, "optimizer+params"),
]
# FSDP2 in both modes, with and without recomputation; the second also reports fp16 overflows
# through the stand-in for the engine's flag (debug.fault=overflow, fp16 cannot train on CPU).
FSDP2 = {
    "full_shard": ["methods.reshard_after_forward=true"],
    "shard_grad_op+recompute+overflow": [
        "methods.reshard_after_forward=false",
        "methods.recompute=full",
        "debug.fault=overflow",
        "debug.fault_rank=1",
    ],
}
MEMBERS = ["masked-lm", "convnext", "mamba"]  # each under ZeRO-3; causal-lm's is among STAGES
FACTS = {
    "zero_results": [TINY + [f"methods.zero_stage={stage}", f"methods.offload={off}"] for stage, off in STAGES],
    "fsdp2_results": [TINY + ["methods.engine=fsdp2", *extra] for extra in FSDP2.values()],
    "zero3": [TINY_MEMBERS[member] + ["methods.zero_stage=3"] for member in MEMBERS],
}


def ops_setup_builds() -> tuple[str, ...]:
    """The DeepSpeed JIT ops scripts/setup.sh builds on this machine: all but async_io where libaio
    is absent (`suite.ops.aio_problem`)."""
    from suite import ops

    return tuple(b for b in ops.JIT_OPS if b != "AsyncIOBuilder" or ops.aio_problem() is None)


def single_rank_env(**extra: str) -> dict[str, str]:
    """The environment of a one-process DeepSpeed job on the CPU, on a free port."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rank = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    return os.environ | {"DS_ACCELERATOR": "cpu", **rank, **extra}


# Modules every test of which stays in one test process (one Slurm, one set of ports).
WHOLE = {"test_slurm.py", "test_multinode.py"}
GROUPS = "SUITE_TEST_GROUPS"
"""The file where test processes leave each test's unit of scheduling for pytest-xdist's controller."""


def pytest_configure(config):
    """Under `pytest -n N --dist loadgroup` (scripts/test.sh), the controller names the file the
    test processes (they inherit its environment) write each test's unit into."""
    if config.getoption("dist", "no") == "loadgroup" and not os.environ.get("PYTEST_XDIST_WORKER"):
        import tempfile

        fd, path = tempfile.mkstemp(prefix="suite-test-groups-", suffix=".json")
        os.close(fd)
        os.environ[GROUPS] = path


def pytest_unconfigure(config):
    if not os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get(GROUPS):
        Path(os.environ.pop(GROUPS)).unlink(missing_ok=True)


def unit(item) -> str:
    """The test's unit of scheduling: its module where the test reads a module-scoped fixture
    (made once, not once per test process) or its module must stay whole; else the test alone,
    so that two test processes share the work evenly."""
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info else []
    if item.path.name in WHOLE or any(d[-1].scope == "module" for d in defs if d):
        return str(item.path)
    return item.nodeid


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` skip where torch sees no CUDA GPU (`pytest -m gpu` runs them on one);
    each test's unit of scheduling goes to the controller (`unit`, `pytest_xdist_make_scheduler`)."""
    if os.environ.get(GROUPS) and os.environ.get("PYTEST_XDIST_WORKER"):
        from suite.files import write_json

        write_json(Path(os.environ[GROUPS]), {item.nodeid: unit(item) for item in items})
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if gpu:
        import torch

        if not torch.cuda.is_available():
            for item in gpu:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU; this machine has none"))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's load scheduling by units (`unit`): what `--dist loadgroup` does with
    xdist_group marks, which pytest 9 leaves unread (xdist 3.8 renames a test by its `_nodeid`)."""
    if config.getoption("dist", "no") != "loadgroup":
        return None
    import json

    from xdist.scheduler import LoadScopeScheduling

    class ByUnit(LoadScopeScheduling):
        units: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.units is None:
                self.units = json.loads(Path(os.environ[GROUPS]).read_text())
            return self.units.get(nodeid, nodeid)

    return ByUnit(config, log)


def shared_dir(tmp_path_factory, name: str) -> Path:
    """A folder of the whole test run: under pytest-xdist, one that every test process shares
    (their base folders are siblings), so a trial or the calibration is made once per run."""
    base = tmp_path_factory.getbasetemp()
    d = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name
    d.mkdir(exist_ok=True)
    return d


def worker_share() -> tuple[int, int]:
    """This test process's index and the number of test processes (pytest-xdist; else 0 of 1)."""
    me = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(me.removeprefix("gw")), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))


@pytest.fixture(autouse=True, scope="session")
def cache_dir(tmp_path_factory):
    """Derived facts (traces, architecture facts, FLOP counts) are cached in one folder of the
    run, which every test, test process and subprocess shares: a run starts from none, as on a
    fresh machine, whatever ~/.cache/suite holds."""
    os.environ["SUITE_CACHE_DIR"] = str(shared_dir(tmp_path_factory, "cache"))
    return os.environ["SUITE_CACHE_DIR"]


@pytest.fixture(autouse=True, scope="session")
def calibration_dir(tmp_path_factory):
    """Calibrations a test makes (a CPU search measures this machine's constants first) go to
    one folder of the run, never the repository's results/; subprocesses inherit it."""
    os.environ["SUITE_CALIBRATION_DIR"] = str(shared_dir(tmp_path_factory, "calibration"))
    return os.environ["SUITE_CALIBRATION_DIR"]


def _calibrate(env: dict[str, str]) -> subprocess.CompletedProcess:
    """`suite-predict calibrate hardware=cpu --quick` into the run's calibration folder, once per
    run: the test process that comes first makes it (holding a lock) and keeps what the command
    said; the others wait for it and read that. `env`: the session's environment, taken when the
    calibration was asked for (in the background, a test may have changed os.environ since: its
    own SUITE_CALIBRATION_DIR, say)."""
    import fcntl
    import json
    import sys

    d = Path(env["SUITE_CALIBRATION_DIR"])
    made = d / "made-by-the-tests.json"
    with open(d / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if made.exists():
            said = json.loads(made.read_text())
            return subprocess.CompletedProcess(said["args"], said["returncode"], said["stdout"], said["stderr"])
        cmd = [sys.executable, "-m", "cli.predict", "calibrate", "hardware=cpu", "--quick"]
        out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
        said = {"args": cmd, "returncode": out.returncode, "stdout": out.stdout, "stderr": out.stderr}
        made.write_text(json.dumps(said))
        return out


_prefetched: dict = {}


@pytest.fixture(scope="session", autouse=True)
def prefetch(request, calibration_dir, trial_store):
    """Start, in one background thread, the calibration and the FACTS trials that the selected
    tests will read, so that they run while the tests before their readers run (a trial's ranks
    leave part of two cores idle). A reader that comes first waits on the trial's claim in the
    store and is then served from it; nothing is started for a tier that reads none of them.
    Under pytest-xdist the store and the calibration are the run's: the first test process
    starts the calibration and each starts its share of the trials."""
    from concurrent.futures import ThreadPoolExecutor

    wanted = {name for item in request.session.items for name in item.fixturenames}
    me, n = worker_share()
    pool = ThreadPoolExecutor(1, thread_name_prefix="prefetch")
    if "calibrated" in wanted and me == 0:
        _prefetched["calibrated"] = pool.submit(_calibrate, os.environ | {"SUITE_CALIBRATION_DIR": calibration_dir})
    trials = [overrides for name, trials in FACTS.items() if name in wanted for overrides in trials]
    for overrides in trials[me::n]:
        pool.submit(_run, trial_store, make_trial(overrides))  # composed here: see measured_all
    yield
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="session")
def calibrated(calibration_dir):
    """One quick calibration of cpu-x2 on this machine (microbenchmarks in two processes and one
    minimal real trial), made once for the session in its calibration folder (`prefetch` starts
    it): the predictor's tests read it and a CPU search (a subprocess) finds it there instead of
    calibrating again. Made as a user makes it, `suite-predict calibrate hardware=cpu --quick`,
    which exits 0 (under pytest-xdist, what it said to the test process that made it)."""
    started = _prefetched.get("calibrated")
    out = started.result() if started else _calibrate(os.environ | {"SUITE_CALIBRATION_DIR": str(calibration_dir)})
    assert out.returncode == 0 and "wrote " in out.stdout, out.stderr[-3000:]
    return Path(calibration_dir)


@pytest.fixture(scope="session")
def trial_store(tmp_path_factory) -> Path:
    """One store of real trials for the run: a test that reads facts of a trial runs it with
    `measured`, and a trial another test has run already (the same trial id) is served from here;
    under pytest-xdist every test process's, through the store's claims."""
    return shared_dir(tmp_path_factory, "trials")


def measured(store: Path, overrides: list[str]):
    """The record of the trial `overrides` compose, run once per session into `store`."""
    return _run(store, make_trial(overrides))


def _run(store: Path, t: Trial):
    from suite.runner import run_one

    return run_one(t, str(store), "test", in_sweep=True).record


def measured_all(store: Path, trials: list[list[str]]) -> list:
    """`measured` for independent trials, two side by side: a trial's two ranks leave part of
    two cores idle (start-up, rendezvous, the launcher's waits); their figures are not timed here.
    Composed first, in this thread: transformers' lazy imports are not safe from two threads."""
    from concurrent.futures import ThreadPoolExecutor

    composed = [make_trial(overrides) for overrides in trials]
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(lambda t: _run(store, t), composed))


ROOT = Path(__file__).resolve().parent.parent


def shipped(pattern: str) -> list[Path]:
    """The files of the repository that match `pattern` (a path glob from its root), as git
    tracks them: what the project ships, not what else lies in the working tree (a user's own
    YAML in conf/model/, say)."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--", pattern], cwd=ROOT, capture_output=True, text=True, check=True, timeout=30
    )
    files = sorted(ROOT / f for f in out.stdout.split("\0") if f)
    assert files, f"git tracks no file matching {pattern}"
    return files


def compose_cfg(overrides: list[str]):
    return config(overrides)


def make_trial(overrides: list[str]) -> Trial:
    return trial(overrides)


@pytest.fixture
def tiny():
    return lambda *extra: make_trial(TINY + list(extra))
