"""A trial's record: its runs and their summary, typed, with its JSON form (schema suite.trial/2).

A `Record` keeps every run of a trial (`Run`: outcome, message, the worker's metrics, wall time
and provenance with its date) and summarises them in the fields every reader uses:

- `outcome`: `ok` only when every run was `ok`. A run that fails ends the trial's runs and gives
  the trial its outcome: a configuration that ran out of memory on run 3 of 5 is `oom` ("fits
  only sometimes"), its two good runs kept in `runs` but not summarised, since a configuration
  that fits only sometimes must not look like one that fits. `invalid` and `unsupported` are
  decided before any run (no runs).
- `metrics` (of an `ok` record): each metric summarised over the runs as `suite.metric_table`
  says (the median run's, the median, the largest, computed again at the median step time, or
  the interval and spreads of the runs together); a metric the table does not name is the
  median run's.
- `wall_s`: the wall time of all runs; `provenance`: the latest run's.

Records of schema suite.trial/1 (one run, its figures at the top) load as single runs
(`Record.from_json`). The file itself (atomic writes, claims) is `suite.store`'s.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import socket
import subprocess
from dataclasses import dataclass, field, replace
from functools import cache
from importlib import metadata
from typing import Any

from suite import metric_table, paths, stats
from suite import metrics as trial_metrics
from suite.config.schema import Trial

SCHEMA = "suite.trial/2"
SINGLE_RUN_SCHEMA = "suite.trial/1"
"""Records written before repeats: one run, its figures at the top; `Record.from_json` reads them."""
SCHEMAS = (SCHEMA, SINGLE_RUN_SCHEMA)


class UnknownSchema(ValueError):
    """A stored record of a schema this suite does not read."""


OUTCOMES = ("ok", "oom", "timeout", "crashed", "nan", "invalid", "unsupported")
"""ok, oom, timeout, crashed, nan from a run (suite.launch); invalid, unsupported decided before any."""
DECIDED = ("invalid", "unsupported")
SINGLE_RUN = "a single run: no interval"
PACKAGES = ("torch", "deepspeed", "transformers", "hydra-core", "flash-attn", "wandb")


@dataclass
class Run:
    """One run of a trial, in its own fresh worker processes (`suite.launch.run_trial`)."""

    outcome: str
    message: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    provenance: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"

    @property
    def step_time_s(self) -> float:
        return self.metrics["step_time_s"]

    @property
    def date(self) -> dt.datetime | None:
        """When it ran (its provenance), or None for a run without a date."""
        d = (self.provenance or {}).get("date")
        return dt.datetime.fromisoformat(d) if d else None

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("outcome", "message", "metrics", "wall_s", "provenance")}

    @classmethod
    def now(cls, t: Trial, outcome: str, message: str, metrics: dict, wall_s: float) -> Run:
        """A run of `t` that ended just now, with this machine's provenance."""
        return cls(outcome, message, metrics, wall_s, provenance(t.hardware.device))

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Run:
        return cls(
            d["outcome"], d.get("message", ""), d.get("metrics") or {}, d.get("wall_s", 0.0), d.get("provenance")
        )


