"""A newcomer's first minutes, timed: a fresh clone of this checkout's HEAD to the demo's first
trial line and to its last table (setup's share and each DeepSpeed op's build time included),
the demo again with setup done, and the two test tiers.

    python -m benchmarks.first_minutes                    # fresh clone + demo, then demo with setup done
    python -m benchmarks.first_minutes --cold-ops         # the same with no DeepSpeed op built (an empty
                                                          #   TORCH_EXTENSIONS_DIR): the first machine
    python -m benchmarks.first_minutes --cold-pip         # pip without its cache: every package fetched
    python -m benchmarks.first_minutes --tests            # also bash scripts/test.sh --quick and bash scripts/test.sh
    python -m benchmarks.first_minutes --note "quiet"     # a word on the machine's load, kept with the figures

Every command runs as a user types it, in the clone, its output timestamped line by line. The
figures, the load average before and after each step and the provenance go to
`results/benchmarks/first_minutes.json` (`--out`). Timings are meaningful on a quiet machine only;
run it alone (`flock /tmp/cpu.lock python -m benchmarks.first_minutes` on a shared one).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.output import RESULTS, ROOT, write_result
from suite.record import provenance

TRIAL_LINE = re.compile(r"^\[ *(ok|oom|timeout|crashed|nan|invalid|unsupported)\] ")
OP_BUILT = re.compile(r"^  built (\w+) in (\d+) s")


def timed(cmd: list[str], cwd: Path, env: dict[str, str], log: Path) -> dict:
    """Run `cmd`, keeping each output line with its second since the start; the figures a
    newcomer sees: first trial line, setup's end, each op's build, the end and the exit code."""
    start = time.monotonic()
    load = os.getloadavg()[0]
    lines = []
    with subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as p:
        for line in p.stdout:
            lines.append((round(time.monotonic() - start, 1), line.rstrip("\n")))
            print(f"[{lines[-1][0]:7.1f}] {lines[-1][1]}", flush=True)
    log.write_text("\n".join(f"[{s:7.1f}] {text}" for s, text in lines) + "\n")
    first = next((s for s, text in lines if TRIAL_LINE.match(text)), None)
    setup = next((s for s, text in lines if text.startswith("Setup done in")), None)
    # pip's end on a first install, where the ops build beside it (scripts/setup.sh)
    pip_done = next((s for s, text in lines if text.startswith("Waiting for DeepSpeed's CPU ops")), None)
    ops = {m.group(1): int(m.group(2)) for _, text in lines if (m := OP_BUILT.match(text))}
    return {
        "command": " ".join(cmd),
        "exit_code": p.returncode,
        "total_s": round(time.monotonic() - start, 1),
        "setup_s": setup,
        "pip_done_s": pip_done,
        "first_trial_line_s": first,
        "op_build_s": ops,
        "load_before": round(load, 2),
        "load_after": round(os.getloadavg()[0], 2),
        "log": str(log),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cold-ops", action="store_true", help="no DeepSpeed op built: an empty TORCH_EXTENSIONS_DIR")
    ap.add_argument(
        "--tests", action="store_true", help="also time bash scripts/test.sh --quick and bash scripts/test.sh"
    )
    ap.add_argument(
        "--cold-pip", action="store_true", help="pip without its cache (PIP_NO_CACHE_DIR): every package fetched"
    )
    ap.add_argument("--note", default="", help="the machine and its load, kept with the figures")
    ap.add_argument("--out", default=str(RESULTS / "first_minutes.json"))
    ap.add_argument("--keep", action="store_true", help="keep the clone (its path is printed)")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="first-minutes-"))
    clone = work / "clone"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    cloned = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True, check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if ".venv" not in p)
    if args.cold_ops:
        env["TORCH_EXTENSIONS_DIR"] = str(work / "torch_extensions")  # empty: every op is built
    if args.cold_pip:
        env["PIP_NO_CACHE_DIR"] = "1"  # as on a machine that never installed these packages
    steps = {"fresh_clone_demo": timed(["bash", "scripts/demo.sh"], clone, env, work / "demo-fresh.log")}
    shutil.rmtree(clone / "results" / "runs", ignore_errors=True)  # or every trial comes from the store
    steps["demo_with_setup_done"] = timed(["bash", "scripts/demo.sh"], clone, env, work / "demo-again.log")
    if args.tests:
        steps["tests_quick"] = timed(["bash", "scripts/test.sh", "--quick"], clone, env, work / "tests-quick.log")
        steps["tests_all"] = timed(["bash", "scripts/test.sh"], clone, env, work / "tests-all.log")
    out = {
        "cold_ops": args.cold_ops,
        "cold_pip": args.cold_pip,
        "note": args.note,
        "steps": steps,
        "goals_s": {
            "fresh_clone_demo": 300,
            "demo_with_setup_done": 180,
            "first_trial_line_setup_done": 120,
            "tests_quick": 180,
            "tests_all": 600,
        },  # fmt: skip
    }
    # What was timed is the clone: its revision, not this checkout's now (which may have moved on).
    cloned_here = {**provenance("cpu"), "git_revision": cloned.stdout.strip(), "git_dirty": False}
    write_result(args.out, "first_minutes", out, provenance=cloned_here)
    for name, s in steps.items():
        ops, load = s["op_build_s"] or "cached", f"{s['load_before']}->{s['load_after']}"
        print(f"{name}: {s['total_s']:.0f} s (exit {s['exit_code']}), first trial line {s['first_trial_line_s']} s, "
              f"setup {s['setup_s']} s, ops {ops}, load {load}")  # fmt: skip
    print(f"wrote {args.out}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"clone kept: {clone}")
    return 0 if all(s["exit_code"] == 0 for s in steps.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
