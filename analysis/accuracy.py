"""Predicted against measured: how far `suite.predict` is from every stored ok or oom trial.

    suite-report accuracy results/runs                    # the table, and accuracy.json written
    suite-report accuracy results/runs --publish          # also results/accuracy/<device>.json

Each record is predicted from its own resolved trial (so a model that is not in `conf/`
works), with the calibration of the machine that ran it (`provenance.hostname`; this
machine's if that one is not here). Per record:

    peak_mem_err_pct     (predicted - measured) / measured * 100 of the worker's peak_mem_gib:
                         the timed window's peak where the record has a build peak of its own
                         (build_peak_mem_gib), else the peak of the whole run
    step_time_err_pct    the same of step_time_s, and of its parts micro_time_s,
                         boundary_time_s, optimizer_time_s (t_micro, t_boundary, t_optimizer)
    fit_right            the predicted fit against the outcome (ok or oom), for records with a
                         memory budget (a CPU worker without one always fits); the summary counts
                         it each way apart (`suite.predict.regimes.fit_counts`): ok records predicted
                         not to fit, OOM records predicted to fit
    regime               on a GPU, the record's regime (`suite.predict.regimes.regime`): the summary's
                         `by_regime` is what the error label of every GPU prediction reads first
    speed_ratio          the run's speed probe over the calibration's (`suite.metrics.
                         speed_probe`): 1 when the machine ran as fast as when it was
                         calibrated; a shared machine drifts
    step_time_at_speed_err_pct  the step-time error with the prediction divided by that
                         ratio: the model's error with the machine's drift taken out, an
                         assumption (time inversely proportional to the probe's speed) shown
                         beside the plain error, never instead of it

and the trial's regime, which per-regime error labels group by: `gpu` (device name), `gpus`,
`engine`, `zero_stage`, `sharding`, `offload`, `recompute`, `model_params`, `memory_gib` (what
it had to fit in) and `capped` (a GPU's memory cap, `suite.detect.memory_cap_gib`);

and per (model, budget) with three or more ok records, the Spearman rank correlation of
predicted and measured step times; where every one of those records holds two or more runs,
also that of its first run's step times against its second's (`repeat_spearman`): how well
the measurement ranks the configurations against itself, the most a prediction scored against
one run can expect (results/benchmarks/README.md gives it for the CPU benchmark).
The summary gives median, p90 and max of |error| per quantity, overall, per method (engine, ZeRO
stage, offload) and per engine (`per_engine`: its sharding label); fit/OOM called each way apart
(false "fits" on OOMs, false "does not fit" on runs that ran) and the memory error per memory a
trial had (`per_memory`: "24 GiB capped", "140 GiB"); on GPUs per regime and each of its relaxed
levels (`by_regime`); and each record's regime and errors (`trials`), which the published summary
carries. Records whose hardware
has no constants here (a CPU never calibrated) are listed as not predicted, with the reason.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from analysis import ReportError
from analysis.load import Results, read_results
from suite import paths
from suite.config import Trial
from suite.detect import memory_cap_gib
from suite.files import write_json
from suite.labels import budget_label, sharding_label
from suite.predict import Predictor, regimes
from suite.predict.machine import NotCalibrated
from suite.record import Record

PARTS = (("micro_time_s", "t_micro_s"), ("boundary_time_s", "t_boundary_s"), ("optimizer_time_s", "t_optimizer_s"))
QUANTITIES = (
    "peak_mem_err_pct",
    "build_peak_err_pct",
    "step_time_err_pct",
    "micro_err_pct",
    "boundary_err_pct",
    "optimizer_err_pct",
    "step_time_at_speed_err_pct",
    "speed_ratio",
)


SCORED = ("ok", "oom")


def scorable(results: Results) -> list[tuple[Record, str]]:
    """Every ok or oom trial record of `results` (`analysis.load.read_results`) with its file."""
    return [(s.record, str(s.file)) for s in results.stored if s.record.outcome in SCORED]


def method_label(t: Trial) -> str:
    label = sharding_label(t)
    return label + (f" offload {t.methods.offload}" if t.methods.offload != "none" else "")


def _err(pred: float | None, meas: float | None) -> float:
    if pred is None or meas is None or not meas or math.isnan(pred):
        return math.nan
    return (pred - meas) / meas * 100


def score(recs: list[tuple[Record, str]], predictor_for=None) -> pd.DataFrame:
    """One row per (record, file): measured, predicted, errors; `predictor_for(host)` gives a Predictor."""

    predictors: dict[str, Any] = {}
    make = predictor_for or (lambda host: Predictor(host=host))
    rows = []
    for rec, file in recs:
        t = rec.trial
        host = (rec.provenance or {}).get("hostname")
        if host not in predictors:
            predictors[host] = make(host)
        pred = predictors[host]
        row: dict[str, Any] = {
            "trial_id": rec.trial_id,
            "file": file,
            "model": t.model.name,
            "device": t.hardware.device,
            "budget": budget_label(t),
            "mem_budget_gib": t.hardware.mem_gib,
            "method": method_label(t),
            "recompute": t.methods.recompute,
            "micro_batch": t.methods.micro_batch,
            "outcome": rec.outcome,
            "note": "",
            **regime(t, (rec.metrics or {}).get("n_params")),
        }
        try:
            p = pred.predict(t)
        except NotCalibrated as e:
            row["note"] = f"not predicted: {e}"
            rows.append(row)
            continue
        row["model_params"] = row["model_params"] or p.n_params or None
        timed_only = "build_peak_mem_gib" in rec.metrics
        row["pred_peak_mem_gib"] = p.peak_mem_gib if timed_only else max(p.peak_mem_gib, p.build_peak_mem_gib)
        row["pred_build_peak_gib"] = p.build_peak_mem_gib
        row["pred_device_gib"] = p.device_gib
        row["pred_fits"] = p.fits
        row["pred_step_time_s"] = p.step_time_s
        if rec.ok:
            measured = {k: rec.figure(k) for k in ("peak_mem_gib", "build_peak_mem_gib", "step_time_s")}
            row["run_step_times_s"] = rec.step_times()
            row.update(measured)
            row["peak_mem_err_pct"] = _err(row["pred_peak_mem_gib"], measured["peak_mem_gib"])
            row["build_peak_err_pct"] = _err(p.build_peak_mem_gib, measured["build_peak_mem_gib"])
            row["step_time_err_pct"] = _err(p.step_time_s, measured["step_time_s"])
            for (part, predicted), name in zip(PARTS, ("micro", "boundary", "optimizer"), strict=True):
                row[f"{name}_err_pct"] = _err(getattr(p, predicted), rec.figure(part))
            calibrated, probe = pred.machine(t).probe_flops, rec.figure("probe_flops")
            if calibrated and probe:
                row["speed_ratio"] = probe / calibrated
                row["step_time_at_speed_err_pct"] = _err(p.step_time_s / row["speed_ratio"], measured["step_time_s"])
        if t.hardware.mem_gib > 0:
            row["fit_right"] = p.fits == rec.ok
        if t.hardware.device == "cuda":  # what the error labels read (`by_regime`)
            row["regime"] = regimes.regime(t, row["model_params"] or regimes.n_params_of(t)).key
        rows.append(row)
    return pd.DataFrame(rows)


def regime(t: Trial, n_params: int | None) -> dict[str, Any]:
    """What a trial's error depends on, as per-regime labels group it (GPU class, engine, GPU count,
    model size): its device, engine and sharding, offload and recomputation, parameters, memory."""
    cap = memory_cap_gib(t.hardware)
    return {
        "gpu": t.hardware.gpu or t.hardware.device,
        "gpus": t.devices,
        "engine": t.methods.engine,
        "zero_stage": t.methods.zero_stage if t.methods.engine == "deepspeed" else None,
        "sharding": sharding_label(t),
        "offload": t.methods.offload,
        "model_params": n_params,
        "memory_gib": t.hardware.mem_gib or None,
        "capped": cap is not None,
    }


TRIAL_FIELDS = (
    *("trial_id", "model", "budget", "gpu", "gpus", "engine", "zero_stage", "sharding", "offload", "recompute"),
    *("micro_batch", "model_params", "memory_gib", "capped", "outcome", "pred_fits", "fit_right"),
    *("peak_mem_err_pct", "step_time_err_pct"),
)
"""What the published summary carries of each record (`trials`): its regime and its errors."""


def memory_label(memory_gib: float | None, capped: bool) -> str:
    """A memory a trial had to fit in: "24 GiB capped", "140 GiB", or "no budget"."""
    if not memory_gib or memory_gib != memory_gib:  # None or NaN: a CPU worker without a budget
        return "no budget"
    return f"{memory_gib:g} GiB" + (" capped" if capped else "")


def _fit(df: pd.DataFrame) -> dict[str, Any]:
    """Fit/OOM called right, and wrong each way apart (`fit`: `regimes.fit_counts`), over the records
    with a memory budget."""
    judged = df[df["fit_right"].notna()] if "fit_right" in df else df[:0]
    fits = judged["fit_right"] if len(judged) else pd.Series(dtype=object)
    return {
        "fit_right_pct": float(100 * fits.astype(bool).mean()) if len(fits) else None,
        "fit_n": int(len(fits)),
        "fit": regimes.fit_counts(
            [bool(x) for x in judged.get("pred_fits", [])], [o == "ok" for o in judged.get("outcome", [])]
        ),
    }


def _fit_text(m: dict[str, Any]) -> str:
    """Fit called wrong each way apart, as a summary's `fit` counts it."""
    f = m["fit"]
    wrong_fit, wrong_no = f"{f['false_fit']} of {f['oom']} OOMs", f"{f['false_no_fit']} of {f['ran']} that ran"
    return f'false "fits" {wrong_fit}, false "does not fit" {wrong_no}'


