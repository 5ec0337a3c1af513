"""The GPU check's run: the environment, DeepSpeed's ops built beside the first trials and the
predictions, the checks within the time budget, the verdicts and the exit code (suite.gpu_check).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from suite import detect, store
from suite.config import Trial
from suite.config.validate import flash_attn_problem
from suite.gpu_check import environment, verdicts
from suite.gpu_check.plan import (
    BUDGET_S,
    OPS,
    OPS_BUILD_S,
    OPS_TIMEOUT_S,
    STARTUP_S,
    Budget,
    Check,
    base_trial,
    next_check,
    op_needed,
    plan,
    timeline,
    trial_of,
)
from suite.gpu_check.verdicts import (
    Context,
    Expect,
    Row,
    exit_code,
    expect,
    judge,
    predictions,
    write,
)
from suite.record import Record
from suite.runner import run_one, summary_line

NO_GPU, UNUSABLE = 3, 2  # exit codes: no CUDA GPU here; the environment cannot run the check


def ops_row(build: environment.OpBuild) -> tuple[Row, dict[str, str]]:
    """Wait for DeepSpeed's ops: their row (built, or which failed and why), printed where any was
    built, and the ops that did not build with why (the check's and the grid's)."""
    why = build.wait()
    names = "+".join(OPS[op] for op in build.logs)
    row = Row(f"DeepSpeed ops {names}", "ok" if not why else "failed", {"wall_s": build.wall_s})
    row.verdicts["build"] = "pass" if not why else "FAIL: " + "; ".join(f"{OPS[o]} {w}" for o, w in why.items())
    if build.logs:
        print(f"deepspeed ops: {row.verdicts['build']} ({build.wall_s:.0f} s)", flush=True)
    return row, why


def skipped_upfront(c: Check, t: Trial, env: environment.Environment) -> str | None:
    """Why a check cannot run on this machine, known before anything starts (it costs no time)."""

    if t.methods.engine == "fsdp2" and env.fsdp2:
        return env.fsdp2
    if t.methods.attention == "flash_attention_2":
        return flash_attn_problem()
    return None


@dataclasses.dataclass
class Session:
    """One run of the check: its trials go to OUT/records (the store), its logs beside them."""

    out: Path
    base: Trial
    budget: Budget
    env: environment.Environment
    run_one: Callable | None = None
    """suite.runner.run_one, or a test's own."""
    predict: Callable[[dict[str, Trial]], Callable[[], dict[str, Expect]]] = predictions
    """Starts the predictions of the trials by check name; what it returns waits for them."""
    rows: dict[str, Row] = dataclasses.field(default_factory=dict)
    """Rows decided without a record (skipped, not run), by check name."""
    records: dict[str, Record] = dataclasses.field(default_factory=dict)
    trials: dict[str, Trial] = dataclasses.field(default_factory=dict)
    notes: dict[str, list[str]] = dataclasses.field(default_factory=dict)

    @property
    def store(self) -> str:
        return str(self.out / "records")

    def run(self) -> list[Row]:
        """Every check, as the budget admits them; the rows in plan order, after the ops' row."""
        checks = plan()
        pending = []
        for c in checks:
            t = trial_of(self.base, c)
            why = skipped_upfront(c, t, self.env)
            if why:
                self.rows[c.name] = Row(c.name, "skipped", verdicts={"run": f"skipped: {why}"})
            else:
                pending.append((c, t))
        ops = [op for op in OPS if op in {op_needed(t) for _, t in pending}]
        build = environment.OpBuild(ops, self.env.unbuildable, self.out, OPS_TIMEOUT_S)
        predicted = self.predict({c.name: t for c, t in pending})  # on the CPU, beside the trials
        ops_row = self.trials_and_build(pending, build)
        expects = predicted()
        for c in checks:  # a trial changed by the fallback is predicted as it ran
            t = self.trials.get(c.name)
            if t is not None and t.id != trial_of(self.base, c).id:
                expects[c.name] = expect(t)
        ctx = Context(self.records, expects)
        rows = [ops_row] if ops_row else []
        for c in checks:
            row = self.rows.get(c.name) or judge(c, self.records[c.name], ctx)
            row.notes += self.notes.get(c.name, [])
            rows.append(row)
        return rows

    def trials_and_build(self, pending: list[tuple[Check, Trial]], build: environment.OpBuild) -> Row | None:
        """Run the checks, those that need no DeepSpeed op while the ops build; the build's row."""
        ops_row = None
        while pending or ops_row is None:
            building = ops_row is None and build.running()
            found = next_check(pending, building) if pending else None
            if ops_row is None and (found is None or not building):
                ops_row = self.built(build, pending)  # drops or changes the checks that needed an op
                continue
            pending.remove(found)
            self.run_check(*found, [c for c, _ in pending])  # the others pending: those ranked above keep their time
        return ops_row if build.logs else None

    def built(self, build: environment.OpBuild, pending: list[tuple[Check, Trial]]) -> Row:
        """Wait for the ops; the checks that would load one that did not build take torch's fused
        AdamW (or, where DeepSpeed does not import at all, are failed without a launch)."""
        row, why = ops_row(build)
        for k, (c, t) in enumerate(pending):
            op = op_needed(t)
            if t.methods.engine == "deepspeed" and build.no_deepspeed:
                self.rows[c.name] = Row(c.name, "not run", verdicts={"run": f"FAIL: {build.no_deepspeed}"})
            elif op in why:
                pending[k] = (c, trial_of(self.base, c, frozenset(why)))
                note = f"ran with torch's fused AdamW (methods.optimizer=torch_fused): {OPS[op]} {why[op]}"
                self.notes.setdefault(c.name, []).append(note)
        pending[:] = [(c, t) for c, t in pending if c.name not in self.rows]
        return row

    def run_check(self, c: Check, t: Trial, others: list[Check]) -> None:
        """Run one check if the budget admits it; a trial the budget cuts is not run, not failed."""
        rec, t, row = run_within(self.budget, c, t, others, self.store, "gpu-check", self.run_one)
        if row is not None:
            self.rows[c.name] = row
        else:
            self.records[c.name], self.trials[c.name] = rec, t


