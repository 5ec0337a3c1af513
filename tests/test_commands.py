"""Every command of the README, as typed, from a directory other than the checkout; and the exit
codes of the commands: 0 for a result (whatever outcome a trial records), 2 for input or hardware
that cannot run here, with one line that says why and what to run instead.

The README's commands that take minutes run shrunk (CPU_SHRINK: the test model and steps); a
command for GPUs this machine does not have must refuse it up front. A command added to the
README that this file cannot place fails `test_every_readme_command_is_checked`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, TINY

BIN = Path(sys.executable).parent  # the suite's commands, installed beside this Python
# What turns a CPU command of minutes into seconds: conftest's test model, recipe and steps.
CPU_SHRINK = [o for o in TINY if o.startswith(("model.", "measure."))]
CPU_SHRINK += ["methods.micro_batch=2", "wandb.mode=disabled"]
SEARCH_SHRINK = [  # one combination, one micro-batch, the shortest confirmation
    "model.recipe.global_batch=2",
    "search.engines=[deepspeed]",
    "search.zero_stages=[0]",
    "search.recomputes=[none]",
    "search.min_runs=2",
    "search.max_runs=2",
]
SCRIPTS = {  # the README's scripts, and what checks each
    "bash scripts/test.sh": "this test suite itself (CI runs it)",
    "bash scripts/demo.sh": "benchmarks/first_minutes.py, end to end from a fresh clone",
}


def readme_commands() -> list[str]:
    """Each command line of the README's bash blocks (continuations joined), and each suite
    command named in a comment ("on GPUs: suite-search ...")."""
    text = (ROOT / "README.md").read_text()
    found = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            code, _, comment = line.partition("#")
            found += [" ".join(code.split())] if code.strip() else []
            found += [" ".join(c.split()) for c in re.findall(r"suite-[a-z]+ [^;]*", comment)]
    return found


COMMANDS = readme_commands()


def is_gpu(cmd: str) -> bool:
    hardware = [a.split("=", 1)[1] for a in shlex.split(cmd) if a.startswith("hardware=")]
    return any(not h.startswith("cpu") for h in hardware)


def shrunk(args: list[str], extra: list[str]) -> list[str]:
    """The command's overrides with each sweep cut to its first value, then `extra`, which wins."""
    keys = {e.split("=", 1)[0] for e in extra}
    kept = [a if a.startswith("-") or "," not in a else a.split(",", 1)[0] for a in args]
    return [a for a in kept if a.split("=", 1)[0] not in keys] + extra


