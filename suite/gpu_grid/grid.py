"""The GPU grid's run: DeepSpeed's ops built beside the first (FSDP2) trials, each planned item in
priority order within the time budget (a boundary by doubling its micro-batch from the predicted
largest that fits, until one fits and its double does not), the rows and the files
(suite.gpu_grid). Output: OUT/records (the store: normal trial records that `suite-report accuracy`
scores; worker logs in records/logs), OUT/ops-*.log, OUT/table.txt, OUT/grid.json (the rows,
boundaries, plan, what was left out, versions) and OUT/README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from suite import detect
from suite.gpu_check import environment
from suite.gpu_check.check import NO_GPU, UNUSABLE, environment_rows, ops_row, run_within
from suite.gpu_check.plan import OPS, OPS_BUILD_S, OPS_TIMEOUT_S, STARTUP_S, Budget, Check, op_needed
from suite.gpu_check.verdicts import Row, exit_code, fmt, table, write
from suite.gpu_grid.plan import BUDGET_S, PLAN_S, Item, Plan, describe
from suite.record import Record, provenance

SWEEP = "gpu-grid"


@dataclasses.dataclass
class Search:
    """One planned item as it runs: the micro-batches tried and their outcomes, its rows."""

    item: Item
    rank: int
    start: int
    ladder: list[int]
    results: dict[int, str] = dataclasses.field(default_factory=dict)
    rows: list[Row] = dataclasses.field(default_factory=list)
    stopped: bool = False
    """Cut by the budget, failed, or left without DeepSpeed: nothing more runs."""

    def next_mb(self) -> int | None:
        """A point's one micro-batch; a boundary's next: the double of the largest that fit until one
        does not, the half of the smallest that did not until one does; None when found or done."""
        if self.stopped:
            return None
        if not self.results:
            return self.start
        if not self.item.boundary or any(o not in ("ok", "oom") for o in self.results.values()):
            return None
        ok = max((mb for mb, o in self.results.items() if o == "ok"), default=None)
        oom = min((mb for mb, o in self.results.items() if o == "oom"), default=None)
        if ok is not None and oom is not None:
            return None  # adjacent by construction: each step doubles or halves
        nxt = 2 * ok if ok is not None else oom // 2
        return nxt if nxt in self.ladder else None

    def boundary(self) -> dict[str, Any]:
        ok = max((mb for mb, o in self.results.items() if o == "ok"), default=None)
        oom = min((mb for mb, o in self.results.items() if o == "oom"), default=None)
        return {"largest_ok_mb": ok, "smallest_oom_mb": oom, "tried": dict(sorted(self.results.items()))}


def grid_row(c: Check, t, rec: Record, forecast) -> Row:
    """A trial's row: ran to a result (ok or oom) or failed; on its profile's GPU."""
    m = rec.metrics or {}
    figures = {
        "micro_batch": t.methods.micro_batch,
        "cap_gib": t.hardware.mem_gib,
        "step_time_s": m.get("step_time_s"),
        "pred_step_s": forecast.step_s if forecast and forecast.fits else None,
        "mfu": m.get("mfu"),
        "peak_mem_gib": m.get("peak_mem_gib"),
        "peak_reserved_gib": m.get("peak_reserved_gib"),
        "predicted_gib": forecast.peak_gib if forecast else None,
        "pred_device_gib": forecast.device_gib if forecast else None,
        "pred_fits": forecast.fits if forecast else None,
        "est_s": c.est_s,
        "wall_s": rec.wall_s,
        "trial_id": rec.trial_id,
        "message": (rec.message or "")[:300],
    }
    row = Row(c.name, rec.outcome, figures)
    ran = rec.outcome in ("ok", "oom")
    row.verdicts["run"] = "pass" if ran else f"FAIL: {rec.outcome}: {rec.message}"
    if rec.ok:
        wrong = m.get("profile_mismatch")
        row.verdicts["profile"] = "pass" if not wrong else f"FAIL: ran on {wrong['device_name']}"
    if ran and forecast is not None and forecast.fits != rec.ok:
        row.notes.append(f"predicted {'to fit' if forecast.fits else 'out of memory'}")
    return row


COLUMNS = [
    ("trial", 44, lambda r: r.name),
    ("status", 7, lambda r: r.status),
    ("outcome", 7, lambda r: r.outcome),
    ("pred", 4, lambda r: {True: "fits", False: "OOM"}.get(r.figures.get("pred_fits"), "-")),
    ("step s", 7, lambda r: fmt(r.figures.get("step_time_s"), ".3f")),
    ("pred s", 7, lambda r: fmt(r.figures.get("pred_step_s"), ".3f")),
    ("MFU", 6, lambda r: fmt(r.figures.get("mfu"), ".1%")),
    ("peak GiB", 8, lambda r: fmt(r.figures.get("peak_mem_gib"), ".2f")),
    ("pred GiB", 8, lambda r: fmt(r.figures.get("predicted_gib"), ".2f")),
    ("est s", 5, lambda r: fmt(r.figures.get("est_s"), ".0f")),
    ("wall s", 6, lambda r: fmt(r.figures.get("wall_s"), ".0f")),
]


@dataclasses.dataclass
class Grid:
    """One run of the grid: its trials go to OUT/records (the store), its logs beside them."""

    out: Path
    plan: Plan
    items: list[Item]
    """The planned items, in priority order."""
    budget: Budget
    build: Any
    """DeepSpeed's ops building (environment.OpBuild, started before the plan's forecasts)."""
    run_one: Callable | None = None
    """suite.runner.run_one, or a test's own."""
    searches: list[Search] = dataclasses.field(default_factory=list)

    @property
    def store(self) -> str:
        return str(self.out / "records")

    def check(self, s: Search, mb: int, unbuilt: frozenset[str] = frozenset()) -> tuple[Check, Any]:
        c, t = self.plan.probe(s.item, mb, unbuilt)
        self.budget.rank[c.name] = s.rank  # what ranks above it keeps its time
        return c, t

    def pending(self, s: Search) -> list[Check]:
        """The trials a search is still expected to run: its next, and its double where none ran yet."""
        mb = s.next_mb()
        if mb is None:
            return []
        expected = self.plan.expected(s.item) if not s.results else [mb]
        return [self.check(s, m)[0] for m in expected if m >= mb]

    def run(self) -> list[Row]:
        """Every planned item as the budget admits it; the ops' row, then each item's rows in plan order."""
        self.searches = [
            Search(item, k, self.plan.start(item), self.plan.ladder(item.cell)) for k, item in enumerate(self.items)
        ]
        build = self.build
        ops_row, unbuilt, no_deepspeed = None, frozenset(), None
        while True:
            live = [s for s in self.searches if s.next_mb() is not None]
            building = ops_row is None and build.running()
            pick = next((s for s in live if not building or op_needed(self.check(s, s.next_mb())[1]) is None), None)
            if ops_row is None and (pick is None or not building):
                ops_row, unbuilt, no_deepspeed = built(build)
                continue
            if pick is None:
                break
            c, t = self.check(pick, pick.next_mb(), unbuilt)
            if no_deepspeed and t.methods.engine == "deepspeed":
                pick.rows.append(Row(c.name, "not run", verdicts={"run": f"FAIL: {no_deepspeed}"}))
                pick.stopped = True
                continue
            others = [p for s in live if s is not pick for p in self.pending(s)]
            rec, t, row = run_within(self.budget, c, t, others, self.store, SWEEP, self.run_one)
            if row is not None:
                pick.rows.append(row)
                pick.stopped = True
                continue
            row = grid_row(c, t, rec, self.plan.forecast.get(t.id))
            if t.methods.optimizer != "engine":
                row.notes.append("ran with torch's fused AdamW (methods.optimizer=torch_fused): the op did not build")
            pick.rows.append(row)
            pick.results[t.methods.micro_batch] = rec.outcome
        return ([ops_row] if build.logs else []) + [r for s in self.searches for r in s.rows]

    def boundaries(self) -> list[dict[str, Any]]:
        """Each boundary item: what fit, what did not, and where the predictor put the boundary."""
        out = []
        for s in self.searches:
            if s.item.boundary:
                b = s.boundary()
                predicted = s.start if self.plan.forecast[self.plan.trial(s.item, s.start).id].fits else None
                found = b["largest_ok_mb"] is not None or b["smallest_oom_mb"] is not None
                complete = found and s.next_mb() is None and not s.stopped
                right = predicted == b["largest_ok_mb"] if complete else None
                out.append(
                    {"item": describe(self.plan, s.item), "predicted_largest_ok_mb": predicted, **b, "right": right}
                )
        return out


