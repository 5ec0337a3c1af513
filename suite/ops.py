"""DeepSpeed's JIT-compiled ops: which ones a trial loads, building them once (`scripts/setup.sh`:
`python -m suite.ops`), and loading the built files in every DeepSpeed rank.

A CPU trial loads two: FusedAdam (the optimizer at every ZeRO stage) and CPU Adam (under optimizer
offload); an NVMe trial (`methods.offload_device=nvme`) also DeepSpeed's async I/O, which loads its
pinned-memory op first (`AIO_OPS`). The async I/O op links libaio: it is built where libaio is
installed (Debian: `apt-get install libaio-dev`) and skipped, saying so, where it is not; an NVMe
trial is then `unsupported` (`aio_problem`).

DeepSpeed's CPU accelerator would also build its shared-memory collectives at every
`init_distributed` (`build_shm_op`, deepspeed/comm/torch.py), but only `inference_all_reduce` uses
them: training's collectives go through gloo. `skip_shm_comm` marks that op not compatible, so no
trial builds it or waits for it.

The build folder is torch's (`TORCH_EXTENSIONS_DIR`, by default ~/.cache/torch_extensions/<python
and device>/): shared by every clone of the project on the machine, so a second clone finds the ops
built. The ops compile side by side, one process each, each printing when it starts and ends.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JIT_OPS = ("CPUAdamBuilder", "FusedAdamBuilder", "AsyncIOBuilder")
OP_NAMES = ("cpu_adam", "fused_adam", "async_io")
"""The names of JIT_OPS' built libraries, in the same order."""
AIO_OPS = ("PinMemoryBuilder", "AsyncIOBuilder")
"""The NVMe tier's ops, in the order they load: the async I/O op resolves the pinned-memory op's
symbols, which DeepSpeed loads first and makes global (op_builder/cpu/async_io.py `load`,
op_builder/pin_memory_load.py)."""
LIBAIO_HINT = "apt-get install libaio-dev (Debian/Ubuntu; RHEL: libaio-devel), then bash scripts/setup.sh"
SHM_COMM = "deepspeed_shm_comm"
COMPILER_HINT = "install a C++ compiler and retry (Debian/Ubuntu: apt-get install g++; then bash scripts/setup.sh)"


def _builder(name: str):
    from deepspeed.accelerator import get_accelerator

    return get_accelerator().create_op_builder(name)


def built_path(name: str) -> Path | None:
    """Where op `name`'s built library is or will be; None where this accelerator has no such op."""
    from torch.utils.cpp_extension import _get_build_directory

    builder = _builder(name)
    if builder is None:
        return None
    return Path(_get_build_directory(builder.name, verbose=False)) / f"{builder.name}.so"


def skip_shm_comm() -> None:
    """Mark DeepSpeed's shared-memory collectives not compatible before `init_distributed` (CPU
    only): DeepSpeed then neither builds nor loads them (deepspeed/comm/torch.py, `build_shm_op`;
    deepspeed/ops/__init__.py keeps one dict, so the edit holds for the process)."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__[SHM_COMM] = False


_ARCH = re.compile(r"(\d+)\.(\d+)[a-z]?(\+PTX)?")


def deepspeed_arch_list(value: str) -> str:
    """TORCH_CUDA_ARCH_LIST as DeepSpeed's JIT builder can read it. torch takes arch-specific
    entries such as "9.0a" (Hopper's sm_90a), and CUDA images set them; DeepSpeed 0.19 sorts the
    entries by int() of each part (op_builder/builder.py, compute_capability_args) and fails on
    "0a" before it builds anything. Its ops use no arch-specific instruction: "9.0a" becomes
    "9.0" (which runs on the same GPUs), "+PTX" stays, an entry that is no capability stays as it is."""
    out: list[str] = []
    for entry in value.replace(" ", ";").split(";"):
        m = _ARCH.fullmatch(entry.strip())
        cc = f"{m.group(1)}.{m.group(2)}{m.group(3) or ''}" if m else entry.strip()
        if cc and cc not in out:
            out.append(cc)
    return ";".join(out)


def readable_arch_list(env=os.environ) -> None:
    """Make `env`'s TORCH_CUDA_ARCH_LIST one DeepSpeed can read, where one is set (see
    `deepspeed_arch_list`): before an op's build, and in every DeepSpeed rank, which builds on
    first use an op not built yet."""
    if env.get("TORCH_CUDA_ARCH_LIST", "").strip():
        env["TORCH_CUDA_ARCH_LIST"] = deepspeed_arch_list(env["TORCH_CUDA_ARCH_LIST"])


def preload_built_ops(nvme: bool = False) -> list[str]:
    """Load DeepSpeed's ops that are already built straight from their files, into DeepSpeed's
    own cache of loaded ops (`OpBuilder._loaded_ops`, op_builder/builder.py:549-551); returns
    their names.

    Through DeepSpeed's loader every process runs torch's JIT build, a no-op once built, while
    holding a lock file in the shared build folder (torch/utils/cpp_extension.py, _jit_compile).
    A worker killed in that moment (a timeout, a sweep stopped with SIGKILL) leaves the lock
    behind, and every later trial's ranks then wait on it forever. Loading the built file
    needs no lock. An op not built yet still goes through DeepSpeed's loader (and its lock)."""
    from deepspeed.ops.op_builder.builder import OpBuilder

    readable_arch_list()
    loaded = []
    names = [n for n in JIT_OPS if n not in AIO_OPS] + (list(AIO_OPS) if nvme else [])
    for name in names:
        path = built_path(name)
        if path is None or path.stem in OpBuilder._loaded_ops:
            continue
        module = load_built(name)
        if module is None:
            continue
        OpBuilder._loaded_ops[path.stem] = module
        loaded.append(path.stem)
        if name == "PinMemoryBuilder":  # as DeepSpeed's own loader (pin_memory_load.py): its symbols made global
            import ctypes

            sys._deepspeed_pin_memory_op_module = module
            ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    return loaded


