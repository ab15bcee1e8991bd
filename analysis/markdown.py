"""DataFrames as GitHub Markdown tables, without the optional `tabulate` dependency of DataFrame.to_markdown."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

PERCENT_COLUMNS = ("effect_on_top", "effect_on_top_lo", "effect_on_top_hi", "effect_alone", "effect_alone_lo",
                   "effect_alone_hi", "frac_floor", "frac_floor_fused")


def fmt(value, column: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return ""
    if isinstance(value, float):
        if column in PERCENT_COLUMNS:
            return f"{value * 100:+.1f} %" if column.startswith("effect") else f"{value * 100:.1f} %"
        if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
            return f"{value:.3g}"
        return f"{value:.4g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def table(df: pd.DataFrame, index: bool = False, max_rows: int | None = None) -> str:
    """The frame as a Markdown table; effects as signed percentages, fractions of the floor as percentages."""
    if index:
        df = df.reset_index()
    if max_rows is not None and len(df) > max_rows:
        df = df.head(max_rows)
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(fmt(v, c) for v, c in zip(row, cols)) + " |")
    if not len(df):
        lines.append("| " + " | ".join("" for _ in cols) + " |")
    return "\n".join(lines)


def emit(text: str, out: str | None, tag: str) -> None:
    """Writes `text` to `out` (and says so, as "[tag] out"), or prints it when there is no `out`."""
    if out:
        Path(out).write_text(text)
        print(f"[{tag}] {out}")
    else:
        print(text)