def run_within(
    budget: Budget, c: Check, t: Trial, others: list[Check], store_dir: str, sweep: str, run: Callable | None = None
) -> tuple[Record | None, Trial, Row | None]:
    """Run one trial if the budget admits it (`others`: the trials still pending, of which those ranked
    above it keep their time), with its timeout cut to the room left: its record and the trial as run;
    or a NOT RUN row, for a trial the budget left out or cut (whose record is removed: it measured
    nothing). `run` is suite.runner.run_one, or a test's own."""
    cost, room = budget.cost(c), budget.room(c, others)
    if cost > room:
        why = f"needs ~{cost:.0f} s; {max(room, 0):.0f} s are left once the trials ranked above it have theirs"
        print(f"[    not run] {c.name}: {why}", flush=True)
        return None, t, Row(c.name, "not run", verdicts={"budget": f"not run: {why}"})
    t = dataclasses.replace(t, measure=dataclasses.replace(t.measure, timeout_s=min(c.timeout_s, room)))
    ran = (run or run_one)(t, store_dir, sweep, in_sweep=True)
    rec = ran.record
    budget.ran(c, rec.wall_s)
    print(summary_line(ran, t), flush=True)
    if rec.outcome == "timeout" and t.measure.timeout_s < c.timeout_s:
        store.path_for(store_dir, rec.trial_id).unlink(missing_ok=True)  # not a measurement of the trial
        why = f"cut by the budget after {t.measure.timeout_s:.0f} s (its own timeout: {c.timeout_s:.0f} s)"
        return None, t, Row(c.name, "not run", {"wall_s": rec.wall_s}, {"budget": f"not run: {why}"})
    return rec, t, None