def load_built(name: str):
    """Op `name`'s built library loaded from its file, without torch's JIT build or its lock; None
    where it is not built, or was built against another torch (a shared cache: it must be rebuilt).
    A clone of the project elsewhere on the machine finds it too: torch's JIT would rebuild it there,
    since its build file names this clone's include paths."""
    import importlib.util

    path = built_path(name)
    if path is None or not path.exists():
        return None
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except (ImportError, OSError):
        return None
    return module


_LOAD = "import sys; from suite.ops import _builder; _builder(sys.argv[1]).load(verbose=False)"


def build(names: tuple[str, ...] = JIT_OPS, log=print, tick_s: float = 15.0) -> dict[str, float]:
    """Build the ops not built yet, side by side, one process each; say which op starts, which
    are still building every `tick_s` seconds, and each one's time when it ends. Returns the
    seconds each op built now took. Ops that do not build raise `OpBuildError`, with their
    compiler's last lines and what to install."""
    todo = {n: p for n in names if (p := built_path(n)) is not None and not p.exists()}
    if not todo:
        return {}
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        ops = ", ".join(p.stem for p in todo.values())
        raise OpBuildError(f"DeepSpeed's ops {ops} need a C++ compiler ({compiler} is not on PATH): {COMPILER_HINT}")
    start, procs, took = time.monotonic(), {}, {}
    with tempfile.TemporaryDirectory() as logs:
        for name, path in todo.items():
            log(f"  building {path.stem} ...")
            out = open(Path(logs) / f"{path.stem}.log", "w+")  # noqa: SIM115 - closed when the build ends
            procs[name] = (subprocess.Popen([sys.executable, "-c", _LOAD, name], stdout=out, stderr=out), out)
        next_tick = start + tick_s
        while len(took) < len(procs):
            time.sleep(0.2)
            for name, (p, _) in procs.items():
                if name not in took and p.poll() is not None:
                    took[name] = time.monotonic() - start
                    ok = p.returncode == 0 and todo[name].exists()
                    log(f"  built {todo[name].stem} in {took[name]:.0f} s" if ok else f"  {todo[name].stem} FAILED")
            if time.monotonic() >= next_tick and len(took) < len(procs):
                left = ", ".join(todo[n].stem for n in procs if n not in took)
                log(f"  still building {left} ({time.monotonic() - start:.0f} s)")
                next_tick += tick_s
        failed = [_failure(todo[n], p, out) for n, (p, out) in procs.items() if not todo[n].exists()]
        for _, out in procs.values():
            out.close()
    if failed:
        raise OpBuildError("\n".join(failed) + f"\n{COMPILER_HINT}")
    return {todo[n].stem: s for n, s in took.items()}


def _failure(path: Path, p: subprocess.Popen, out) -> str:
    out.seek(0)
    tail = "\n".join("    " + line for line in out.read().splitlines()[-15:])
    return f"DeepSpeed's op {path.stem} did not build (exit {p.returncode}):\n{tail}"


@functools.cache
def aio_problem() -> str | None:
    """Why DeepSpeed's async I/O op (the NVMe tier's) cannot serve this machine, or None: it is
    built, or it can be, libaio being here (DeepSpeed's own test: a program calling io_submit
    compiled and linked with -laio, op_builder/cpu/async_io.py `is_compatible`)."""
    path = built_path("AsyncIOBuilder")
    if path is not None and path.exists():
        return None
    if path is None or not _builder("AsyncIOBuilder").is_compatible(verbose=False):
        return f"the NVMe tier needs DeepSpeed's async I/O op, which needs libaio, absent here: {LIBAIO_HINT}"
    return None


class OpBuildError(RuntimeError):
    """An op could not be built here; the message says what to install."""


def main(argv: list[str] | None = None) -> int:
    """`python -m suite.ops [fused_adam] [cpu_adam] [async_io]`: build the ops the CPU trials load,
    or those named (scripts/setup.sh runs it; the demo names fused_adam, the only one its trials
    load). async_io (the NVMe tier's) only where libaio is installed: without it, one line says
    so and the rest are built. Exit 1, saying what to install, if an op does not build, and 2 for
    a name that is no op."""
    names = dict(zip(OP_NAMES, JIT_OPS, strict=True))
    asked = list(sys.argv[1:] if argv is None else argv) or list(OP_NAMES)
    unknown = [a for a in asked if a not in names]
    if unknown:
        print(f"error: no op {', '.join(unknown)}; the ops: {', '.join(OP_NAMES)}", file=sys.stderr)
        return 2
    no_aio = aio_problem() if "async_io" in asked else None
    if no_aio:
        asked.remove("async_io")
    built = [p for p in (built_path(names[a]) for a in asked) if p is not None]
    where = built[0].parent.parent if built else "torch's extension folder"
    print(f"DeepSpeed's CPU ops ({', '.join(p.stem for p in built)}) in {where}:")
    if no_aio:
        print(f"  not built: async_io: {no_aio}")
    start = time.monotonic()
    try:
        took = build(tuple(names[a] for a in asked))
    except OpBuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"  built in {time.monotonic() - start:.0f} s" if took else "  already built (cached)")
    left = [n for n in OP_NAMES if n not in asked and (p := built_path(names[n])) is not None and not p.exists()]
    left = [n for n in left if not (n == "async_io" and no_aio)]
    if left:
        print(f"  not built now: {', '.join(left)} (the first trial that loads one builds it, a minute or two on "
              f"2 cores: offload trials cpu_adam, NVMe trials async_io; or python -m suite.ops)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