def _stats(values: pd.Series) -> dict[str, float]:
    v = values.dropna().abs()
    if v.empty:
        return {"n": 0}
    return {"n": int(v.size), "median": float(v.median()), "p90": float(v.quantile(0.9)), "max": float(v.max())}


def _rank_corr(a: pd.Series, b: pd.Series) -> float:
    return float(a.rank().corr(b.rank()))


def spearman(df: pd.DataFrame) -> list[dict]:
    """Rank correlation of predicted and measured step times within each (model, budget), and
    of the measurement's first run against its second where every record has two."""
    out = []
    ok = df[df["outcome"] == "ok"].dropna(subset=["step_time_s", "pred_step_time_s"]) if "step_time_s" in df else df[:0]
    for (model, budget), g in ok.groupby(["model", "budget"]):
        if len(g) >= 3:
            repeat = None
            runs = g.get("run_step_times_s")
            if runs is not None and all(isinstance(r, list) and len(r) >= 2 for r in runs):
                repeat = _rank_corr(runs.map(lambda r: r[0]), runs.map(lambda r: r[1]))
            rho = _rank_corr(g["pred_step_time_s"], g["step_time_s"])
            out.append({"model": model, "budget": budget, "n": len(g), "spearman": rho, "repeat_spearman": repeat})
    return out