def built(build: environment.OpBuild) -> tuple[Row, frozenset[str], str | None]:
    """Wait for DeepSpeed's ops: their row (`check.ops_row`), the ops that did not build (their
    trials take torch's fused AdamW) and, where DeepSpeed does not import at all, why (its trials
    are not run)."""
    row, why = ops_row(build)
    return row, frozenset(why), build.no_deepspeed


def dry_run(gpu: str, count: int, budget_s: float, plan: Plan | None = None) -> int:
    """The plan as it would run on `count` GPUs of type `gpu`, each trial at its estimate; 0 when it
    fits the budget, else 1."""
    plan = plan or Plan.make(gpu, count)
    admitted, left, slots, end = plan.planned(budget_s)
    head = f"The GPU grid's plan on {count} x {gpu} ({plan.gpu_mem_gib:g} GiB), {budget_s:.0f} s from the start,"
    print(head + f"\n  estimated: start-up ~{STARTUP_S:.0f} s; DeepSpeed's ops building {OPS_BUILD_S:.0f} s from")
    print(f"  {STARTUP_S:.0f} s, the plan's predictions ~{PLAN_S:.0f} s beside them; FSDP2's trials beside the build")
    print(f"\n  {'start':>6}  {'est':>5}  {'trial':<44} predicted")
    for s in slots:
        t = plan.trial(*_item_mb(plan, s.check.name, admitted))
        f = plan.forecast[t.id]
        said = f"fits {f.device_gib:6.1f} GiB" if f.fits else f"OOM  {f.device_gib:6.1f} GiB"
        step = f", {f.step_s:.2f} s/step" if f.fits and f.step_s else ""
        beside = "  beside the op build" if s.beside_build else ""
        print(f"  {s.start_s:5.0f} s {s.check.est_s:4.0f} s  {s.check.name:<44} {said}{step}{beside}")
    fits = end <= budget_s
    n = len(slots)
    print(
        f"\n  {n} trials of {len(admitted)} items; ends at {end:.0f} s of a {budget_s:.0f} s budget: "
        f"{'fits' if fits else 'DOES NOT FIT'}"
    )
    print(f"  left out of the plan (the budget): {len(left)} of {len(plan.items)} items; the first ones:")
    for item in left[:8]:
        print(f"    {describe(plan, item)}")
    return 0 if fits else 1


