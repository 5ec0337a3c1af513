"""The report's figures, for a paper: what each one plots, taken from the tables' own frames.

    suite-report figures results/runs [--predict pythia-1b@a6000-x4 ...] [--out reports/figures]

Six figures, each built from the frame of the table it illustrates, so its numbers are the
table's (the same medians, the same interval ends):

1. days to train against GPU count, one panel per model, one line per GPU type (`across_budgets`;
   predicted budgets hollow, with the published error as a band; the model's original run);
2. owned and cloud cost against days, with the Pareto front, measured and predicted apart;
3. the speed-up of each memory method over the naive configuration (`method_speedups`);
4. throughput against peak memory per budget, with the fastest-per-memory front (every `ok` trial);
5. predicted against measured step time and peak memory (`accuracy.score`);
6. whether the largest micro-batch that ran is the fastest (`micro_batches`).

A builder returns a `Plotted` (the data it plots, its caption) or the reason it has nothing to
draw. `write_figures` draws each (analysis/plotting.py) and writes FIGURE.pdf, .png, .csv (the
data as plotted) and .txt (the caption), and removes the files of a figure it skipped, so a folder
never holds a figure of other records. Predicted figures sit in columns of their own
(`predicted_*`, `source` "predicted"), never in a measured one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from analysis import ReportError
from analysis.accuracy import scorable, score
from analysis.estimates import error_band
from analysis.load import Results
from analysis.tables import (
    GROUP,
    across_budgets,
    best_per_budget,
    method_speedups,
    micro_batch_answer,
    micro_batches,
    tied_with_fastest,
)

MAX_PANELS = 6
"""Panels per figure (two columns at single-column width); the rest are named, not drawn."""
MAX_ROWS = 24
"""Rows of a speed-up figure (3, 6); whole (model, budget) groups are kept or left out."""


@dataclass(frozen=True)
class Inputs:
    """What the figures are drawn from: the estimated frame (analysis.estimates), the predicted
    rows asked for (analysis.predicted.predicted_frame) and the scored records (analysis.accuracy)."""

    measured: pd.DataFrame
    source: str
    predicted: pd.DataFrame | None = None
    scored: pd.DataFrame | None = None


@dataclass(frozen=True)
class Plotted:
    """One figure's data as it is plotted (its CSV) and what its caption says of it."""

    data: pd.DataFrame
    text: str
    """The caption after the figure's title: what was measured, on what, runs, what is predicted."""
    left_out: tuple[str, ...] = ()
    """What the figure does not draw (panels or rows beyond the cap), said in the caption too."""


@dataclass(frozen=True)
class Spec:
    number: int
    slug: str
    title: str
    build: Callable[[Inputs], Plotted | str]

    @property
    def stem(self) -> str:
        return f"fig{self.number}-{self.slug}"


@dataclass
class Written:
    folder: Path
    figures: list[tuple[Spec, Plotted, list[Path]]] = field(default_factory=list)
    skipped: list[tuple[Spec, str]] = field(default_factory=list)


# ---- shared pieces of data and captions ---------------------------------------------------------


def series_label(device: str, gpu_name: str, mem_budget_gib: float, hardware: str) -> str:
    """One line per device type (as on the page); CPU budgets differ by their per-worker memory."""
    if device == "cpu":
        return "CPU workers" + (f", {mem_budget_gib:g} GiB each" if mem_budget_gib else "")
    return gpu_name or hardware


def _series(frame: pd.DataFrame) -> list[str]:
    columns = frame[["device", "gpu_name", "mem_budget_gib", "budget"]].itertuples(index=False)
    return [series_label(d, g, m, b.split(" x ")[0]) for d, g, m, b in columns]


def _names(values) -> str:
    return ", ".join(sorted({str(v) for v in values}, key=lambda s: (len(s), s)))


def _span(lo, hi, fmt: str = "g") -> str:
    return format(lo, fmt) if lo == hi else f"{format(lo, fmt)}-{format(hi, fmt)}"


def runs_phrase(runs: pd.Series, level: pd.Series) -> str:
    """How many runs each plotted median comes from, and what its interval holds."""
    runs = runs.dropna().astype(int)
    if runs.empty:
        return ""
    single = int((runs == 1).sum())
    if single == len(runs):
        return "each a single run (no interval of its median)"
    several = level[runs.index][runs > 1].dropna()
    text = (
        f"medians of {_span(runs[runs > 1].min(), runs.max())} runs, each in fresh processes, with intervals of the "
        f"median (order statistics) that hold it with {_span(several.min(), several.max(), '.1%')}"
    )
    return text + (f"; {single} single runs have no interval" if single else "")


