"""The leaderboard page: trial results as one self-contained HTML file, opened from disk.

`page()` turns results read by `analysis.load` and their frame with `analysis.estimates` into
the HTML: the template, style and script (page.html, page.css, page.js) and the data are
inlined, so the file needs no server and no network. Every figure comes from `analysis`
(estimates, best per budget, the exported winner; predicted rows from `analysis.predicted`,
asked for with --predict, and the plans of `analysis.plan`, asked for with --plan, each drawn in a
section of their own); this module computes none. What
the page knows of each metric (label, unit, format, meaning) travels with the data, from
`suite.metric_table`.

Strings from configs and results travel only inside a `<script type="application/json">`
block with `<`, `>` and `&` escaped, and page.js puts them on the page as text, never as
markup. A Content-Security-Policy allows only this page's own script and style, by hash, and
images from data: URIs: the figures for a paper (analysis.figures, written beside the page) are
shown as their PNGs inlined, with links to their files.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import math
import os
import re
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pandas as pd

from analysis.estimates import ANALYTIC_MFU, estimated_results
from analysis.export import export_winner
from analysis.figures import Inputs, Written, caption, scored, write_figures
from analysis.load import Results
from analysis.plan import Plan, make_plan
from analysis.plan import payload as plan_payload
from analysis.predicted import Asked, predicted_frame
from analysis.prices import PRICES_DIR, Prices, load_prices
from analysis.tables import best_per_budget, tied_with_fastest
from suite import metric_table
from suite.labels import ENGINES, SHARDINGS

# The frame's columns the page shows or draws (analysis.load and analysis.estimates document them),
# and every metric of the frame (suite.metric_table.FRAME).
COLUMNS = (
    "trial_id", "model", "recipe", "hardware", "device", "gpu_name", "n_gpus", "mem_budget_gib",
    "outcome", "message", "config", "engine", "sharding", "zero_stage", "offload", "recompute", "micro_batch",
    "attention", "compile", "precision", "unit", "days", "days_lo", "days_hi", "gpu_hours", "cloud_cost_usd",
    "cloud_cost_lo_usd", "cloud_cost_hi_usd", "cloud_price_source", "owned_cost_usd", "owned_cost_lo_usd",
    "owned_cost_hi_usd", "owned_hardware_usd", "original_gpus", "original_days", "analytic_days", "analytic_mfu",
    *metric_table.FRAME,
)  # fmt: skip
# What a JSON string may not carry unescaped inside a <script> element.
JSON_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def _asset(name: str) -> str:
    return resources.files("leaderboard").joinpath(name).read_text(encoding="utf-8")


def _plain(v: Any) -> Any:
    """A frame value as plain Python: numpy scalars unwrapped, NaN and NA as None."""
    if pd.api.types.is_scalar(v) and pd.isna(v):
        return None
    return v.item() if hasattr(v, "item") else v


def _finite(obj: Any) -> Any:
    """`obj` with every NaN or infinity (a diverged loss in a stored record) as null: JSON has neither."""
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return None if isinstance(obj, float) and not math.isfinite(obj) else obj


def script_json(obj: Any) -> str:
    """JSON that is safe as the text of a <script> element: no `</script>`, no `<!--`."""
    text = json.dumps(_finite(obj), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return re.sub("[<>&\u2028\u2029]", lambda m: JSON_ESCAPES[m.group()], text)


def _record(results: Results, trial_id: str, path: str) -> dict[str, Any]:
    """The stored record of a row, for its runs, provenance and full metrics (the frame keeps none whole)."""
    rec = results.record(trial_id).to_json()
    return {k: rec[k] for k in ("sweep", "trial", "metrics", "provenance", "wall_s", "runs")} | {"file": path}


def metrics_payload() -> list[dict[str, str]]:
    """What page.js knows of each metric it lists (`suite.metric_table`: those with a label), in the table's order."""
    keys = ("name", "label", "unit", "format", "over_runs", "description")
    return [{k: getattr(m, k) for k in keys} for m in metric_table.TABLE if m.label]


def _exports(df: pd.DataFrame, trial_id: str) -> list[dict[str, str]]:
    w = export_winner(df, None, None, trial_id=trial_id)
    title, name, settings = w.engine_file
    return [
        {"label": f"Export: {title} ({name})", "text": json.dumps(settings, indent=2)},
        {"label": "Export: Hugging Face TrainingArguments", "text": json.dumps(w.training_args, indent=2)},
        {"label": "Export: launch command", "text": w.launch_command},
    ]


