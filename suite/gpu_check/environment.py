"""What the GPU check needs of the machine before its first trial, and DeepSpeed's ops built once.

Checked first (`check`): the Python packages the trials import at the versions pyproject.toml
asks (missing ones end the check, named); FSDP2's API in this torch; ninja and a C++ compiler,
which every DeepSpeed op's JIT build needs (ninja is put on PATH when it sits beside this Python,
in a virtual environment that is not activated); and nvcc, which FusedAdam's needs, of the CUDA
major version torch was built for (DeepSpeed refuses another: op_builder/builder.py,
`assert_no_cuda_mismatch`). An op that cannot be built, or does not build within its timeout
(`OpBuild`), is not a table of crashes: the trials that would load it run with torch's fused
AdamW (`methods.optimizer=torch_fused`), and say so.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from suite import paths
from suite.gpu_check.plan import OPS

NEEDED = ("torch", "transformers", "deepspeed", "hydra-core", "omegaconf", "hydra-submitit-launcher")
"""The suite's dependencies its trials import (W&B, pandas and rich serve sweeps and reports only)."""
BUILD = """
import sys
try:
    from deepspeed.accelerator import get_accelerator
except Exception as e:
    print(f"DeepSpeed does not import: {type(e).__name__}: {e}", flush=True)
    sys.exit(3)
from suite.ops import load_built, readable_arch_list
readable_arch_list()  # a CUDA image's "9.0a" stops DeepSpeed's builder before it starts
if load_built(sys.argv[1]) is not None:  # built before (a warm machine): loaded as the trials load it
    print(f"{sys.argv[1]}: built before; its library loads", flush=True)
    sys.exit(0)
get_accelerator().create_op_builder(sys.argv[1]).load()
"""
NO_DEEPSPEED = 3  # BUILD's exit code when DeepSpeed itself does not import


@dataclass(frozen=True)
class Finding:
    """One thing checked: its verdict ('pass', 'FAIL: why' or 'skipped: why') and what was found."""

    what: str
    verdict: str
    message: str
    fatal: bool = False
    """The check cannot run at all (exit 2)."""


@dataclass
class Environment:
    findings: list[Finding]
    unbuildable: dict[str, str] = field(default_factory=dict)
    """DeepSpeed op (an OPS key) -> why it cannot be built here."""
    fsdp2: str | None = None
    """Why FSDP2 cannot run with this torch, or None."""

    @property
    def fatal(self) -> list[Finding]:
        return [f for f in self.findings if f.fatal]


def check(env: dict[str, str] | os._Environ = os.environ) -> Environment:
    """Every finding at once; `env` (PATH) gains ninja's folder where it was found off PATH."""
    ninja, cxx, nvcc = ninja_finding(env), compiler_finding(env), nvcc_finding()
    fsdp2 = fsdp2_finding()
    found = Environment([*package_findings(), fsdp2, oom_error_finding(), ninja, cxx, nvcc])
    for tool in (ninja, cxx):
        if tool.verdict != "pass":
            found.unbuildable.update({op: tool.verdict.removeprefix("FAIL: ") for op in OPS})
    if nvcc.verdict != "pass":
        found.unbuildable.setdefault("FusedAdamBuilder", nvcc.verdict.removeprefix("FAIL: "))
    if fsdp2.verdict != "pass":
        found.fsdp2 = fsdp2.verdict.removeprefix("skipped: ")
    return found


def requirements() -> list[str]:
    """The suite's dependencies as pyproject.toml lists them (a checkout), else as installed."""

    if paths.CHECKOUT is not None and sys.version_info >= (3, 11):
        import tomllib

        return tomllib.loads((paths.CHECKOUT / "pyproject.toml").read_text())["project"]["dependencies"]
    return importlib.metadata.requires("suite") or []


def package_findings() -> list[Finding]:
    """One finding per needed package: installed, at a version its requirement allows."""
    from packaging.requirements import Requirement

    asked = {Requirement(r).name.lower(): Requirement(r) for r in requirements()}
    out = []
    for name in NEEDED:
        req = asked.get(name)
        try:
            have = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            why = f"{name} is not installed (the suite needs {req or name}): bring its wheel in .whl/"
            out.append(Finding(name, f"FAIL: {why}", why, fatal=True))
            continue
        if req is not None and not req.specifier.contains(have, prereleases=True):
            why = f"{name} {have} is installed; the suite needs {req}"
            out.append(Finding(name, f"FAIL: {why}", why, fatal=True))
        else:
            out.append(Finding(name, "pass", f"{name} {have}" + (f" ({req})" if req else "")))
    return out


def fsdp2_finding() -> Finding:
    try:
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard  # noqa: F401
    except ImportError as e:
        import torch

        why = f"torch {torch.__version__} has no public FSDP2 API ({e}): the FSDP2 checks are skipped"
        return Finding("FSDP2", f"skipped: {why}", why)
    return Finding("FSDP2", "pass", "torch.distributed.fsdp.fully_shard, CPUOffloadPolicy")


def oom_error_finding() -> Finding:
    import torch

    if hasattr(torch, "OutOfMemoryError"):
        return Finding("torch.OutOfMemoryError", "pass", "present")
    return Finding("torch.OutOfMemoryError", "pass", "absent: the worker classifies torch.cuda.OutOfMemoryError")