@dataclass
class Record:
    """A trial and its runs, summarised (module docstring). `trial_json` is the resolved trial as
    stored (the file's "trial"); `trial` is it as a `Trial`."""

    trial_id: str
    sweep: str
    outcome: str
    message: str
    trial_json: dict[str, Any]
    metrics: dict[str, Any]
    wall_s: float
    provenance: dict[str, Any] | None
    runs: list[Run] = field(default_factory=list)
    schema: str = SCHEMA

    # ---- reading it -------------------------------------------------------------------------
    @property
    def ok(self) -> bool:
        return self.outcome == "ok"

    @property
    def trial(self) -> Trial:
        """The stored trial as a `Trial`."""
        return Trial.from_json(self.trial_json)

    @property
    def n_runs(self) -> int:
        """Runs behind an `ok` record's figures."""
        return self.metrics["runs"]

    @property
    def step_time_s(self) -> float:
        """The median step time of an `ok` record's runs."""
        return self.metrics["step_time_s"]

    @property
    def interval(self) -> stats.Interval:
        """The interval of the median step time of an `ok` record."""
        m = self.metrics
        return stats.Interval(m["step_time_ci_lo_s"], m["step_time_ci_hi_s"], m["step_time_ci_level"], m["runs"])

    @property
    def tokens_per_s(self) -> float:
        """An `ok` record's throughput at its median step time (tokens of the task's unit)."""
        return self.metrics["tokens_per_s"]

    @property
    def mfu(self) -> float | None:
        """An `ok` record's MFU at its median step time; None without a peak (CPU)."""
        return self.metrics.get("mfu")

    @property
    def peak_mem_gib(self) -> float:
        """An `ok` record's peak memory: the largest of its runs'."""
        return self.metrics["peak_mem_gib"]

    def figure(self, name: str) -> Any:
        """The summary's value of a metric of `suite.metric_table`, None where it has none; a name
        the table does not hold raises KeyError, so a misspelt name is not read as a missing figure."""
        if name not in metric_table.BY_NAME:
            raise KeyError(f"{name!r} is not a metric of suite.metric_table")
        return self.metrics.get(name)

    def measured_phrase(self) -> str:
        """How an `ok` record's median step time was measured (`interval_phrase`)."""
        return interval_phrase(self.interval) if self.n_runs > 1 else SINGLE_RUN

    @property
    def ok_runs(self) -> list[Run]:
        return [r for r in self.runs if r.ok]

    def step_times(self) -> list[float]:
        """The step time of each `ok` run, in the order measured."""
        return [r.step_time_s for r in self.ok_runs]

    # ---- making it --------------------------------------------------------------------------
    @classmethod
    def summarized(
        cls, trial_id: str, sweep: str, trial: dict, runs: list[Run], decided: tuple[str, str] | None = None
    ) -> Record:
        """A record of these runs with its summary fields (module docstring)."""
        outcome, message, summary = "ok", "", {}
        failed = [(k, r) for k, r in enumerate(runs, 1) if not r.ok]
        if decided:
            outcome, message = decided
        elif failed:
            k, run = failed[0]
            outcome, message = run.outcome, run.message
            if k > 1:  # it ran before: say so, and do not let it pass for a configuration that works
                before = ", ".join(f"{r.step_time_s:.3f}" for r in runs[: k - 1])
                what = "fits only sometimes: " if outcome == "oom" else ""
                message = f"{what}run {k} ended {outcome} after {k - 1} ok run(s) ({before} s/step): {message}"
        else:
            summary = summary_of_runs(trial, [r.metrics for r in runs])
        return cls(
            trial_id=trial_id,
            sweep=sweep,
            outcome=outcome,
            message=message,
            trial_json=trial,
            metrics=summary,
            wall_s=sum(r.wall_s for r in runs),
            provenance=runs[-1].provenance if runs else provenance(trial["hardware"]["device"]),
            runs=runs,
        )

    @classmethod
    def new(cls, t: Trial, sweep: str, outcome: str, message: str, metrics: dict, wall_s: float) -> Record:
        """A new record: one run with this outcome, or none for an outcome decided before running."""
        if outcome in DECIDED:
            return cls.summarized(t.id, sweep, t.to_json(), [], (outcome, message))
        return cls.summarized(t.id, sweep, t.to_json(), [Run.now(t, outcome, message, metrics, wall_s)])

    def with_run(self, t: Trial, sweep: str, run: Run) -> Record:
        """This record with one more run of `t`, summarised again. The trial is the latest
        asker's: its measure settings (repeats, timeout) say how the last run was asked for."""
        return Record.summarized(t.id, sweep, t.to_json(), [*self.runs, run])

    def without(self, outcomes: tuple[str, ...]) -> Record | None:
        """This record without its runs of these outcomes (to run them again), or None when no run is left."""
        if self.outcome not in outcomes:
            return self
        runs = [r for r in self.runs if r.outcome not in outcomes]
        return Record.summarized(self.trial_id, self.sweep, self.trial_json, runs) if runs else None

    # ---- its JSON ---------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in ("schema", "trial_id", "sweep", "outcome", "message")}
        out.update(trial=self.trial_json, metrics=self.metrics, wall_s=self.wall_s, provenance=self.provenance)
        out["runs"] = [r.to_json() for r in self.runs]
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Record:
        """A stored record in the current schema: a single-run one (suite.trial/1) upgraded; any
        other schema (a newer suite's) raises `UnknownSchema`, never read by guess."""
        if d.get("schema") == SINGLE_RUN_SCHEMA:
            return _upgrade(d)
        if d.get("schema") != SCHEMA:
            raise UnknownSchema(
                f"a record of schema {d.get('schema')!r}; this suite reads {' and '.join(SCHEMAS)} "
                "(written by a newer suite? update this one, or give it another store.dir)"
            )
        fields = ("trial_id", "sweep", "outcome", "message", "metrics", "wall_s", "provenance")
        return cls(
            **{k: d.get(k) for k in fields},
            trial_json=d.get("trial"),
            runs=[Run.from_json(r) for r in d.get("runs", [])],
            schema=d["schema"],
        )