def _item_mb(plan: Plan, name: str, admitted: list[Item]) -> tuple[Item, int]:
    for item in admitted:
        for mb in plan.expected(item):
            if plan.probe(item, mb)[0].name == name:
                return item, mb
    raise KeyError(name)


def versions() -> dict[str, Any]:
    """What the grid ran with: Python, packages, CUDA, driver, devices (suite.record's provenance)."""
    p = provenance("cuda")
    keep = ("python", "versions", "cuda", "driver", "devices", "git_revision", "git_dirty", "hostname", "cpu_count")
    return {k: p.get(k) for k in keep}


def readme(out: Path, plan: Plan, rows: list[Row], doc: dict[str, Any]) -> str:
    """OUT/README.md: what ran and what did not, with what, and the commands."""
    v = doc["versions"]
    counts = {s: sum(r.status == s for r in rows) for s in ("PASS", "FAIL", "NOT RUN")}
    outcomes = {o: sum(r.outcome == o for r in rows) for o in ("ok", "oom")}
    lines = [
        f"# The GPU grid on {plan.count} x {plan.gpu}: {doc['date']}",
        "",
        "```bash",
        f"GPU_GRID_BUDGET_S={doc['budget_s']:.0f} bash scripts/gpu-grid.sh {out}  # there: packed as {out}.tar.gz",
        f"suite-report accuracy results/gpu-grid/{out.name}/records --publish   # here: results/accuracy/cuda.json",
        "```",
        "",
        f"Python {v['python']}, "
        + ", ".join(f"{k} {x}" for k, x in (v["versions"] or {}).items() if x)
        + f"; CUDA {v['cuda']}, driver {v['driver']}; {', '.join(v['devices'] or [])}; "
        f"git {str(v['git_revision'])[:7]}{' (dirty)' if v['git_dirty'] else ''}.",
        "",
        f"{outcomes['ok']} trials ok and {outcomes['oom']} out of memory ({counts['PASS']} PASS, "
        f"{counts['FAIL']} FAIL, {counts['NOT RUN']} NOT RUN: cut by the budget) in {doc['elapsed_s']:.0f} s of "
        f"{doc['budget_s']:.0f}; "
        f"{len(doc['planned'])} items planned, {len(doc['left_out'])} of the grid left out of the plan (grid.json).",
        "",
        "## Out-of-memory boundaries",
        "",
        "| item | predicted largest fitting mb | fits at | out of memory at | right |",
        "| --- | --- | --- | --- | --- |",
    ]
    for b in doc["boundaries"]:
        right = {True: "yes", False: "no", None: "-"}[b["right"]]
        cells = [b["item"], b["predicted_largest_ok_mb"], b["largest_ok_mb"], b["smallest_oom_mb"], right]
        lines.append("| " + " | ".join("-" if x is None else str(x) for x in cells) + " |")
    lines += ["", "## Trials", "", "```", table(rows, COLUMNS), "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m suite.gpu_grid", description=__doc__)
    p.add_argument("out", nargs="?", help="where records, table.txt, grid.json and README.md go")
    p.add_argument("--dry-run", action="store_true", help="print the plan and its estimated seconds; run nothing")
    p.add_argument("--gpu", default="h200", help="the dry run's GPU type (conf/hardware/), default h200")
    p.add_argument("--count", type=int, default=1, help="the dry run's GPU count, default 1")
    args = p.parse_args(argv)
    budget_s = float(os.environ.get("GPU_GRID_BUDGET_S", BUDGET_S))
    if args.dry_run:
        sys.exit(dry_run(args.gpu, args.count, budget_s))
    start = float(os.environ.get("GPU_GRID_START", time.time()))
    code, found = detect.diagnose()
    if code == 1:
        print(f"gpu-grid: {found}: nothing to run", file=sys.stderr)
        sys.exit(NO_GPU)
    if code != 0:
        print(f"gpu-grid: {found}", file=sys.stderr)
        sys.exit(UNUSABLE)
    gpu, count = found.rsplit("-x", 1)
    date = dt.datetime.now(dt.timezone.utc)
    out = Path(args.out or f"results/gpu-grid/{date:%Y-%m-%d}-{gpu}")
    out.mkdir(parents=True, exist_ok=True)
    print(f"detect: {found}", flush=True)
    env = environment.check()
    rows = environment_rows(env)
    for f in env.findings:
        print(f"env {f.what}: {f.verdict if f.verdict != 'pass' else f.message}", flush=True)
    if env.fatal:
        print(write(out, rows, {}, COLUMNS, "grid"))
        sys.exit(UNUSABLE)
    build = environment.OpBuild(list(OPS), env.unbuildable, out, OPS_TIMEOUT_S)  # every grid plans ZeRO and offload
    plan = Plan.make(gpu, int(count))  # beside the build
    late = time.time() - start - STARTUP_S - PLAN_S  # the plan's timeline starts at STARTUP_S + PLAN_S
    admitted, left, _, end = plan.planned(budget_s - late)
    print(f"plan: {len(admitted)} items, expected to end at {end + late:.0f} s; {len(left)} left out", flush=True)
    budget = Budget(budget_s, start, rank={})
    grid = Grid(out, plan, admitted, budget, build)
    rows += grid.run()
    doc = {
        "date": f"{date:%Y-%m-%d %H:%M} UTC",
        "budget_s": budget_s,
        "elapsed_s": budget.elapsed(),
        "gpu": gpu,
        "count": int(count),
        "boundaries": grid.boundaries(),
        "planned": [describe(plan, i) for i in admitted],
        "left_out": [describe(plan, i) for i in left],
        "versions": versions(),
    }
    print("\n" + write(out, rows, doc, COLUMNS, "grid"))
    (out / "README.md").write_text(readme(out, plan, rows, doc))
    sys.exit(exit_code(rows))