def summary(df: pd.DataFrame) -> dict[str, Any]:
    out: dict[str, Any] = {"n_records": len(df)}
    for q in QUANTITIES:
        if q in df:
            out[q] = _stats(df[q])
    if "fit_right" in df:
        out.update(_fit(df))
    if "regime" in df and df["regime"].notna().any():
        out["by_regime"] = by_regime(df[df["regime"].notna()])
    out["per_method"] = {method: {q: _stats(g[q]) for q in QUANTITIES if q in g} for method, g in df.groupby("method")}
    errors = [q for q in ("step_time_err_pct", "peak_mem_err_pct") if q in df]
    if {"sharding", "memory_gib", "capped"} <= set(df):  # scored with each trial's regime (`score`)
        out["per_engine"] = {engine: {q: _stats(g[q]) for q in errors} for engine, g in df.groupby("sharding")}
        memory = [memory_label(gib, capped) for gib, capped in zip(df["memory_gib"], df["capped"], strict=True)]
        out["per_memory"] = {
            label: {**_fit(g), **{q: _stats(g[q]) for q in errors if q == "peak_mem_err_pct"}}
            for label, g in df.groupby(memory)
        }
    out["spearman"] = spearman(df)
    rhos = [s["spearman"] for s in out["spearman"] if not math.isnan(s["spearman"])]
    out["spearman_min"] = min(rhos) if rhos else None
    out["not_predicted"] = [f"{r.trial_id}: {r.note}" for r in df.itertuples() if r.note]
    kept = df.reindex(columns=list(TRIAL_FIELDS)).astype(object)
    out["trials"] = kept.where(kept.notna(), None).to_dict("records")  # NaN is not JSON
    return out


def by_regime(df: pd.DataFrame) -> dict[str, dict]:
    """Per regime and each of its relaxed levels (`regimes.Regime.levels`): what the error label of
    a GPU prediction reads (`suite.predict.regimes`). A GPU record's memory figure is
    max_memory_allocated's."""
    levels = {key: [x.key for x in regimes.Regime.from_key(key).levels()] for key in set(df["regime"])}
    out: dict[str, dict] = {}
    for key in sorted({k for ks in levels.values() for k in ks}):
        g = df[df["regime"].map(lambda r, key=key: key in levels[r])]
        entry: dict[str, Any] = {"regime": regimes.Regime.from_key(key).text, "n": len(g)}
        if "step_time_err_pct" in g:
            entry["step_time_err_pct"] = _stats(g["step_time_err_pct"])
        if "peak_mem_err_pct" in g:
            entry["memory_err_pct_by_kind"] = {"allocated": _stats(g["peak_mem_err_pct"])}
        entry["fit"] = _fit(g)["fit"]
        out[key] = entry
    return out


