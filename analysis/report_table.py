"""A report table as Markdown (also what the terminal shows), CSV and LaTeX (booktabs).

A `Table` holds raw values (columns named with units) and how to show each column. The
CSV keeps the raw values under those names; Markdown and LaTeX show formatted values
under human headers, with "n/a" where a value does not exist (never a made-up 0). A column
with an `interval` shows its value followed by the interval, "1.234 [1.201, 1.270]" (only
the value where the interval is a point: a single run), and the CSV keeps both ends too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

NA = "n/a"
FORMATS: dict[str, Callable[[object], str]] = {
    "text": str,
    "int": lambda x: f"{int(x):,}",
    "s": lambda x: f"{x:.3f}",
    "days": lambda x: f"{x:,.2f}",
    "hours": lambda x: f"{x:,.0f}",
    "usd": lambda x: f"${x:,.0f}",
    "frac%": lambda x: f"{x:.1%}",
    "%": lambda x: f"{x:+.0f}%",
    "gib": lambda x: f"{x:.2f}",
    "x": lambda x: f"{x:.2f}x",
    "sci": lambda x: f"{x:.3g}",
    "num": lambda x: f"{x:,.1f}",
}
NUMERIC = set(FORMATS) - {"text"}
LATEX_SPECIAL = {c: "\\" + c for c in "&%$#_{}"} | {"~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


@dataclass(frozen=True)
class Column:
    key: str
    header: str
    fmt: str = "text"
    width: int = 0
    """Longer shown values are cut to this many characters (0: never); the CSV keeps them whole."""
    interval: tuple[str, str] | None = None
    """Keys of the low and high ends of the value's interval, shown after it in the same format."""


@dataclass(frozen=True)
class Table:
    name: str
    """File stem of the written files."""
    title: str
    frame: pd.DataFrame
    columns: tuple[Column, ...]
    notes: tuple[str, ...] = ()

    def raw(self) -> pd.DataFrame:
        return self.frame[[k for c in self.columns for k in (c.key, *(c.interval or ()))]]

    def formatted(self) -> pd.DataFrame:
        def missing(value) -> bool:
            return value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA

        def show(row, c: Column) -> str:
            value = row[c.key]
            text = NA if missing(value) else FORMATS[c.fmt](value)
            if c.interval and not missing(value):
                lo, hi = (row[k] for k in c.interval)
                if not (missing(lo) or missing(hi)) and lo != hi:
                    text += f" [{FORMATS[c.fmt](lo)}, {FORMATS[c.fmt](hi)}]"
            return text[: c.width - 1] + "…" if 0 < c.width < len(text) else text

        rows = [r for _, r in self.frame.iterrows()]
        return pd.DataFrame({c.header: [show(r, c) for r in rows] for c in self.columns}, dtype=object)


def to_markdown(t: Table) -> str:
    f = t.formatted()
    cells = [[str(v).replace("|", "\\|") for v in f[h]] for h in f.columns]
    widths = [max([len(h)] + [len(v) for v in col]) for h, col in zip(f.columns, cells, strict=True)]
    right = [c.fmt in NUMERIC for c in t.columns]

    def line(values: list[str]) -> str:
        padded = [v.rjust(w) if r else v.ljust(w) for v, w, r in zip(values, widths, right, strict=True)]
        return "| " + " | ".join(padded) + " |"

    rule = (
        "|"
        + "|".join(("-" * (w + 1) + ":") if r else ("-" * (w + 2)) for w, r in zip(widths, right, strict=True))
        + "|"
    )
    rows = [line([col[i] for col in cells]) for i in range(len(f))]
    table = [line(list(f.columns)), rule, *rows] if rows else ["(none)"]
    return "\n".join([f"### {t.title}", "", *table, ""] + [f"- {n}" for n in t.notes]) + "\n"


def to_latex(t: Table) -> str:
    caption = "".join(LATEX_SPECIAL.get(ch, ch) for ch in " ".join([t.title + "."] + list(t.notes)))
    align = "".join("r" if c.fmt in NUMERIC else "l" for c in t.columns)
    return t.formatted().to_latex(index=False, escape=True, caption=caption, label=f"tab:{t.name}", column_format=align)


def write(tables: list[Table], out_dir: str | Path) -> list[Path]:
    """Each table as <name>.md, <name>.csv and <name>.tex in `out_dir`; returns the paths."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    paths = []
    for t in tables:
        for suffix, text in ((".md", to_markdown(t)), (".csv", t.raw().to_csv(index=False)), (".tex", to_latex(t))):
            p = d / f"{t.name}{suffix}"
            p.write_text(text)
            paths.append(p)
    return paths