def run(cmd: list[str], cwd: Path, timeout: int = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    exe = [str(BIN / cmd[0]), *cmd[1:]]
    return subprocess.run(exe, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


NO_GPUS = dict(os.environ, CUDA_VISIBLE_DEVICES="")
"""A command's environment where it sees no GPU, whatever this machine has."""


def test_every_readme_command_is_checked():
    """Each command is a script (checked as SCRIPTS says), the venv's activation, or a suite
    command that one of the tests below runs."""
    assert len(COMMANDS) >= 8
    for cmd in COMMANDS:
        if cmd.startswith("bash "):
            assert cmd in SCRIPTS, f"{cmd}: say in SCRIPTS what checks it"
            script = ROOT / cmd.split()[1]
            assert subprocess.run(["bash", "-n", str(script)]).returncode == 0, cmd
        elif cmd == ". .venv/bin/activate":
            assert (ROOT / ".venv/bin/activate").exists(), "run bash scripts/setup.sh: it makes .venv"
        else:
            assert cmd.split()[0] in ("suite-bench", "suite-search", "suite-predict", "suite-report"), cmd
            assert (BIN / cmd.split()[0]).exists(), f"{cmd.split()[0]} is not installed: bash scripts/setup.sh"


GPU_COMMANDS = [c for c in COMMANDS if c.startswith(("suite-bench", "suite-search")) and is_gpu(c)]
GPU_COMMANDS += [c.replace("hardware=a6000 hardware.count=4", "hardware=a6000-x4") for c in GPU_COMMANDS]  # old name


@pytest.mark.parametrize("cmd", GPU_COMMANDS)
def test_a_readme_command_for_gpus_that_are_not_here_says_so_once_and_exits_2(cmd, tmp_path):
    """Run where it sees no GPU (CUDA_VISIBLE_DEVICES empty), on any machine."""
    out = run(shlex.split(cmd), tmp_path, timeout=120, env=NO_GPUS)
    assert out.returncode == 2, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs 4 CUDA GPU(s); this machine has 0" in lines[0], out.stderr[-2000:]
    assert "suite-predict model=pythia-1b hardware=a6000 hardware.count=4" in lines[0]
    assert out.stdout == "" and not list(tmp_path.iterdir())  # nothing ran, nothing written


@pytest.mark.slow  # seconds of subprocesses: the full tier
def test_the_readme_prediction_runs_as_typed_anywhere(tmp_path):
    (cmd,) = [c for c in COMMANDS if c.startswith("suite-predict")]
    out = run(shlex.split(cmd), tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("PREDICTED, not measured: pythia-1b on a6000-x4 (48 GiB per device)")
    assert (tmp_path / "reports" / "predict" / "pythia-1b-a6000-x4.csv").exists()


@pytest.mark.slow  # seconds of subprocesses: the full tier
def test_the_readme_tables_run_as_typed_and_elsewhere_say_where_results_are(tmp_path):
    (cmd,) = [c for c in COMMANDS if c.startswith("suite-report tables")]
    (tmp_path / "tests").symlink_to(ROOT / "tests")  # the command names a folder of the checkout
    out = run(shlex.split(cmd), tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "### Each model across budgets" in out.stdout and (tmp_path / "reports" / "tables" / "best.md").exists()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = run(shlex.split(cmd), elsewhere, timeout=300)
    (line,) = out.stderr.strip().splitlines()
    assert out.returncode == 2 and line.startswith("suite-report tables: error: tests/fixtures/results does not exist")


@pytest.mark.slow
@pytest.mark.parametrize("cmd", [c for c in COMMANDS if c.startswith("suite-bench")])
def test_a_readme_trial_command_runs_as_typed_anywhere(cmd, trial_store, tmp_path):
    """Shrunk, the one trial and the sweep cut to its first trial are conftest's TINY trial: one
    measurement in the session's store serves both, and the ZeRO tests."""
    args = shrunk(shlex.split(cmd), [*CPU_SHRINK, f"store.dir={trial_store}"])
    out = run(args, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert re.search(r"^\[         ok\] pythia-14m cpu-x2 DDP ", out.stdout, re.M), out.stdout[-2000:]
    assert f"-> {trial_store}/" in out.stdout


@pytest.mark.slow
def test_the_readme_search_runs_as_typed_anywhere_and_makes_its_log_folder(calibrated, tmp_path):
    (cmd,) = [c for c in COMMANDS if c.startswith("suite-search") and not is_gpu(c)]
    runs = tmp_path / "new" / "runs"  # a folder that does not exist yet
    out = run(shrunk(shlex.split(cmd), [*CPU_SHRINK, *SEARCH_SHRINK, f"store.dir={runs}"]), tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "search for pythia-14m on " in out.stdout and "best:" in out.stdout
    (log,) = runs.glob("search-pythia-14m-*.json")
    assert json.loads(log.read_text())["best"] and f"search log: {log}" in out.stdout


def test_bad_input_to_each_command_exits_2_in_one_line(tmp_path, capsys):
    """A wrong value, or hardware that is not here, before anything runs: exit 2 and one line
    that names it (suite-predict in this process; suite-search as a user runs it)."""
    import torch

    from cli import predict

    have = torch.cuda.device_count()
    absent = (
        []
        if have >= 4
        else [  # the GPUs this process sees: where there are 4, calibrate would run
            (
                ["calibrate", "hardware=a6000", "hardware.count=4"],
                f"a6000-x4 needs 4 CUDA GPU(s); this machine has {have}",
            )
        ]
    )
    for argv, says in (
        *absent,
        (["calibrate", "hardware=nonsense"], "nonsense"),
        (["model=pythia-1b", "hardware=nonsense"], "nonsense"),
    ):
        assert predict.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("suite-predict: error: ") and says in err and "Traceback" not in err, err
    out = run(["suite-search", "experiment=cpu-search", "search.min_runs=1"], tmp_path, timeout=120)
    assert out.returncode == 2 and "search.min_runs=1 must be >= 2" in out.stderr, out.stderr[-2000:]
    assert "Traceback" not in out.stderr and not list(tmp_path.iterdir())