def ninja_finding(env) -> Finding:
    """ninja, which torch's JIT build runs from PATH (torch.utils.cpp_extension, `_run_ninja_build`)."""
    if shutil.which("ninja", path=env.get("PATH")):
        return Finding("ninja", "pass", shutil.which("ninja", path=env.get("PATH")))
    beside = [Path(sys.executable).parent / "ninja"]
    try:
        import ninja

        beside.append(Path(ninja.BIN_DIR) / "ninja")  # the ninja package's own binary
    except (ImportError, AttributeError):
        pass
    for path in beside:
        if path.is_file() and os.access(path, os.X_OK):
            env["PATH"] = f"{path.parent}{os.pathsep}{env.get('PATH', '')}"
            return Finding("ninja", "pass", f"{path}, not on PATH (a virtual environment not activated): put on PATH")
    why = "ninja is not on PATH nor beside this Python: DeepSpeed's ops cannot be built (pip install ninja)"
    return Finding("ninja", f"FAIL: {why}", why)


def compiler_finding(env) -> Finding:
    cxx = env.get("CXX", "c++")  # torch's JIT build compiles with $CXX, else c++
    path = shutil.which(cxx, path=env.get("PATH"))
    if path:
        return Finding("C++ compiler", "pass", path)
    why = f"no C++ compiler ({cxx}) on PATH: DeepSpeed's ops cannot be built"
    return Finding("C++ compiler", f"FAIL: {why}", why)


def nvcc_finding(run: Callable[[list[str]], str | None] | None = None) -> Finding:
    """The nvcc torch's JIT build uses (CUDA_HOME/bin/nvcc), of torch's CUDA major version."""
    import torch
    from torch.utils import cpp_extension

    run = run or _output
    home = cpp_extension.CUDA_HOME
    nvcc = Path(home) / "bin" / "nvcc" if home else None
    if nvcc is None or not nvcc.is_file():
        where = f"{nvcc}" if nvcc else "PATH, CUDA_HOME or /usr/local/cuda"
        why = (
            f"nvcc not found ({where}): DeepSpeed's FusedAdam cannot be built; its trials run with torch's "
            "fused AdamW. Install the CUDA toolkit of torch's CUDA version or set CUDA_HOME"
        )
        return Finding("nvcc", f"FAIL: {why}", why)
    found = re.search(r"release (\d+)\.(\d+)", run([str(nvcc), "--version"]) or "")
    if found is None:
        why = f"{nvcc} --version says no release: DeepSpeed's FusedAdam cannot be built"
        return Finding("nvcc", f"FAIL: {why}", why)
    cuda = f"{found[1]}.{found[2]}"
    if torch.version.cuda is None or torch.version.cuda.split(".")[0] != found[1]:
        why = (
            f"{nvcc} is CUDA {cuda} but torch {torch.__version__} was built for CUDA {torch.version.cuda}: DeepSpeed "
            "builds no op across CUDA major versions, so FusedAdam's trials run with torch's fused AdamW"
        )
        return Finding("nvcc", f"FAIL: {why}", why)
    return Finding("nvcc", "pass", f"{nvcc}: CUDA {cuda}, torch's {torch.version.cuda}")


def _output(cmd: list[str]) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None


class OpBuild:
    """DeepSpeed's ops compiled once before any trial loads them (a fresh machine has none cached),
    side by side, each in a process of its own under one deadline. Trials then load them from the
    cache (`suite.engines.preload_built_ops`)."""

    def __init__(self, ops: list[str], cannot: dict[str, str], log_dir: Path, timeout_s: float, clock=time.monotonic):
        self.why = {op: cannot[op] for op in ops if op in cannot}
        """op -> why it is not built (filled in by `wait`)."""
        self.no_deepspeed: str | None = None
        self.clock, self.started, self.started_at = clock, clock(), time.time()
        self.deadline, self.wall_s = self.started + timeout_s, 0.0
        self.timeout_s = timeout_s
        self.logs = {op: log_dir / f"ops-{OPS[op]}.log" for op in ops}
        self.procs: dict[str, subprocess.Popen] = {}
        for op in ops:
            if op not in self.why:
                with open(self.logs[op], "w") as log:
                    cmd = [sys.executable, "-c", BUILD, op]
                    self.procs[op] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def running(self) -> bool:
        return self.clock() < self.deadline and any(p.poll() is None for p in self.procs.values())

    def wait(self) -> dict[str, str]:
        """Wait for the builds (until the deadline); op -> why it is not built, for each that is not."""
        for op, p in self.procs.items():
            try:
                rc = p.wait(timeout=max(0.0, self.deadline - self.clock()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)  # nvcc and ninja with it
                p.wait()
                _drop_lock(OPS[op], self.started_at)
                self.why[op] = f"not built within {self.timeout_s:.0f} s (see {self.logs[op].name})"
                continue
            if rc == NO_DEEPSPEED:
                self.no_deepspeed = _last_line(self.logs[op])
            if rc != 0:
                self.why[op] = f"did not build: {_last_line(self.logs[op])} (see {self.logs[op].name})"
        self.procs = {}
        self.wall_s = self.clock() - self.started
        return self.why


def _drop_lock(name: str, since: float) -> None:
    """A build killed while it held torch's lock file leaves it behind, and every later build of the
    op would wait on it forever (torch.utils.cpp_extension, `_jit_compile`). A lock made since our
    build started is our build's to remove; an older one, another process's (a shared cache), is not."""
    from torch.utils.cpp_extension import _get_build_directory

    lock = Path(_get_build_directory(name, verbose=False)) / "lock"
    if lock.exists() and lock.stat().st_mtime >= since - 2.0:  # file times lag time.time() by a tick
        lock.unlink(missing_ok=True)


def _last_line(path: Path) -> str:
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"
