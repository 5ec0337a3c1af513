"""A report table as Markdown (also what the terminal shows), CSV and LaTeX (booktabs).

A `Table` holds raw values (columns named with units) and how to show each column. The
CSV keeps the raw values under those names; Markdown and LaTeX show formatted values
under human headers, with "n/a" where a value does not exist (never a made-up 0).
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


@dataclass(frozen=True)
class Table:
    name: str
    """File stem of the written files."""
    title: str
    frame: pd.DataFrame
    columns: tuple[Column, ...]
    notes: tuple[str, ...] = ()

    def raw(self) -> pd.DataFrame:
        return self.frame[[c.key for c in self.columns]]

    def formatted(self) -> pd.DataFrame:
        def show(value, c: Column) -> str:
            missing = value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA
            text = NA if missing else FORMATS[c.fmt](value)
            return text[: c.width - 1] + "…" if 0 < c.width < len(text) else text

        return pd.DataFrame({c.header: [show(v, c) for v in self.frame[c.key]] for c in self.columns}, dtype=object)


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