def _dates(frame: pd.DataFrame) -> str:
    dates = frame["date"].dropna().astype(str).str[:10]
    if dates.empty:
        return ""
    lo, hi = dates.min(), dates.max()
    return f", recorded {lo}" + (f" to {hi}" if hi != lo else "")


def measured_phrase(rows: pd.DataFrame, what: str, x: Inputs, runs=None, level=None) -> str:
    """What the measured points are, of which models on which budgets, from how many runs, when."""
    runs = rows["runs"] if runs is None else runs
    level = rows["step_time_ci_level"] if level is None else level
    m = x.measured
    drawn = m[m["model"].isin(rows["model"]) & m["budget"].isin(rows["budget"])]
    return (
        f"Measured: {len(rows)} {what} of {_names(rows['model'])} on {_names(rows['budget'])}; "
        f"{runs_phrase(runs, level)}{_dates(drawn)}; records under {x.source}."
    )


def predicted_phrase(pred: pd.DataFrame, drawn: str) -> str:
    """What is predicted, and how each point's error in its regime is drawn (`drawn`), or that it is not known."""
    if pred.empty:
        return ""
    errors = []
    for r in pred.drop_duplicates(["model", "budget"]).itertuples():
        drawn_here = drawn if not math.isnan(r.step_time_error_p90_pct) else "none drawn"
        errors.append(f"{r.model} on {r.budget}: {r.time_error_label} ({drawn_here})")
    return (
        f"Predicted, never measured (hollow markers, dashed): {_names(pred['model'] + ' on ' + pred['budget'])}, "
        "each the fastest configuration suite.predict finds predicted to fit; its step-time error in its regime "
        f"(docs/predictor.md): {'; '.join(errors)}; a band is where the measurement would lie "
        "were the prediction's error that large."
    )


def _capped(frame: pd.DataFrame, keys: list[str], what: str, limit: int = MAX_PANELS) -> tuple[pd.DataFrame, tuple]:
    """The first `limit` groups of `frame` by `keys` (in its order), and what was left out."""
    groups = list(dict.fromkeys(map(tuple, frame[keys].values)))
    if len(groups) <= limit:
        return frame, ()
    kept = set(groups[:limit])
    rest = [" · ".join(str(v) for k, v in zip(keys, g, strict=True) if k != "recipe") for g in groups[limit:]]
    return frame[[tuple(k) in kept for k in frame[keys].values]], (_left_out(rest, what),)


def _left_out(rest: list[str], what: str, named: int = 12) -> str:
    more = f"; and {len(rest) - named} more" if len(rest) > named else ""
    return f"{len(rest)} more {what} not drawn (choose with --model / --budget): {'; '.join(rest[:named])}{more}."


def caption(spec: Spec, p: Plotted) -> str:
    title = spec.title if spec.title.endswith("?") else f"{spec.title}."
    return " ".join(s for s in (f"Figure {spec.number}. {title}", p.text, *p.left_out) if s) + "\n"


