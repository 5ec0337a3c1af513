"""Every trial result file under a path into one pandas frame with a checked schema.

A file that is not JSON, not a trial record (schema `suite.trial/2`, or `suite.trial/1`
for records of one run made before repeats, read as single runs), or whose trial, runs or
metrics do not check out is skipped with a message naming it; it never stops the load.
The same trial stored twice (a copied file) is kept once, the later record.

One row per trial record. Columns (units in the names; NaN where a value does not apply,
e.g. every metric of a trial that did not run `ok`):

    file, trial_id, sweep, outcome, message, date, git_revision
    model, model_type, task, hardware, device, gpu_name, mem_budget_gib
    budget, n_nodes, gpus_per_node, n_gpus        (hardware x nodes; n_gpus counts every device of the trial)
    global_batch, unit, tokens_per_sample, train_steps, precision, recipe  (the recipe measured; a "token"
                                                                           is the task's unit: token or image)
    original_gpus, original_days                                           (the model's original run)
    engine, sharding, zero_stage, reshard_after_forward, offload, recompute, micro_batch, gas,
    attention, compile, config, memory_methods
    kernel_path                                    (which fused kernels ran, where a model has them: Mamba)
    step_time_s, step_time_ci_lo_s, step_time_ci_hi_s, step_time_ci_level, runs,   (measured, `ok` only)
    step_time_between_std_s, step_time_within_std_s, noisy, extrapolated, gas_measured,
    tokens_per_step, tokens_per_s, tokens_per_s_per_device, model_flops_per_token,
    mfu, hfu, peak_mem_gib, peak_reserved_gib, n_params
    trial                                                                  (the record's trial dict)

`step_time_s` is the median of the trial's `runs`, each in fresh processes; its interval
[step_time_ci_lo_s, step_time_ci_hi_s] covers the median with probability
`step_time_ci_level` (suite/stats.py; NaN for a single run, which has no interval and whose
lo and hi are its own time). `step_time_between_std_s` is the spread between runs (NaN for
one run); `step_time_within_std_s` the spread of the timed steps inside a run. Throughput,
MFU and memory are those of the record's summary (suite/record.py).

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
from pathlib import Path
from typing import Any

import pandas as pd

from analysis import ReportError
from suite.config import Trial
from suite.labels import budget_label, config_label, memory_methods_label, recipe_label, sharding_label
from suite.models.arch import attention
from suite.record import OUTCOMES, SCHEMAS, Record

NOT_RESULTS = {"wandb", "multirun", "logs", ".claims"}
OTHER_SCHEMAS = {"suite.search/1", "suite.search/2", "suite.benchmark/1"}  # search logs, benchmark summaries
# Metrics an `ok` record must carry as numbers for any estimate to be made from it.
REQUIRED_METRICS = ("step_time_s", "tokens_per_step", "tokens_per_s", "model_flops_per_token", "peak_mem_gib", "gas")
# The summary of an `ok` record's runs must carry these too (suite/record.py).
INTERVAL_METRICS = ("step_time_ci_lo_s", "step_time_ci_hi_s", "step_time_ci_level", "runs")
FLOAT_METRICS = (
    "step_time_s",
    "step_time_ci_lo_s",
    "step_time_ci_hi_s",
    "step_time_ci_level",
    "step_time_between_std_s",
    "step_time_within_std_s",
    "tokens_per_step",
    "tokens_per_s",
    "tokens_per_s_per_device",
    "model_flops_per_token",
    "mfu",
    "hfu",
    "peak_mem_gib",
    "peak_reserved_gib",
)
OTHER_METRICS = ("runs", "noisy", "extrapolated", "gas_measured", "n_params")


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
        t = Trial.from_dict(rec["trial"])
    except (KeyError, TypeError) as e:
        raise Malformed(f"its trial does not match suite.config.Trial ({e})") from e
    wrong = type_problems(t, "trial.")
    if wrong:
        raise Malformed("; ".join(wrong))
    m = rec["metrics"] if isinstance(rec["metrics"], dict) else {}
    if rec["outcome"] == "ok":
        bad = [k for k in REQUIRED_METRICS if not _number(m, k)]
        if bad:
            raise Malformed(f"an ok record without numeric metrics {', '.join(bad)}")
        if m["step_time_s"] <= 0:
            raise Malformed(f"step_time_s={m['step_time_s']} is not positive")
    runs = rec.get("runs", [])
    if not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs):
        raise Malformed("its runs are not a list of runs")
    record = Record.from_json(rec)
    _check_runs(record)
    bad = [k for k in FLOAT_METRICS if record.metrics.get(k) is not None and not _number(record.metrics, k)]
    if bad:
        raise Malformed(f"metrics {', '.join(bad)} are not numbers")
    return record, t


def row(rec: Any, file: Path) -> dict[str, Any]:
    """One frame row from one stored record; raises Malformed saying what is wrong."""
    record, t = checked(rec)
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
        "config": config_label(t, gas, m.get("kernel_path")),
        "memory_methods": memory_methods_label(t),
        "kernel_path": m.get("kernel_path"),
    }
    out.update({k: m.get(k) for k in FLOAT_METRICS + OTHER_METRICS})
    if out["runs"] == 1:
        out["step_time_ci_level"] = None  # one run has no interval (stats.median_interval: coverage 0)
    out["trial"] = record.trial
    return out


def load_results(path: str | Path) -> tuple[pd.DataFrame, list[str]]:
    """All trial records under `path` (a folder, searched recursively, or one file).

    Returns the frame and one message per file skipped.
    """
    root = Path(path)
    if not root.exists():
        raise ReportError(f"{root} does not exist; give a results folder such as results/runs")
    # The suite's own non-trial files (W&B runs, Hydra sweeps, worker logs) are not results.
    files = (
        sorted(f for f in root.rglob("*.json") if not NOT_RESULTS & set(f.relative_to(root).parts[:-1]))
        if root.is_dir()
        else [root]
    )
    rows, skipped = [], []
    for f in files:
        try:
            with open(f) as fh:
                rec = json.load(fh)
            if isinstance(rec, dict) and rec.get("schema") in OTHER_SCHEMAS:
                continue
            rows.append(row(rec, f))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            skipped.append(f"skipped {f}: not readable JSON ({e})")
        except Malformed as e:
            skipped.append(f"skipped {f}: {e}")
    df = pd.DataFrame(rows)
    if df.empty:
        return df, skipped
    df[list(FLOAT_METRICS)] = df[list(FLOAT_METRICS)].astype(float)
    df["gas"] = df["gas"].astype("Int64")
    df["runs"] = df["runs"].astype("Int64")
    df = df.sort_values(["date", "file"], na_position="first", kind="stable")
    dup = df.duplicated("trial_id", keep="last")
    kept = df.drop_duplicates("trial_id", keep="last").set_index("trial_id")["file"]
    for _, r in df[dup].iterrows():
        skipped.append(f"skipped {r['file']}: the same trial as {kept[r['trial_id']]}, which is newer")
    return df[~dup].reset_index(drop=True), skipped