def as_text(s: dict[str, Any], kind: str) -> str:
    lines = [f"Prediction accuracy on {s['n_records']} {kind} record(s) (|error| %: median, p90, max):"]
    names = {
        "peak_mem_err_pct": "peak memory",
        "build_peak_err_pct": "build peak memory",
        "step_time_err_pct": "step time",
        "micro_err_pct": "  t_micro",
        "boundary_err_pct": "  t_boundary",
        "optimizer_err_pct": "  t_optimizer",
        "step_time_at_speed_err_pct": "step time at the calibration's machine speed (probe-scaled)",
    }

    def fmt(st: dict) -> str:
        return "n/a" if not st.get("n") else f"{st['median']:.1f} / {st['p90']:.1f} / {st['max']:.1f} (n={st['n']})"

    for q, name in names.items():
        if q in s:
            lines.append(f"  {name:<18} {fmt(s[q])}")
    if (r := s.get("speed_ratio") or {}).get("n"):
        lines.append(
            f"  machine speed over its calibration's (speed probe): median {r['median']:.2f}, "
            f"p90 {r['p90']:.2f}, max {r['max']:.2f} (n={r['n']})"
        )
    if s.get("fit_n"):
        f = s["fit"]
        lines.append(
            f'  fit                false "fits": {f["false_fit"]} of {f["oom"]} OOM trials; false "does not fit": '
            f"{f['false_no_fit']} of {f['ran']} trials that ran ({s['fit_right_pct']:.1f}% of {s['fit_n']} "
            "trials with a memory budget right)"
        )
    for method, qs in s["per_method"].items():
        lines.append(
            f"  {method}: memory {fmt(qs.get('peak_mem_err_pct', {}))}; step {fmt(qs.get('step_time_err_pct', {}))}"
        )
    for memory, m in s.get("per_memory", {}).items():
        if m["fit_n"]:
            lines.append(f"  within {memory}: {_fit_text(m)}; memory {fmt(m.get('peak_mem_err_pct', {}))}")
    for key, e in (s.get("by_regime") or {}).items():
        if "*" in key:  # the relaxed levels: what the labels fall back on, not printed
            continue
        lines.append(
            f"  {e['regime']}: step {fmt(e.get('step_time_err_pct', {}))}; memory (allocated) "
            f"{fmt((e.get('memory_err_pct_by_kind') or {}).get('allocated', {}))}; {_fit_text(e)}"
        )
    for sp in s["spearman"]:
        repeat = sp.get("repeat_spearman")
        against = f"; first run against second: {repeat:.2f}" if repeat is not None else ""
        lines.append(
            f"  rank correlation {sp['model']} on {sp['budget']}: {sp['spearman']:.2f} ({sp['n']} trials{against})"
        )
    for line in s["not_predicted"]:
        lines.append(f"  {line}")
    return "\n".join(lines)


def run(path: Path, out: Path, publish: bool = False, note: str = "", predictor_for=None) -> dict[str, dict]:
    """Score every record under `path` (`score`, with `predictor_for` if given); write
    `out`/accuracy.json; with `publish`, the summary per device kind under results/accuracy/ (what
    `suite-predict` shows with each figure)."""
    results = read_results(path)
    recs = scorable(results)
    if not recs:
        raise ReportError(f"no ok or oom trial records under {path}")
    df = score(recs, predictor_for)
    result: dict[str, dict] = {}
    for kind, g in df.groupby("device"):
        s = summary(g)
        s["source"] = f"suite-report accuracy {path}" + (f"; {note}" if note else "")
        result[kind] = s
        print(as_text(s, kind))
    out.mkdir(parents=True, exist_ok=True)
    rows = df.astype(object).where(df.notna(), None).to_dict("records")  # NaN is not JSON
    (out / "accuracy.json").write_text(json.dumps({"summary": result, "records": rows}, indent=1, default=str))
    df.to_csv(out / "accuracy.csv", index=False)
    if publish:
        for kind, s in result.items():
            print(f"published {write_json(paths.publish_dir() / f'{kind}.json', s, indent=1)}")
    for message in results.skipped:
        print(message)
    return result
