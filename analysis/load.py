"""The one reader of a results folder: every trial record under a path, read once, checked, and
the pandas frame the reports start from.

`read_results(path)` gives `Results`: the records (`Record`, each with its `Trial` and file) and
their frame; a command reads its folder once and passes the `Results` on (tables, figures, the
leaderboard, accuracy). A file that is not JSON, not a trial record (schema `suite.trial/2`, or
`suite.trial/1` for records of one run made before repeats, read as single runs), or whose trial
or runs do not check out is skipped with a message naming it; it never stops the load. Search
logs, benchmark summaries and the suite's own folders (W&B runs, Hydra sweeps, worker logs,
claims) are not results and are passed over. The same trial stored twice (a copied file) is kept
once, the later record. An `ok` record without the metrics the estimates need, as numbers
(`suite.metric_table.REQUIRED`), stays a record but is left out of the frame, with a message.

One frame row per record. Columns (units in the names; NaN where a value does not apply,
e.g. every metric of a trial that did not run `ok`):

    file, trial_id, sweep, outcome, message, date, git_revision
    model, model_type, task, hardware, device, gpu_name, mem_budget_gib
    budget, n_nodes, gpus_per_node, n_gpus        (hardware x nodes; n_gpus counts every device of the trial)
    global_batch, unit, tokens_per_sample, train_steps, precision, recipe  (the recipe measured; a "token"
                                                                           is the task's unit: token or image)
    original_gpus, original_days                                           (the model's original run)
    engine, sharding, zero_stage, reshard_after_forward, offload, recompute, micro_batch, gas,
    attention, compile, config, memory_methods
    the metrics of `suite.metric_table` marked `frame` (`FRAME`: the median step time, its
    interval, runs and spreads, throughput, MFU, peak memory, ...), typed as the table says
    (float; Int64 for a whole number); `gas` is the recipe's for a trial that did not run
    trial                                                                  (the record's trial dict)

`step_time_ci_level` is NaN for a single run, which has no interval (its lo and hi are its own
time). Each metric means what the table says (docs/results-format.md).

`sharding` labels the engine and its sharding (one of suite.labels.SHARDINGS); `memory_methods` the
sharding, offload and recomputation alone ("ZeRO-1 recompute", "DDP"); `config` is a short label of
the methods as they ran ("ZeRO-1 recompute mb 8x2 sdpa fp32", "FSDP2 full_shard mb 4x4 sdpa
bf16", with the kernel path where a model has one); `recipe` labels what was measured ("batch
16 x 128 tokens, 143,000 steps, fp32"; "batch 4096 images of 224x224, ..."), since a step time
is only comparable between trials of the same recipe. `attention` and `precision` are what ran
(`suite.config.Trial`): `none` for a model without attention, fp32 for a `recipe` run on CPU.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import typing
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from analysis import ReportError
from suite import metric_table
from suite.config import Trial
from suite.labels import budget_label, config_label, memory_methods_label, recipe_label, sharding_label
from suite.models.arch import attention
from suite.record import OUTCOMES, SCHEMAS, Record

NOT_RESULTS = {"wandb", "multirun", "logs", ".claims"}
OTHER_SCHEMAS = {"suite.search/1", "suite.search/2", "suite.benchmark/1"}  # search logs, benchmark summaries
# The summary of an `ok` record's runs always carries these (suite/record.py).
INTERVAL_METRICS = tuple(m.name for m in metric_table.TABLE if m.over_runs == metric_table.OF_RUNS and not m.optional)
NUMERIC_FRAME = tuple(m for m in metric_table.TABLE if m.frame and m.numeric)


class Malformed(ValueError):
    pass


def _is(value: Any, kind: Any) -> bool:
    """Whether `value` fits a config field of type `kind` (suite/config/schema.py); a `Literal`
    field takes a value of its choices' type (whether it is one of them is `validate`'s question)."""
    if typing.get_origin(kind) is typing.Literal:
        kind = type(typing.get_args(kind)[0])
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind in (int, float):
        return number and (kind is float or isinstance(value, int))
    if kind == list[float]:
        return isinstance(value, list) and all(_is(v, float) for v in value)
    if kind == dict[str, float]:
        return isinstance(value, dict) and all(_is(v, float) for v in value.values())
    return isinstance(value, kind if kind in (str, bool) else object) and value != "???"


def _name(kind: Any) -> str:
    return kind.__name__ if isinstance(kind, type) else str(kind).replace("typing.", "")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)  # resolved once per class: a load checks thousands of records


def type_problems(config: Any, prefix: str = "") -> list[str]:
    """Fields of a (nested) config dataclass whose value is missing or of the wrong type."""
    problems = []
    hints = _hints(type(config))
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            problems += type_problems(value, f"{prefix}{f.name}.")
        elif not _is(value, hints[f.name]):
            problems.append(f"{prefix}{f.name}={value!r} is not {_name(hints[f.name])}")
    return problems


def _recipe_gas(t: Trial) -> int | None:
    """The recipe's accumulation steps, or None where the batch does not split evenly (an invalid trial)."""
    n, mb = t.devices, t.methods.micro_batch
    if n > 0 and mb > 0 and t.model.recipe.global_batch % n == 0 and t.per_device_batch % mb == 0:
        return t.gas
    return None


