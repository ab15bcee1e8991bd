"""Whether a difference between two points is larger than the run's noise: an effect or a speedup is printed as a
percentage only when it exceeds both points' noise, otherwise as "within noise"."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

WITHIN_NOISE = "within noise"


def relative_noise(rows: pd.DataFrame) -> float:
    """The noise of one point at one stage, relative to its median: the larger of the round-to-round range (max − min
    of the rounds' medians, one round per run_id, over their median) and the widest p20–p80 spread of a round (over
    that round's median). NaN when `rows` hold no timing; a missing p20/p80 adds nothing."""
    rows = rows[rows["median_ms"].notna()] if len(rows) else rows
    if rows.empty:
        return math.nan
    medians = rows.groupby("run_id")["median_ms"].median() if "run_id" in rows else rows["median_ms"]
    spread = np.nan
    if "p20_ms" in rows and "p80_ms" in rows:
        spread = ((rows["p80_ms"] - rows["p20_ms"]) / rows["median_ms"]).max()
    rounds = (medians.max() - medians.min()) / medians.median()
    return float(np.nanmax([rounds, spread]))


def shown_effect(effect: float, *noises: float) -> str:
    """`effect` (a fraction: +0.10 is 10 %) as a signed percentage when its size exceeds the largest of `noises`
    (each point's `relative_noise`), else WITHIN_NOISE; "" when the effect is missing. A point whose noise is
    unknown (NaN) does not widen the band."""
    if effect is None or pd.isna(effect):
        return ""
    known = [n for n in noises if n is not None and not pd.isna(n)]
    if abs(effect) <= max(known, default=0.0):
        return WITHIN_NOISE
    return f"{effect * 100:+.1f} %"