def _predicted(x: Inputs, column: str) -> pd.DataFrame:
    """The predicted rows with a figure in `column` (a budget that fits), or none."""
    p = x.predicted
    if p is None or p.empty:
        return pd.DataFrame()
    return p[p[column].notna()].copy()


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    frames = [f for f in frames if not f.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def pareto(x: pd.Series, y: pd.Series) -> pd.Series:
    """Points no other beats on both x and y (the lower the better): the front."""
    on = pd.Series(False, index=x.index)
    best = math.inf
    for i in sorted(x.index, key=lambda i: (x[i], y[i])):
        if y[i] < best:
            on[i], best = True, y[i]
    return on


def original_phrase(data: pd.DataFrame) -> str:
    known = data[data["original_days"].fillna(0) > 0].drop_duplicates("model")
    runs = [f"{r.model} {r.original_gpus:g} GPUs x {r.original_days:g} days" for r in known.itertuples()]
    return f"Dotted line: the model's original pretraining run (conf/model/): {'; '.join(runs)}." if runs else ""


# ---- the six figures ----------------------------------------------------------------------------

DAYS_TEXT = (
    "One panel per model, one line per GPU type; x: GPUs (CPU workers on a CPU budget), y: days to train the "
    "model's full recipe (on a log scale where they span more than a factor of 8). Each point is the fastest "
    "configuration of its budget that ran (the table 'Each model across budgets'), at its median step time, "
    "with error bars at the ends of the median's interval."
)
COST_TEXT = (
    "One panel per model and kind of cost; x: days to train, y: the cost of that time (each on a log scale where "
    "it spans more than a factor of 8). Owned: the hardware's purchase price amortized over its life "
    "(conf/prices/owned.yaml, Khandelwal et al. 2024's); cloud: GPU-hours at the price per GPU-hour of "
    "conf/prices/cloud.yaml. Each point is the fastest configuration of a budget (labelled by its GPU count); "
    "error bars at the ends of the median's interval. The line joins the Pareto front, the budgets no other beats "
    "on both time and cost: solid for measured, dashed for predicted, never one front of both."
)
DAYS_KEYS = ["model", "recipe", "series", "budget", "n_gpus", "source", "config", "original_gpus", "original_days"]
BANDS = ("median", "p90")


def days_data(x: Inputs) -> Plotted | str:
    """Figure 1: the `across_budgets` row of every budget with a time to train, and the predicted ones."""
    best = across_budgets(x.measured)
    best = best[best["days"].notna()]
    measured = best.assign(series=_series(best), source="measured")
    measured = measured[[*DAYS_KEYS, "days", "days_lo", "days_hi", "runs", "step_time_ci_level", "trial_id"]]
    pred = _predicted(x, "predicted_days")
    if len(pred):
        pred = pred.assign(series=_series(pred), source="predicted")
        for band in BANDS:
            ends = error_band(pred["predicted_days"], pred[f"step_time_error_{band}_pct"])
            pred[f"predicted_days_{band}_err_lo"], pred[f"predicted_days_{band}_err_hi"] = ends
        bands = [f"predicted_days_{b}_err_{end}" for b in BANDS for end in ("lo", "hi")]
        pred = pred[[*DAYS_KEYS, "predicted_days", *bands, "step_time_error_median_pct", "step_time_error_p90_pct"]]
    data = _concat([measured, pred])
    if data.empty:
        return "no (model, budget) with a measured or predicted time to train"
    data = data.sort_values(["model", "recipe", "series", "n_gpus", "source"], kind="stable").reset_index(drop=True)
    data, left_out = _capped(data, ["model", "recipe"], "models")
    ran = data[data["source"] == "measured"]
    text = [
        DAYS_TEXT,
        measured_phrase(ran, "budgets", x) if len(ran) else "Nothing measured on these models.",
        predicted_phrase(_predicted(x, "predicted_days"), "the darker band at the median, the lighter at p90"),
        original_phrase(data),
        f"Recipes: {'; '.join(sorted(set(data['recipe'])))}.",
    ]
    return Plotted(data, " ".join(t for t in text if t), left_out)


COST_KEYS = ["model", "recipe", "cost_kind", "series", "budget", "n_gpus", "source", "config"]


def cost_data(x: Inputs) -> Plotted | str:
    """Figure 2: owned and cloud cost against days of every budget with both, with the Pareto front."""
    best = across_budgets(x.measured)
    best = best[best["days"].notna()]
    frames = []
    for kind in ("owned", "cloud"):
        m = best[best[f"{kind}_cost_usd"].notna()]
        cost = {f"cost{end}_usd": m[f"{kind}_cost{end}_usd"] for end in ("", "_lo", "_hi")}
        m = m.assign(series=_series(m), source="measured", cost_kind=kind, **cost)
        frames.append(m[[*COST_KEYS, "days", "days_lo", "days_hi", *cost, "runs", "step_time_ci_level", "trial_id"]])
        p = _predicted(x, f"predicted_{kind}_cost_usd")
        if len(p):
            p = p.assign(series=_series(p), source="predicted", cost_kind=kind)
            p["predicted_cost_usd"] = p[f"predicted_{kind}_cost_usd"]
            for what in ("days", "cost_usd"):
                ends = error_band(p[f"predicted_{what}"], p["step_time_error_p90_pct"])
                p[f"predicted_{what}_p90_err_lo"], p[f"predicted_{what}_p90_err_hi"] = ends
            bands = [f"predicted_{w}_p90_err_{e}" for w in ("days", "cost_usd") for e in ("lo", "hi")]
            frames.append(p[[*COST_KEYS, "predicted_days", "predicted_cost_usd", *bands, "step_time_error_p90_pct"]])
    data = _concat(frames)
    if data.empty:
        return (
            "no budget with both a time to train and a price (a CPU budget has none; a GPU needs its row in "
            "conf/prices/)"
        )
    data["on_front"] = False
    for _, g in data.groupby(["model", "recipe", "cost_kind", "source"]):
        days, cost = (
            ("days", "cost_usd") if g["source"].iloc[0] == "measured" else ("predicted_days", "predicted_cost_usd")
        )
        data.loc[g.index, "on_front"] = pareto(g[days], g[cost])
    data["_kind"] = data["cost_kind"].map({"owned": 0, "cloud": 1})
    data = data.sort_values(["model", "recipe", "_kind", "series", "n_gpus"], kind="stable").drop(columns="_kind")
    data, left_out = _capped(data.reset_index(drop=True), ["model", "recipe", "cost_kind"], "panels")
    ran = data[data["source"] == "measured"].drop_duplicates("trial_id")
    text = [
        COST_TEXT,
        measured_phrase(ran, "budgets", x) if len(ran) else "No measured budget has a price.",
        predicted_phrase(_predicted(x, "predicted_days"), "error bars at p90"),
    ]
    return Plotted(data, " ".join(t for t in text if t), left_out)


def _rows_capped(frame: pd.DataFrame, what: str) -> tuple[pd.DataFrame, tuple]:
    """Whole (model, budget) groups of `frame`, in its order, up to MAX_ROWS rows; what was left out."""
    sizes = frame.groupby(GROUP, sort=False).size()
    kept, n = [], 0
    for key, size in sizes.items():
        if kept and n + size > MAX_ROWS:
            break
        kept.append(key)
        n += size
    if len(kept) == len(sizes):
        return frame, ()
    keep = set(kept)
    out = frame[[tuple(k) in keep for k in frame[GROUP].values]]
    rest = [f"{m} · {b}" for m, _, b in list(sizes.index)[len(kept) :]]
    return out, (_left_out(rest, what),)


def _pair_phrase(data: pd.DataFrame, what: str, x: Inputs, sides: tuple[str, str]) -> str:
    """`measured_phrase` of rows that each compare two medians, their columns prefixed by `sides`."""
    runs = pd.concat([data[f"{side}runs"] for side in sides], ignore_index=True)
    level = pd.concat([data[f"{side}step_time_ci_level"] for side in sides], ignore_index=True)
    return measured_phrase(data, what, x, runs, level)


VERDICTS = (
    "Filled blue: significantly faster; filled vermillion: significantly slower (the two intervals, each from 2+ "
    "runs, do not overlap); grey diamond, 'tied': the intervals overlap, so the runs cannot tell the two apart "
    "(the bar crosses 0); hollow, '1 run': a single run on either side, which has no interval and cannot tell."
)


def speedup_data(x: Inputs) -> Plotted | str:
    """Figure 3: `method_speedups`, each memory method against the naive configuration."""
    data = method_speedups(x.measured)
    if data.empty:
        return (
            "no (model, budget) where the naive configuration (plain data parallel, no offload, no recomputation) "
            "and another memory method both ran ok"
        )
    data, left_out = _rows_capped(data, "(model, budget) groups")
    text = [
        "Rows grouped by (model, budget): each memory method (sharding, offload, recomputation) by its fastest "
        "configuration that ran ok, against the naive configuration of its group, named on the group's first line "
        "(plain data parallel, no offload, no recomputation; its fastest micro-batch), as in the table 'Speed-up of "
        "each memory method over the naive configuration'. x: speed-up = naive median step time / this one - 1, "
        "on a log scale of that ratio; bars: the same at the ends of the two intervals of the median.",
        VERDICTS,
        _pair_phrase(data, "configurations", x, ("", "naive_")),
    ]
    return Plotted(data.reset_index(drop=True), " ".join(text), left_out)


FRONT_COLUMNS = [
    *GROUP, "n_gpus", "config", "memory_methods", "peak_mem_gib", "tokens_per_s", "unit", "mem_budget_gib",
    "runs", "step_time_ci_level", "trial_id",
]  # fmt: skip


def front_data(x: Inputs) -> Plotted | str:
    """Figure 4: every `ok` trial's throughput and peak memory, per budget, with the fastest-per-memory front."""
    m = x.measured
    ok = m[(m["outcome"] == "ok") & m["peak_mem_gib"].notna() & m["tokens_per_s"].notna()]
    if ok.empty:
        return "no configuration ran ok"
    data = ok[FRONT_COLUMNS].sort_values(["model", "recipe", "n_gpus", "budget", "peak_mem_gib"], kind="stable")
    data, left_out = _capped(data.reset_index(drop=True), GROUP, "budgets")
    m = m.merge(data[GROUP].drop_duplicates(), on=GROUP)  # the budgets drawn: each is a group of its own
    fastest = set(best_per_budget(m)["trial_id"])
    tied = set(m[tied_with_fastest(m)]["trial_id"])
    data["fastest"] = data["trial_id"].isin(fastest)
    data["tied"] = data["trial_id"].isin(tied)
    data["on_front"] = False
    for _, g in data.groupby(GROUP):
        # The front: nothing else is faster with no more memory (peak up, throughput down).
        data.loc[g.index, "on_front"] = pareto(g["peak_mem_gib"], -g["tokens_per_s"])
    text = [
        "One panel per budget: every configuration that ran ok, its throughput (tokens/s, or images/s for an image "
        "model, at the median step time) against its peak memory per device (the largest of its runs and devices). "
        "The line is the fastest-per-memory front: filled blue, on it (nothing else is faster with no more memory); "
        "grey, off it; ringed: the fastest of the budget (its smallest median step time); thinly ringed: tied with "
        "it. Dashed vertical line: the device's memory, where it is near the peaks.",
        measured_phrase(data, "configurations", x),
    ]
    return Plotted(data, " ".join(text), left_out)


ACCURACY_COLUMNS = [
    "trial_id", "model", "budget", "method", "recompute", "micro_batch", "step_time_s", "pred_step_time_s",
    "step_time_err_pct", "peak_mem_gib", "pred_peak_mem_gib", "peak_mem_err_pct",
]  # fmt: skip


def _not_predicted(scored: pd.DataFrame) -> list[str]:
    notes = scored["note"].fillna("") if "note" in scored else pd.Series(dtype=str)
    return sorted({n.removeprefix("not predicted: ") for n in notes if n})


def _error_phrase(data: pd.DataFrame, err: str, name: str, band_pct: float) -> str:
    e = data[err].abs()
    within = int((e <= band_pct).sum())
    return (
        f"{name}: |error| {e.median():.1f}% median, {e.quantile(0.9):.1f}% p90, {e.max():.1f}% max; "
        f"{within} of {len(e)} within ±{band_pct:g}%"
    )


def accuracy_data(x: Inputs) -> Plotted | str:
    """Figure 5: `accuracy.score` of every record that ran ok and was predicted."""
    from analysis.plotting import BAND_PCT  # deferred: plotting imports matplotlib, which the data needs not

    sc = x.scored
    if sc is None or sc.empty:
        return "no record that ran ok or out of memory to score"
    sc = sc.drop_duplicates("trial_id", keep="last")
    ok = sc[sc["outcome"] == "ok"]
    if "pred_step_time_s" in ok:
        ok = ok[ok["pred_step_time_s"].notna() & ok["step_time_s"].notna() & ok["peak_mem_gib"].notna()]
    if ok.empty or "pred_step_time_s" not in ok:
        why = _not_predicted(sc)
        return "no record that ran ok was predicted" + (f": {'; '.join(why)}" if why else "")
    data = ok[ACCURACY_COLUMNS].sort_values(["model", "budget", "method", "step_time_s"]).reset_index(drop=True)
    runs = x.measured.set_index("trial_id").reindex(data["trial_id"])
    missed = _not_predicted(sc)
    text = [
        "Each point: a trial that ran ok, measured (x) against suite.predict's prediction for its configuration (y), "
        "as suite-report accuracy scores it: left, the median step time; right, the peak memory per device (the "
        "timed window's, where the record has a build peak of its own). Log-log; solid line: predicted = measured; "
        f"grey band: within ±{BAND_PCT}%. Marker: the method (sharding and offload). A CPU record is predicted with "
        "the calibration of the machine that ran it (this machine's where that one is not here).",
        _error_phrase(data, "step_time_err_pct", "Step time", BAND_PCT)
        + "; "
        + _error_phrase(data, "peak_mem_err_pct", "peak memory", BAND_PCT)
        + ".",
        measured_phrase(data, "trials", x, runs["runs"].reset_index(drop=True),
                        runs["step_time_ci_level"].reset_index(drop=True)),
        f"Not predicted ({int((sc['note'].fillna('') != '').sum())} records): {'; '.join(missed)}." if missed else "",
    ]  # fmt: skip
    return Plotted(data, " ".join(t for t in text if t))


def micro_batch_data(x: Inputs) -> Plotted | str:
    """Figure 6: `micro_batches`, the largest micro-batch that ran against the smaller ones, per case."""
    mb = micro_batches(x.measured)
    if mb.empty:
        return "no (model, budget, methods) where two or more micro-batches ran ok"
    data, left_out = _rows_capped(mb, "(model, budget) groups")
    text = [
        "The seed paper timed only the largest micro-batch that fits, assuming it the fastest. Rows grouped by "
        "(model, budget): each case holds the other methods fixed (the table 'Is the largest micro-batch that fits "
        "the fastest?'); x: the speed-up of a smaller micro-batch (one significantly faster than the largest if "
        "any is, else the fastest smaller one) over the largest that ran = largest median step time / smaller "
        "one - 1, on a log scale of that ratio; bars at the ends of the two intervals of the median. Right of 0, "
        "the smaller is faster.",
        VERDICTS,
        micro_batch_answer(mb),
        _pair_phrase(data, "cases", x, ("largest_", "smaller_")),
    ]
    return Plotted(data.reset_index(drop=True), " ".join(text), left_out)


SPECS = (
    Spec(1, "days-vs-gpus", "Days to train against GPU count", days_data),
    Spec(2, "cost-vs-days", "Cost against days to train, with the Pareto front", cost_data),
    Spec(3, "method-speedup", "Speed-up of each memory method over the naive configuration", speedup_data),
    Spec(4, "throughput-vs-memory", "Throughput against peak memory, with the fastest-per-memory front", front_data),
    Spec(5, "predicted-vs-measured", "Predicted against measured step time and peak memory", accuracy_data),
    Spec(6, "micro-batch", "Is the largest micro-batch that fits the fastest?", micro_batch_data),
)
SUFFIXES = (".pdf", ".png", ".csv", ".txt")


def select(x: Inputs, models: list[str], budgets: list[str]) -> Inputs:
    """`x` with only the models and budgets named (all where none is); ReportError naming what is
    there when a name matches nothing."""
    frames = {"measured": x.measured, "predicted": x.predicted, "scored": x.scored}
    wrong = []
    for key, names in (("model", models), ("budget", budgets)):
        known = set().union(*(set(f[key]) for f in frames.values() if f is not None and not f.empty))
        wrong += [
            f"--{key} {n!r} is in no record or prediction (there: {_names(known)})" for n in names if n not in known
        ]
        if names:
            frames = {k: f if f is None or f.empty else f[f[key].isin(names)] for k, f in frames.items()}
    if wrong:
        raise ReportError("; ".join(wrong))
    return replace(x, **frames)


def write_figures(x: Inputs, out: Path) -> Written:
    """Every figure its data allows, into `out`: FIGURE.pdf (fonts embedded), .png, .csv, .txt; the
    files of a figure skipped are removed. Returns what was written and what was skipped, with why."""
    from analysis import plotting  # matplotlib, imported only to draw

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = Written(out)
    for spec in SPECS:
        for old in out.glob(f"{spec.stem}*"):
            if old.suffix in SUFFIXES and old.stem == spec.stem:
                old.unlink()
        built = spec.build(x)
        if isinstance(built, str):
            written.skipped.append((spec, built))
            continue
        stem = out / spec.stem
        paths = plotting.draw(spec.number, built.data, stem)
        built.data.to_csv(stem.with_suffix(".csv"), index=False)
        stem.with_suffix(".txt").write_text(caption(spec, built), encoding="utf-8")
        written.figures.append((spec, built, [*paths, stem.with_suffix(".csv"), stem.with_suffix(".txt")]))
    return written


def scored(results: Results) -> pd.DataFrame | None:
    """`suite-report accuracy`'s scoring of every ok or oom record of `results` (figure 5), or None."""

    recs = scorable(results)
    return score(recs) if recs else None


def describe(w: Written) -> list[str]:
    """What was written and what skipped, with why, in figure order: the lines a command prints."""
    drawn = {spec.number: p for spec, p, _ in w.figures}
    why = {spec.number: reason for spec, reason in w.skipped}
    lines = []
    for spec in SPECS:
        if spec.number in drawn:
            lines.append(f"figure {spec.number}, {spec.title}: {spec.stem}.pdf, .png, .csv (its data), .txt (caption)")
            lines += [f"  {note}" for note in drawn[spec.number].left_out]
        elif spec.number in why:
            lines.append(f"figure {spec.number}, {spec.title}: not drawn: {why[spec.number]}")
    lines.append(f"figures: {w.folder.resolve()}")
    return lines