def _number(metrics: dict, key: str) -> bool:
    v = metrics.get(key)
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _check_runs(rec: Record) -> None:
    for k, r in enumerate(rec.runs, 1):
        if r.outcome not in OUTCOMES or not isinstance(r.metrics, dict):
            raise Malformed(f"run {k} has no known outcome or no metrics")
        if r.ok and not _number(r.metrics, "step_time_s"):
            raise Malformed(f"run {k} is ok without a numeric step_time_s")
    if rec.ok:
        m = rec.metrics
        bad = [k for k in INTERVAL_METRICS if not _number(m, k)]
        if bad:
            raise Malformed(f"an ok record without numeric metrics {', '.join(bad)}")
        if m["runs"] != len(rec.runs) or any(not r.ok for r in rec.runs):
            raise Malformed(f"an ok record of {m['runs']} runs holds {len(rec.runs)} runs, not all ok")


def checked(rec: Any) -> tuple[Record, Trial]:
    """A stored record as a `Record` (an older schema upgraded) and its `Trial`; raises Malformed
    saying what is wrong."""
    if not isinstance(rec, dict) or rec.get("schema") not in SCHEMAS:
        found = rec.get("schema") if isinstance(rec, dict) else type(rec).__name__
        raise Malformed(f"not a trial record of schema {' or '.join(SCHEMAS)} (found {found!r})")
    missing = [k for k in ("trial_id", "outcome", "trial", "metrics", "wall_s") if k not in rec]
    if missing:
        raise Malformed(f"missing {', '.join(missing)}")
    if rec["outcome"] not in OUTCOMES:
        raise Malformed(f"outcome {rec['outcome']!r} is not one of {', '.join(OUTCOMES)}")
    try:
        t = Trial.from_json(rec["trial"])
    except (KeyError, TypeError) as e:
        raise Malformed(f"its trial does not match suite.config.Trial ({e})") from e
    wrong = type_problems(t, "trial.")
    if wrong:
        raise Malformed("; ".join(wrong))
    m = rec["metrics"] if isinstance(rec["metrics"], dict) else {}
    if rec["outcome"] == "ok":
        if not _number(m, "step_time_s"):
            raise Malformed("an ok record without numeric metrics step_time_s")
        if m["step_time_s"] <= 0:
            raise Malformed(f"step_time_s={m['step_time_s']} is not positive")
    runs = rec.get("runs", [])
    if not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs):
        raise Malformed("its runs are not a list of runs")
    record = Record.from_json(rec)
    _check_runs(record)
    return record, t


def frame_problem(record: Record) -> str | None:
    """Why a record cannot be a row of the frame, or None: an `ok` record needs the metrics the
    estimates are made from as numbers, and every numeric metric of the frame must be one."""
    m = record.metrics
    if record.ok:
        bad = [k for k in metric_table.REQUIRED if not _number(m, k)]
        if bad:
            return f"an ok record without numeric metrics {', '.join(bad)}"
    bad = [
        x.name
        for x in NUMERIC_FRAME
        if m.get(x.name) is not None
        and not (_number(m, x.name) and (x.type == "float" or float(m[x.name]).is_integer()))
    ]
    return f"metrics {', '.join(bad)} are not numbers of their type (suite.metric_table)" if bad else None


@dataclass(frozen=True)
class Stored:
    """One trial record as read from its file."""

    record: Record
    trial: Trial
    file: Path

    @property
    def date(self) -> str | None:
        return (self.record.provenance or {}).get("date")


def row(rec: Any, file: Path) -> dict[str, Any]:
    """One frame row from one stored record's JSON; raises Malformed saying what is wrong."""
    stored = Stored(*checked(rec), Path(file))
    problem = frame_problem(stored.record)
    if problem:
        raise Malformed(problem)
    return _row(stored)


