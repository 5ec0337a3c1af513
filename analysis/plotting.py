"""Drawing the report's figures: matplotlib's object API on the Agg canvas (no display, no pyplot
state), one function per figure of analysis/figures.py, which gives each its data.

One style for all: single-column width (3.5 in, a column of a two-column paper), 7-pt type, the
Okabe-Ito palette (safe for colour-blind readers) with a marker per series as well, so a grey print
still tells them apart, and TrueType fonts embedded in the PDF (`pdf.fonttype` 42). Measured
points are filled; predicted ones hollow, on dashed lines, labelled "predicted". Nothing is drawn
that is not a column of the data given.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import EngFormatter, FixedLocator, FuncFormatter, MaxNLocator, NullLocator

from analysis.tables import SINGLE

WIDTH_IN = 3.5  # one column of a two-column paper (IEEE, ACM: 3.3-3.5 in)
PANEL_IN = 1.6  # height of a row of panels
PNG_DPI = 200
BAND_PCT = 10
"""Figure 5's band: within this many percent of the measurement."""
STYLE = {
    "pdf.fonttype": 42,  # TrueType, embedded: what publishers ask for (Type 3 is refused by some)
    "ps.fonttype": 42,
    "font.family": "DejaVu Sans",
    "font.size": 7,
    "axes.titlesize": 7,
    "axes.labelsize": 7,
    "xtick.labelsize": 6,
    "ytick.labelsize": 6,
    "legend.fontsize": 6,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.linewidth": 0.6,
    "xtick.major.width": 0.6,
    "ytick.major.width": 0.6,
    "lines.linewidth": 1.0,
    "lines.markersize": 4,
    "errorbar.capsize": 2,
    "savefig.pad_inches": 0.02,
}
# Okabe & Ito, "Color Universal Design" (2008): distinguishable with any common colour-vision deficiency.
BLUE, ORANGE, GREEN, VERMILLION = "#0072B2", "#E69F00", "#009E73", "#D55E00"
PURPLE, SKY, YELLOW, BLACK, GREY = "#CC79A7", "#56B4E9", "#F0E442", "#000000", "#8C8C8C"
COLOURS = (BLUE, ORANGE, GREEN, VERMILLION, PURPLE, SKY, BLACK, YELLOW)
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "h")
# A verdict of analysis.tables (compare) as drawn: (word, colour, marker, filled).
VERDICTS = {
    "significantly faster": ("faster", BLUE, "o", True),
    "smaller significantly faster": ("faster", BLUE, "o", True),
    "significantly slower": ("slower", VERMILLION, "s", True),
    "largest significantly faster": ("slower", VERMILLION, "s", True),
    "tied": ("tied", GREY, "D", True),
    SINGLE: ("1 run", BLACK, "o", False),
}