def payload(
    df: pd.DataFrame,
    results: Results,
    prices: Prices,
    predicted: pd.DataFrame | None = None,
    plans: Sequence[Plan] = (),
) -> dict[str, Any]:
    """Everything page.js draws: one entry per trial of `df` (the estimated frame of `results`),
    with its record and (if it ran) its export; the metrics' labels, units and formats; apart from
    them, under `predicted`, the predicted rows asked for (analysis.predicted), which page.js draws
    in a section of their own and never in the measured table, its winners or plots; under `plan`,
    the plans asked for (analysis.plan.payload), a section of their own too.

    `best`: the fastest of its budget (smallest median); `n_tied`: how many are tied with it;
    `tied`: tied with the fastest of its budget (intervals overlap, analysis.tables)."""
    winners = best_per_budget(df).set_index("trial_id")["n_tied"]
    tied = tied_with_fastest(df)
    rows = []
    for i, r in df.iterrows():
        row = {k: _plain(r[k]) for k in COLUMNS}
        row["best"] = r["trial_id"] in winners.index
        row["n_tied"] = int(winners.get(r["trial_id"], 0))
        row["tied"] = bool(tied[i])
        row["record"] = _record(results, r["trial_id"], r["file"])
        row["exports"] = _exports(df, r["trial_id"]) if r["outcome"] == "ok" else []
        rows.append(row)
    return {
        "source": str(results.path),
        "generated": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "skipped": results.messages,
        "price_note": (
            "Cloud cost: GPU-hours \u00d7 the on-demand price per GPU-hour in the price table (its source and date "
            f"are in each row's details). Owned cost: {prices.owned_source}, hardware amortized over "
            f"{prices.amortization_years:g} years. n/a: no price applies (CPU, or a GPU without a price)."
        ),
        "shardings": [{"label": label, "short": short} for label, short in SHARDINGS.items()],
        "engines": ENGINES,
        "metrics": metrics_payload(),
        "rows": rows,
        "predicted": _predicted_rows(predicted),
        "plan": [plan_payload(p) for p in plans],
    }


def _predicted_rows(predicted: pd.DataFrame | None) -> list[dict[str, Any]]:
    if predicted is None:
        return []
    return [{k: _plain(v) for k, v in r.items()} for _, r in predicted.iterrows()]


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def page(
    df: pd.DataFrame,
    results: Results,
    prices: Prices,
    predicted: pd.DataFrame | None = None,
    figures: dict[str, list] | None = None,
    plans: Sequence[Plan] = (),
) -> str:
    """The leaderboard of `results` and their estimated frame `df` (analysis.estimates) as one HTML
    document, with the predicted rows of `predicted` (analysis.predicted.predicted_frame) in a
    section apart and the figures of `figures` (`figures_payload`) under the plots."""
    style, script = _asset("page.css"), _asset("page.js")
    csp = (
        f"default-src 'none'; script-src {_sha256(script)}; style-src {_sha256(style)}; "
        "img-src data:; base-uri 'none'; form-action 'none'"
    )
    data = payload(df, results, prices, predicted, plans) | {"figures": figures or figures_payload(None, Path())}
    data = script_json(data)
    parts = {"csp": csp, "style": style, "script": script, "data": data}
    # One pass over the template: text put in is never scanned for placeholders again.
    return re.sub(r"\{\{(\w+)\}\}", lambda m: parts[m.group(1)], _asset("page.html"))


FILE_LABELS = {".pdf": "PDF", ".png": "PNG", ".csv": "data (CSV)", ".txt": "caption (text)"}


def _href(path: Path, page_dir: Path) -> str:
    """A link from the page to a file beside it: relative (the page is opened from disk), and
    never read as a scheme (`./`)."""
    return "./" + quote(Path(os.path.relpath(path.resolve(), page_dir.resolve())).as_posix())


def figures_payload(written: Written | None, page_dir: Path) -> dict[str, list]:
    """The figures written for the page (analysis.figures): each PNG inlined as a data: URI (the
    page's Content-Security-Policy loads images from data: only), a link to each of its files,
    relative to the page, its caption; and the figures not drawn, with why."""
    if written is None:
        return {"drawn": [], "skipped": []}
    drawn = []
    for spec, plotted, paths in written.figures:
        png = next(p for p in paths if p.suffix == ".png")
        drawn.append(
            {
                "title": f"Figure {spec.number}. {spec.title}",
                "caption": caption(spec, plotted).strip(),
                "png": "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode(),
                "files": [{"label": FILE_LABELS[p.suffix], "href": _href(p, page_dir)} for p in paths],
            }
        )
    skipped = [{"title": f"Figure {spec.number}. {spec.title}", "why": why} for spec, why in written.skipped]
    return {"drawn": drawn, "skipped": skipped}


def write_leaderboard(
    results: Results,
    out: str | Path,
    prices_dir: str | Path = PRICES_DIR,
    analytic_mfu: float = ANALYTIC_MFU,
    predict: Sequence[Asked] = (),
    figures: str | Path | None = None,
    plan: Sequence[list[str]] = (),
) -> tuple[Path, Written | None]:
    """Estimate the results read (`analysis.load.read_results`) and write the page to `out`, with
    the (model, budget)s of `predict` (analysis.predicted.asked) predicted in a section apart and,
    given a folder `figures`, the figures for a paper written there (analysis.figures) and shown
    under the plots, and the plans of `plan` (analysis.plan.asked: each one's overrides), their
    measured options from `results`, in a section apart; returns the page and the figures written."""
    prices = load_prices(prices_dir)
    df = estimated_results(results, prices, analytic_mfu)
    predicted = predicted_frame(list(predict), prices) if predict else None
    target = Path(out)
    written = None
    if figures is not None:
        written = write_figures(Inputs(df, str(results.path), predicted, scored(results)), Path(figures))
    plans = [make_plan(overrides, prices, results) for overrides in plan]
    html = page(df, results, prices, predicted, figures_payload(written, target.parent), plans)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(html, encoding="utf-8")
    return target, written