def _row(stored: Stored) -> dict[str, Any]:
    """One frame row of a record that can be one (`frame_problem`)."""
    record, t, file = stored.record, stored.trial, stored.file
    m, r, hw, me = record.metrics, t.model.recipe, t.hardware, t.methods
    gas = m.get("gas", _recipe_gas(t))
    prov = record.provenance or {}
    out: dict[str, Any] = {
        "file": str(file),
        "trial_id": record.trial_id,
        "sweep": record.sweep or "",
        "outcome": record.outcome,
        "message": record.message or "",
        "date": prov.get("date"),
        "git_revision": prov.get("git_revision"),
        "model": t.model.name,
        "model_type": t.model.model_type,
        "task": t.model.task,
        "hardware": hw.name,
        "device": hw.device,
        "gpu_name": hw.gpu,
        "budget": budget_label(t),
        "n_nodes": t.nodes,
        "gpus_per_node": hw.count,
        "n_gpus": t.devices,
        "mem_budget_gib": hw.mem_gib,
        "global_batch": r.global_batch,
        "unit": t.unit,
        "tokens_per_sample": t.tokens_per_sample,
        "train_steps": r.train_steps,
        "precision": t.precision,
        "recipe": recipe_label(t),
        "original_gpus": r.original_gpus,
        "original_days": r.original_days,
        "engine": me.engine,
        "sharding": sharding_label(t),
        "zero_stage": me.zero_stage,
        "reshard_after_forward": me.reshard_after_forward,
        "offload": me.offload,
        "recompute": me.recompute,
        "micro_batch": me.micro_batch,
        "gas": gas,
        "attention": attention(t),
        "compile": me.compile,
        "config": config_label(t, gas, record.figure("kernel_path")),
        "memory_methods": memory_methods_label(t),
    }
    out.update({k: m.get(k) for k in metric_table.FRAME})
    out["gas"] = gas  # the record's, or the recipe's for a trial that did not run
    if out["runs"] == 1:
        out["step_time_ci_level"] = None  # one run has no interval (stats.median_interval: coverage 0)
    out["trial"] = record.trial_json
    return out


def frame(stored: list[Stored]) -> pd.DataFrame:
    """The frame of these records (each one that can be a row), its metric columns typed by the table."""
    df = pd.DataFrame([_row(s) for s in stored])
    if df.empty:
        return df
    for x in NUMERIC_FRAME:
        df[x.name] = df[x.name].astype(float if x.type == "float" else "Int64")
    return df


@dataclass(frozen=True, eq=False)
class Results:
    """Every trial record under a path, read once (`read_results`), and its frame."""

    path: Path
    stored: tuple[Stored, ...]
    """Each trial's record once (the later of copies), oldest first."""
    frame: pd.DataFrame
    """One row per record that can be one (module docstring), in the same order."""
    skipped: tuple[str, ...]
    """Files that hold no record read here, and copies of a newer record: each with why."""
    left_out: tuple[str, ...]
    """Records left out of the frame, with why (`frame_problem`)."""

    @property
    def messages(self) -> list[str]:
        """What a report of the frame says it skipped: `skipped` and `left_out`."""
        return [*self.skipped, *self.left_out]

    def records(self, outcomes: Collection[str] | None = None) -> list[Record]:
        """The records, oldest first; only those of `outcomes` when given."""
        return [s.record for s in self.stored if outcomes is None or s.record.outcome in outcomes]

    def record(self, trial_id: str) -> Record:
        return self._by_id[trial_id].record

    @functools.cached_property
    def _by_id(self) -> dict[str, Stored]:
        return {s.record.trial_id: s for s in self.stored}


def _files(root: Path) -> list[Path]:
    if not root.is_dir():
        return [root]
    # The suite's own non-trial files (W&B runs, Hydra sweeps, worker logs, claims) are not results.
    return sorted(f for f in root.rglob("*.json") if not NOT_RESULTS & set(f.relative_to(root).parts[:-1]))


def _read(f: Path) -> Stored | None:
    """The record in `f`; None for a file of another kind the suite writes; Malformed or OSError otherwise."""
    with open(f) as fh:
        rec = json.load(fh)
    if isinstance(rec, dict) and rec.get("schema") in OTHER_SCHEMAS:
        return None
    return Stored(*checked(rec), f)


def read_results(path: str | Path) -> Results:
    """Every trial record under `path` (a folder, searched recursively, or one file): the one
    reader of results; ReportError when the path does not exist."""
    root = Path(path)
    if not root.exists():
        raise ReportError(f"{root} does not exist; give a results folder such as results/runs")
    found, skipped = [], []
    for f in _files(root):
        try:
            s = _read(f)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            skipped.append(f"skipped {f}: not readable JSON ({e})")
        except Malformed as e:
            skipped.append(f"skipped {f}: {e}")
        else:
            if s is not None:
                found.append(s)
    found.sort(key=lambda s: (s.date is not None, s.date or "", str(s.file)))
    latest = {s.record.trial_id: s for s in found}
    skipped += [
        f"skipped {s.file}: the same trial as {latest[s.record.trial_id].file}, which is newer"
        for s in found
        if latest[s.record.trial_id] is not s
    ]
    stored = [s for s in found if latest[s.record.trial_id] is s]
    rows, left_out = [], []
    for s in stored:
        problem = frame_problem(s.record)
        if problem:
            left_out.append(f"skipped {s.file}: {problem}")
        else:
            rows.append(s)
    return Results(root, tuple(stored), frame(rows), tuple(skipped), tuple(left_out))


def load_results(path: str | Path) -> tuple[pd.DataFrame, list[str]]:
    """The frame of every trial record under `path` (`read_results`) and one message per file skipped."""
    results = read_results(path)
    return results.frame, results.messages