def with_run(rec: Record | None, t: Trial, sweep: str, run: Run) -> Record:
    """`rec` with one more run of `t` (`Record.with_run`; from `suite.launch.run_trial`), or a new
    record of that run when there is none."""
    if rec is None:
        return Record.summarized(t.id, sweep, t.to_json(), [run])
    return rec.with_run(t, sweep, run)


def add_run(
    rec: Record | None, t: Trial, sweep: str, outcome: str, message: str, metrics: dict, wall_s: float
) -> Record:
    """`with_run` of a run of `t` that ended just now, with this machine's provenance; a new record
    of an outcome decided before running (`Record.new`) holds no run."""
    if rec is None:
        return Record.new(t, sweep, outcome, message, metrics, wall_s)
    return rec.with_run(t, sweep, Run.now(t, outcome, message, metrics, wall_s))


def _upgrade(d: dict[str, Any]) -> Record:
    """A single-run record (suite.trial/1) as a record of the current schema with that one run."""
    runs = [] if d["outcome"] in DECIDED else [Run.from_json(d)]
    decided = (d["outcome"], d.get("message", "")) if not runs else None
    out = Record.summarized(d["trial_id"], d.get("sweep", ""), d["trial"], runs, decided)
    return out if runs else replace(out, provenance=d.get("provenance"))


def summary_of_runs(trial: dict, per_run: list[dict]) -> dict[str, Any]:
    """One `ok` trial's metrics from its runs', each as `suite.metric_table` says (`over_runs`)."""
    n = len(per_run)
    times = [m["step_time_s"] for m in per_run]
    out = dict(sorted(per_run, key=lambda m: m["step_time_s"])[(n - 1) // 2])  # the median run (the lower of two)
    for k in metric_table.named(metric_table.PER_RUN):
        out.pop(k, None)
    for k in metric_table.named(metric_table.MEDIAN):
        if all(_number(m.get(k)) for m in per_run):
            out[k] = stats.median([m[k] for m in per_run])
    for k in metric_table.named(metric_table.MAX):
        if all(_number(m.get(k)) for m in per_run):
            out[k] = max(m[k] for m in per_run)
    for k in metric_table.named(metric_table.ANY):
        out[k] = any(m.get(k) for m in per_run)
    iv = stats.median_interval(times)
    within = [m.get("step_time_std_s") for m in per_run]
    out.update(  # the table's OF_RUNS
        step_time_ci_lo_s=iv.lo,
        step_time_ci_hi_s=iv.hi,
        step_time_ci_level=iv.level,
        runs=n,
        step_time_between_std_s=stats.between_std(times),
        step_time_within_std_s=stats.pooled_std(within) if all(_number(w) for w in within) else None,
    )
    if n > 1:  # the table's AT_MEDIAN (a single run's are its own)
        t = Trial.from_json(trial)
        out.update(
            trial_metrics.rates(t, out["step_time_s"], out["model_flops_per_token"], out["hardware_flops_per_token"])
        )
    return out


def interval_phrase(iv: stats.Interval) -> str:
    """How a median step time was measured, as every command and report says it: "median of 3
    runs; 75.0% interval 1.000-1.050 s", or "a single run: no interval"."""
    if iv.n == 1:
        return SINGLE_RUN
    return f"median of {iv.n} runs; {iv.level:.1%} interval {iv.lo:.3f}-{iv.hi:.3f} s"


def _number(x: Any) -> bool:
    return isinstance(x, (int, float))


def _version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def _run(cmd: list[str], cwd: str | None = None) -> str | None:
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


@cache
def _static_provenance() -> dict[str, Any]:
    repo = str(paths.CHECKOUT) if paths.CHECKOUT else None
    rev = _run(["git", "rev-parse", "HEAD"], cwd=repo) if repo else None
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo) if rev else None
    return {
        "python": platform.python_version(),
        "versions": {p: _version(p) for p in PACKAGES},
        "git_revision": rev,
        "git_dirty": bool(dirty) if rev else None,
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
    }


@cache
def _cuda_provenance() -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        return {"cuda": None, "driver": None, "devices": []}
    driver = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    return {
        "cuda": torch.version.cuda,
        "driver": driver.splitlines()[0] if driver else None,
        "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
    }


def provenance(device: str) -> dict[str, Any]:
    """Where and with what a run is measured now: versions, git revision, host, devices, date."""
    p = dict(_static_provenance())
    p["date"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    p.update(_cuda_provenance() if device == "cuda" else {"cuda": None, "driver": None, "devices": ["cpu"]})
    return p