def styles(labels) -> dict[str, tuple[str, str]]:
    """A (colour, marker) per label, in sorted order; 64 before a pair repeats."""
    names = sorted(set(labels))
    return {n: (COLOURS[i % 8], MARKERS[(i + i // 8) % 8]) for i, n in enumerate(names)}


def grid(n: int, extra_in: float = 0.55) -> tuple[Figure, list[Axes]]:
    """A figure of `n` panels: one at full width, more in two columns."""
    cols = 1 if n == 1 else 2
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(WIDTH_IN, rows * PANEL_IN + extra_in), layout="constrained")
    axes = list(fig.subplots(rows, cols, squeeze=False).ravel())
    for ax in axes[n:]:
        ax.remove()
    return fig, axes[:n]


def legend_below(fig: Figure, axes: list[Axes], extra: list = ()) -> None:
    """One legend for every panel's labelled artists, under the panels."""
    handles: dict[str, object] = {}
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, h)
    for h in extra:
        handles.setdefault(h.get_label(), h)
    labels = sorted(handles, key=str.casefold)  # a predicted series right after its measured one
    if labels:
        fig.legend([handles[k] for k in labels], labels, loc="outside lower center", ncols=2, frameon=False)


def _plain(v: float, _pos=None) -> str:
    return f"{v:g}"


def _log_ticks(axis, lo: float, hi: float) -> None:
    """A log axis labelled in plain numbers, with at least two labels inside any range: the
    powers of ten, else 1, 2 and 5 of each decade, else every digit, else a linear step
    (matplotlib labels only powers of ten, which a narrow range may not hold)."""
    ticks: list[float] = []
    decades = range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
    for subs in ((1,), (1, 2, 5), range(1, 10)):
        ticks = [m * 10.0**e for e in decades for m in subs if lo <= m * 10.0**e <= hi]
        if len(ticks) >= 2:
            break
    else:
        ticks = [v for v in MaxNLocator(3).tick_values(lo, hi) if lo <= v <= hi]
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(FuncFormatter(_plain))
    axis.set_minor_locator(NullLocator())


def _pct(v: float, _pos=None) -> str:
    return "0" if abs(v - 1) < 1e-9 else f"{(v - 1) * 100:+.0f}%"


def _count_axis(ax: Axes, counts: pd.Series) -> None:
    """GPU counts are powers of two: a log2 axis with a tick at each count drawn."""
    values = sorted(set(counts))
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(values))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlim(values[0] / 1.6, values[-1] * 1.6)


def _count_name(g: pd.DataFrame) -> str:
    cpu = g["series"].str.startswith("CPU workers")
    return "CPU workers" if cpu.all() else "GPUs" if not cpu.any() else "GPUs or CPU workers"


def _value_axis(ax: Axes, axis: str, values: pd.Series) -> None:
    """Log where the values span more than a factor of 8, else linear from 0."""
    v = values.dropna()
    v = v[v > 0]
    if v.empty:
        return
    lo, hi = v.min(), v.max()
    setter = ax.set_ylim if axis == "y" else ax.set_xlim
    if hi / lo > 8:
        (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
        setter(lo / 1.5, hi * 1.5)
        _log_ticks(ax.yaxis if axis == "y" else ax.xaxis, lo / 1.5, hi * 1.5)
    else:
        setter(0, hi * 1.15)


def _original(ax: Axes, g: pd.DataFrame) -> None:
    known = g[g["original_days"].fillna(0) > 0]
    if known.empty:
        return
    r = known.iloc[0]
    ax.axhline(r["original_days"], color="0.35", ls=":", lw=0.9, label="original run (GPUs x days)")
    ax.annotate(
        f"original: {r['original_gpus']:g} GPUs x {r['original_days']:g} d",
        xy=(0.02, r["original_days"]),
        xycoords=("axes fraction", "data"),
        va="bottom",
        fontsize=5.5,
        color="0.35",
    )


def _predicted_points(ax: Axes, p: pd.DataFrame, x: str, y: str, colour: str, marker: str, label: str) -> None:
    """Hollow markers on a dashed line, labelled predicted, with the published-error bands."""
    ax.plot(p[x], p[y], ls="--", marker=marker, mfc="white", mec=colour, color=colour, label=f"{label} (predicted)")
    for band, alpha in (("p90", 0.15), ("median", 0.3)):
        lo, hi = p.get(f"{y}_{band}_err_lo"), p.get(f"{y}_{band}_err_hi")
        if lo is None or lo.isna().all():
            continue
        if len(p) > 1:
            ax.fill_between(p[x], lo, hi, color=colour, alpha=alpha, lw=0)
        else:
            ax.vlines(p[x], lo, hi, colors=colour, alpha=alpha, lw=6)


def days_vs_gpus(data: pd.DataFrame) -> Figure:
    """Figure 1: one panel per (model, recipe), one line per GPU type; predicted hollow with bands."""
    panels = list(data.groupby(["model", "recipe"], sort=False))
    fig, axes = grid(len(panels))
    style = styles(data["series"])
    recipes = data.groupby("model")["recipe"].nunique()
    for ax, ((model, recipe), g) in zip(axes, panels, strict=True):
        for series, s in g.groupby("series"):
            colour, marker = style[series]
            m = s[s["source"] == "measured"].sort_values("n_gpus")
            if len(m):
                bars = [m["days"] - m["days_lo"], m["days_hi"] - m["days"]]
                ax.errorbar(m["n_gpus"], m["days"], yerr=bars, color=colour, marker=marker, label=series)
            p = s[s["source"] == "predicted"].sort_values("n_gpus")
            if len(p):
                _predicted_points(ax, p, "n_gpus", "predicted_days", colour, marker, series)
        _original(ax, g)
        _count_axis(ax, g["n_gpus"])
        _value_axis(ax, "y", g.filter(regex="days").stack())
        ax.set_title(model if recipes[model] == 1 else f"{model}\n{recipe}")
        ax.set_xlabel(_count_name(g))
        ax.set_ylabel("days to train")
    bands = [c for c in data.columns if c.endswith("_err_lo")]
    drawn = bool(bands) and data[bands].notna().any().any()
    legend_below(fig, axes, [Patch(color=GREY, alpha=0.3, lw=0, label="published error (predicted)")] if drawn else [])
    return fig


def _bars(f: pd.DataFrame, v: str, lo: str, hi: str) -> list | None:
    """Error bars of `v` from its interval's columns, or None where there is none."""
    if lo not in f or f[lo].isna().any():
        return None
    return [f[v] - f[lo], f[hi] - f[v]]


def _usd(v: float, _pos=None) -> str:
    return f"${v / 1e6:g}M" if v >= 1e6 else f"${v / 1e3:g}k" if v >= 1e4 else f"${v:,.0f}"


def _front_line(ax: Axes, g: pd.DataFrame, x: str, y: str, ls: str, label: str) -> None:
    f = g[g["on_front"]]
    if len(f) > 1:
        f = f.sort_values(x)
        ax.plot(f[x], f[y], color="0.25", ls=ls, lw=0.8, zorder=1, label=label)


def _cost_points(ax: Axes, f: pd.DataFrame, x: str, y: str, label: str, **style) -> None:
    """One series of figure 2, its error bars and each point's GPU count."""
    ends = "_p90_err" if x.startswith("predicted") else ""
    xerr = _bars(f, x, f"{x}{ends}_lo" if ends else "days_lo", f"{x}{ends}_hi" if ends else "days_hi")
    yerr = _bars(f, y, f"{y}{ends}_lo" if ends else "cost_lo_usd", f"{y}{ends}_hi" if ends else "cost_hi_usd")
    ax.errorbar(f[x], f[y], xerr=xerr, yerr=yerr, ls="none", label=label, **style)
    for r in f.itertuples():
        xy = (getattr(r, x), getattr(r, y))
        ax.annotate(f"x{r.n_gpus:g}", xy, xytext=(3, 2), textcoords="offset points", fontsize=5, color="0.3")


def cost_vs_days(data: pd.DataFrame) -> Figure:
    """Figure 2: one panel per (model, recipe, kind of cost); measured filled, predicted hollow; the fronts."""
    panels = list(data.groupby(["model", "recipe", "cost_kind"], sort=False))
    fig, axes = grid(len(panels))
    style = styles(data["series"])
    for ax, ((model, _, kind), g) in zip(axes, panels, strict=True):
        m, p = g[g["source"] == "measured"], g[g["source"] == "predicted"]
        for series, s in m.groupby("series"):
            colour, marker = style[series]
            _cost_points(ax, s, "days", "cost_usd", series, color=colour, marker=marker)
        for series, s in p.groupby("series"):
            colour, marker = style[series]
            _cost_points(ax, s, "predicted_days", "predicted_cost_usd", f"{series} (predicted)", color=colour,
                         marker=marker, mfc="white")  # fmt: skip
        _front_line(ax, m, "days", "cost_usd", "-", "Pareto front, measured")
        _front_line(ax, p, "predicted_days", "predicted_cost_usd", "--", "Pareto front, predicted")
        _value_axis(ax, "x", g.filter(regex="days").stack())
        _value_axis(ax, "y", g.filter(regex="cost.*usd").stack())
        ax.yaxis.set_major_formatter(FuncFormatter(_usd))
        ax.set_title(f"{model}: {kind} cost")
        ax.set_xlabel("days to train")
        ax.set_ylabel(f"{kind} cost")
    legend_below(fig, axes)
    return fig


def _ratio(pct: pd.Series) -> pd.Series:
    return 1 + pct / 100


def _ratio_ticks(lo: float, hi: float) -> list[float]:
    """Ticks of a speed-up's ratio enclosing [lo, hi], so every point is drawn: finer steps over a
    narrow range, then coarser ones, then powers of two (of four over a wide range) as far as the
    data reach."""
    span = hi / lo
    fine = [[0.8, 0.9, 1, 1.1, 1.25]] if span <= 2 else []
    fine += [[0.5, 2 / 3, 0.8, 1, 1.25, 1.5, 2]] if span <= 6 else []
    for steps in fine:
        if steps[0] <= lo and hi <= steps[-1]:
            break
    else:
        step = 1 if span < 24 else 2
        first, last = math.floor(math.log2(lo) / step), math.ceil(math.log2(hi) / step)
        steps = [2.0 ** (step * k) for k in range(first, last + 1)]
    below = [v for v in steps if v <= lo]
    above = [v for v in steps if v >= hi]
    return [v for v in steps if below[-1] <= v <= above[0]]


def _forest_rows(data: pd.DataFrame, label, first) -> list[tuple]:
    """The lines of a forest, top to bottom: (kind, label, row) with kind heading, first or row."""
    lines = []
    for (model, _, budget), g in data.groupby(["model", "recipe", "budget"], sort=False):
        lines.append(("heading", f"{model} · {budget}", None))
        if first:
            lines.append(("first", first(g), None))
        lines += [("row", label(r), r) for _, r in g.iterrows()]
    return lines


def forest(data: pd.DataFrame, label, xlabel: str, first=None) -> Figure:
    """Speed-ups as rows grouped by (model, budget), on a log scale of the ratio, with their
    intervals and verdicts (figures 3 and 6): `label(row)` names a row; `first(group)`, if given,
    names a line drawn at 0 at the head of each group (the configuration compared against)."""
    lines = _forest_rows(data, label, first)
    fig = Figure(figsize=(WIDTH_IN, 0.8 + 0.14 * len(lines)), layout="constrained")
    ax = fig.subplots()
    words = []
    for y, (kind, _, r) in enumerate(lines):
        if kind == "first":
            ax.plot(1, y, marker="|", ms=7, color=BLACK)
        if kind != "row":
            words.append(("", BLACK))
            continue
        word, colour, marker, filled = VERDICTS[r["verdict"]]
        lo, hi = _ratio(r["speedup_lo_pct"]), _ratio(r["speedup_hi_pct"])
        if hi > lo:
            ax.hlines(y, lo, hi, colors=colour, lw=1)
        ax.plot(_ratio(r["speedup_pct"]), y, marker=marker, color=colour, mfc=colour if filled else "white")
        words.append((word, colour))
    ax.set_xscale("log")
    ends = pd.concat([_ratio(data[c]) for c in ("speedup_lo_pct", "speedup_hi_pct", "speedup_pct")])
    ticks = _ratio_ticks(min(ends.min(), 1), max(ends.max(), 1))
    ax.set_xlim(ticks[0] / 1.1, ticks[-1] * 1.1)
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(FuncFormatter(_pct))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.axvline(1, color="0.3", lw=0.6, zorder=0)
    ys = range(len(lines))
    ax.set_yticks(ys, [name for _, name, _ in lines])
    right = ax.secondary_yaxis("right")
    right.set_yticks(ys, [w for w, _ in words])
    for axis, texts in ((ax, None), (right, words)):
        axis.tick_params(axis="y", length=0)
        for i, t in enumerate(axis.get_yticklabels()):
            if lines[i][0] == "heading":
                t.set_fontweight("bold")
            if texts:
                t.set_color(texts[i][1])
    right.spines["right"].set_visible(False)
    ax.spines["left"].set_visible(False)
    ax.set_ylim(len(lines) - 0.5, -0.5)
    ax.set_xlabel(xlabel)
    handles = {w: Line2D([], [], ls="none", marker=m, color=c, mfc=c if f else "white", label=w)
               for w, c, m, f in VERDICTS.values()}  # fmt: skip
    fig.legend(handles=list(handles.values()), loc="outside lower center", ncols=4, frameon=False)
    return fig


def method_speedup(data: pd.DataFrame) -> Figure:
    """Figure 3: each memory method against the naive configuration of its (model, budget)."""
    return forest(
        data,
        label=lambda r: r["memory_methods"],
        xlabel="speed-up over the naive configuration (|: naive)",
        first=lambda g: f"naive: {g['naive_config'].iloc[0]}",
    )


def micro_batch(data: pd.DataFrame) -> Figure:
    """Figure 6: a smaller micro-batch against the largest that ran, per case."""
    return forest(
        data,
        label=lambda r: f"{r['methods']}: mb {r['smaller_micro_batch']} vs {r['largest_micro_batch']}",
        xlabel="speed-up of the smaller micro-batch",
    )


def throughput_vs_memory(data: pd.DataFrame) -> Figure:
    """Figure 4: per budget, throughput against peak memory, the front, the fastest ringed."""
    panels = list(data.groupby(["model", "recipe", "budget"], sort=False))
    fig, axes = grid(len(panels))
    for ax, ((model, _, budget), g) in zip(axes, panels, strict=True):
        on, off = g[g["on_front"]], g[~g["on_front"]]
        right = max(g["peak_mem_gib"].max(), 0) * 1.08
        budget_gib = g["mem_budget_gib"].iloc[0]
        if 0 < budget_gib <= 2 * g["peak_mem_gib"].max():
            right = budget_gib * 1.08
            ax.axvline(budget_gib, color=VERMILLION, ls="--", lw=0.8, label="device memory")
        steps = pd.concat([on["peak_mem_gib"], pd.Series([right])], ignore_index=True)
        ax.step(steps, pd.concat([on["tokens_per_s"], on["tokens_per_s"].tail(1)], ignore_index=True), where="post",
                color=BLUE, lw=0.8, zorder=1)  # fmt: skip
        ax.plot(off["peak_mem_gib"], off["tokens_per_s"], "o", color="0.65", label="off the front")
        ax.plot(on["peak_mem_gib"], on["tokens_per_s"], "o", color=BLUE, label="on the fastest-per-memory front")
        for flag, width, label in (("fastest", 1.2, "fastest of the budget"), ("tied", 0.6, "tied with the fastest")):
            f = g[g[flag]]
            ax.plot(f["peak_mem_gib"], f["tokens_per_s"], "o", ms=8, mfc="none", mec=ORANGE, mew=width, label=label)
        ax.set_xlim(0, right)
        ax.set_ylim(0, g["tokens_per_s"].max() * 1.1)
        ax.yaxis.set_major_formatter(EngFormatter(sep=""))
        ax.set_title(f"{model} · {budget}")
        ax.set_xlabel("peak GiB per device")
        ax.set_ylabel("images/s" if g["unit"].iloc[0] == "image" else "tokens/s")
    legend_below(fig, axes)
    return fig


def predicted_vs_measured(data: pd.DataFrame) -> Figure:
    """Figure 5: step time and peak memory, predicted against measured, log-log, the ±10% band."""
    fig = Figure(figsize=(WIDTH_IN, 2.6), layout="constrained")
    axes = list(fig.subplots(1, 2))
    style = styles(data["method"])
    quantities = (("step_time_s", "pred_step_time_s", "step_time_err_pct", "step time (s)"),
                  ("peak_mem_gib", "pred_peak_mem_gib", "peak_mem_err_pct", "peak memory (GiB)"))  # fmt: skip
    for ax, (measured, predicted, err, name) in zip(axes, quantities, strict=True):
        both = pd.concat([data[measured], data[predicted]])
        lo, hi = both.min() / 1.25, both.max() * 1.25
        line = pd.Series([lo, hi])
        ax.fill_between(line, line * (1 - BAND_PCT / 100), line * (1 + BAND_PCT / 100), color="0.88", lw=0,
                        label=f"within ±{BAND_PCT}%")  # fmt: skip
        ax.plot(line, line, color="0.3", lw=0.8, label="predicted = measured")
        for method, g in data.groupby("method"):
            colour, marker = style[method]
            ax.plot(g[measured], g[predicted], ls="none", marker=marker, color=colour, mfc="none", label=method)
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            _log_ticks(axis, lo, hi)
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_aspect("equal")
        e = data[err].abs()
        ax.text(0.03, 0.97, f"|error| median {e.median():.1f}%\np90 {e.quantile(0.9):.1f}%, n={len(e)}",
                transform=ax.transAxes, va="top", fontsize=5.5)  # fmt: skip
        ax.set_title(name)
        ax.set_xlabel("measured")
        ax.set_ylabel("predicted")
    legend_below(fig, axes)
    return fig


def plan_front(data: pd.DataFrame) -> Figure:
    """suite-plan's figure: dollars up front against days of every option weighed, rented above and
    bought below (one days axis), a colour and marker per GPU type, filled where measured and hollow
    where predicted, bars at the ends of each interval; each panel's own front joined (renting only,
    buying only), the options on the front of both ringed; the deadline and the budget, where given."""
    kinds = [k for k in ("rent", "buy") if (data["acquisition"] == k).any()]
    fig = Figure(figsize=(WIDTH_IN, PANEL_IN * 1.25 * len(kinds) + 0.9), layout="constrained")
    axes = list(fig.subplots(len(kinds), 1, sharex=True, squeeze=False).ravel())
    style = styles(data["gpu_name"])
    first = data.iloc[0]
    for ax, kind in zip(axes, kinds, strict=True):
        g = data[data["acquisition"] == kind]
        for (gpu, source), s in g.groupby(["gpu_name", "source"], sort=True):
            colour, marker = style[gpu]
            x, y = f"{source}_days", f"{source}_usd"
            ax.errorbar(s[x], s[y], xerr=_bars(s, x, f"{x}_lo", f"{x}_hi"), yerr=_bars(s, y, f"{y}_lo", f"{y}_hi"),
                        ls="none", color=colour, marker=marker, mfc=colour if source == "measured" else "white",
                        ms=3.5, elinewidth=0.5, label=gpu)  # fmt: skip
        days = g["measured_days"].fillna(g["predicted_days"])
        usd = g["measured_usd"].fillna(g["predicted_usd"])
        own = g["on_front_of_kind"]
        order = days[own].sort_values().index
        ax.plot(days[order], usd[order], color="0.25", lw=0.7, ls="--", zorder=1, label="front of each panel")
        for i in order:
            ax.annotate(f"x{g.loc[i, 'n_gpus']:g}", (days[i], usd[i]), xytext=(2, 3), textcoords="offset points",
                        fontsize=5, color="0.3")  # fmt: skip
        both = g["on_front"]
        ax.plot(days[both], usd[both], ls="none", marker="o", ms=7, mfc="none", mec=ORANGE, mew=0.9,
                label="on the front of both")  # fmt: skip
        if pd.notna(first["max_days"]):
            ax.axvline(first["max_days"], color=VERMILLION, ls=":", lw=0.8, label="deadline")
        if pd.notna(first["max_usd"]):
            ax.axhline(first["max_usd"], color=VERMILLION, ls="-.", lw=0.8, label="budget")
        shown = [f"{s}_usd{end}" for s in ("measured", "predicted") for end in ("", "_lo", "_hi")] + ["max_usd"]
        _value_axis(ax, "y", g[shown].stack())
        ax.yaxis.set_major_formatter(FuncFormatter(_usd))
        what = "rented" if kind == "rent" else "bought"
        ax.set_title(f"{first['model']}, {first['tokens']:,.0f} {first['unit']}: {what}")
        ax.set_ylabel("dollars up front")
    shown = [f"{s}_days{end}" for s in ("measured", "predicted") for end in ("", "_lo", "_hi")] + ["max_days"]
    _value_axis(axes[-1], "x", data[shown].stack())
    axes[-1].set_xlabel("days to train")
    extra = [Line2D([], [], ls="none", marker="o", color=GREY, mfc="white", label="predicted (hollow)")]
    legend_below(fig, axes, extra)
    return fig


DRAW = {
    1: days_vs_gpus,
    2: cost_vs_days,
    3: method_speedup,
    4: throughput_vs_memory,
    5: predicted_vs_measured,
    6: micro_batch,
}


def draw(number: int, data: pd.DataFrame, stem: Path) -> list[Path]:
    """Figure `number` of `data`, written as stem.pdf (vector, TrueType fonts embedded) and stem.png."""
    return drawn(DRAW[number], data, stem)


def drawn(make, data: pd.DataFrame, stem: Path) -> list[Path]:
    """`make(data)` in the house style, written as stem.pdf (vector, TrueType fonts embedded) and stem.png."""
    pdf, png = stem.with_suffix(".pdf"), stem.with_suffix(".png")
    with matplotlib.rc_context(STYLE):
        fig = make(data)
        FigureCanvasAgg(fig)
        # No creation date or software version in the files: the same data gives the same figure.
        fig.savefig(pdf, metadata={"CreationDate": None, "Producer": None})
        fig.set_layout_engine("none")  # laid out once, for the PDF: the PNG keeps those positions
        fig.savefig(png, dpi=PNG_DPI, metadata={"Software": None})
    return [pdf, png]