def launcher_row() -> Row:
    """Whether the launcher (this process) holds GPU memory after all its trials."""
    import torch

    verdict, seen = verdicts.launcher_verdict(
        torch.cuda.is_initialized(), verdicts.nvml_processes, verdicts.probe_process
    )
    return Row("launcher GPU memory", "ok", {"message": seen}, {"launcher": verdict})


def environment_rows(env: environment.Environment) -> list[Row]:
    return [Row(f"env: {f.what}", "ok", {"message": f.message}, {f.what: f.verdict}) for f in env.findings]


def dry_run(budget_s: float) -> int:
    """The plan as it would run on one H200 with each estimate; 0 when it fits the budget, else 1."""
    env, base, checks = environment.Environment([]), base_trial("h200"), []
    print(f"The GPU check's plan on one H200, {budget_s:.0f} s from the script's start (estimates):")
    print(f"  start-up (script, wheels, imports, environment): ~{STARTUP_S:.0f} s; the predictor's figures: in a")
    print("  process of their own beside the trials; after them, the launcher's verdict and the table: seconds")
    for c in plan():
        t = trial_of(base, c)
        why = skipped_upfront(c, t, env)
        if why:
            print(f"  skipped: {c.name}: {why}")
        else:
            checks.append((c, t))
    fits = True
    for label, build_s in (("its estimate", OPS_BUILD_S), ("its timeout", OPS_TIMEOUT_S)):
        slots, end = timeline(checks, build_s)
        print(f"\nDeepSpeed's ops building for {build_s:.0f} s ({label}) from {slots[0].start_s:.0f} s:")
        for s in slots:
            beside = "beside the op build" if s.beside_build else ""
            print(f"  {s.start_s:5.0f} s  {s.check.name:<24} ~{s.check.est_s:3.0f} s  {beside}")
        fits &= end <= budget_s
        print(f"  ends at {end:.0f} s of a {budget_s:.0f} s budget: {'fits' if end <= budget_s else 'DOES NOT FIT'}")
    return 0 if fits else 1


def main(argv: list[str] | None = None) -> None:

    p = argparse.ArgumentParser(prog="python -m suite.gpu_check", description=__doc__)
    p.add_argument("out", nargs="?", help="where records, table.txt and verdicts.json go")
    p.add_argument("--dry-run", action="store_true", help="print the plan and its estimated seconds; run nothing")
    args = p.parse_args(argv)
    budget_s = float(os.environ.get("GPU_CHECK_BUDGET_S", BUDGET_S))
    if args.dry_run:
        sys.exit(dry_run(budget_s))
    start = float(os.environ.get("GPU_CHECK_START", time.time()))
    out = Path(args.out or f"results/gpu-check/{time.strftime('%Y%m%d-%H%M%S')}")
    code, found = detect.diagnose()
    if code == 1:
        print(f"gpu-check: {found}: nothing to check", file=sys.stderr)
        sys.exit(NO_GPU)
    out.mkdir(parents=True, exist_ok=True)
    print(f"detect: {found}", flush=True)
    rows = [Row("detect", "ok", {"message": found}, {"detect": "pass" if code == 0 else f"FAIL: {found}"})]
    env = environment.check()
    rows += environment_rows(env)
    for f in env.findings:
        print(f"env {f.what}: {f.verdict if f.verdict != 'pass' else f.message}", flush=True)
    if code != 0 or env.fatal:
        print(write(out, rows, {}))
        sys.exit(1 if code != 0 else UNUSABLE)
    session = Session(out, base_trial(detect.profile_of(*detect.local_gpus()[0])), Budget(budget_s, start), env)
    rows += session.run()
    rows.append(launcher_row())
    print("\n" + write(out, rows, {"budget_s": budget_s, "elapsed_s": session.budget.elapsed()}))
    sys.exit(exit_code(rows))
