"""Speedup of each backend over a chosen baseline backend, per shape and stage, and their geometric mean.

speedup = baseline time / backend time (2.0: twice as fast as the baseline). Times are medians (do_bench's
median per point; the median over points when a configuration was run more than once). The spread is
conservative: with repeats, the min-max of the per-run medians; with one run, the run's p20-p80. A speedup
interval pairs the baseline's fast end with the backend's slow end and vice versa.
Only default-switch points enter (ablation "none"); ablations are analysis.ablation's business. Points whose tile
configs came from a tuning search or a stored record are a column of their own, "<backend>[tuned]", apart from the
same backend's fallback-config points: the two are different configurations, never pooled as repeats. The rows must
be one run's (analysis.load.one_run): repeats are that run's rounds.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis import palette
from analysis.load import TIMED_STAGES, gpu_key, one_run, timed, wide

# problem_name: the same shape under another problem (with initial states, z, seq_idx) is another workload
KEYS = ("stage", "shape_name", "shape", "problem_name", "dtype", "gpu_name")


def time_summary(w: pd.DataFrame, stages=TIMED_STAGES) -> pd.DataFrame:
    """One row per (label, stage, shape, problem, dtype, GPU): time_ms, time_lo, time_hi, spread, n_runs."""
    rows = timed(one_run(w, "time summary"))
    rows = rows[rows["stage"].isin(stages)].assign(gpu_name=lambda d: gpu_key(d))
    out = []
    for key, g in rows.groupby(["label", "backend", "ablation", *KEYS], dropna=False, sort=False):
        n = g["run_id"].nunique()
        med = g["median_ms"].to_numpy(float)
        if n >= 2:
            lo, hi, spread = med.min(), med.max(), "repeats min-max"
        else:
            lo = float(g["p20_ms"].iloc[0]) if pd.notna(g["p20_ms"].iloc[0]) else med[0]
            hi = float(g["p80_ms"].iloc[0]) if pd.notna(g["p80_ms"].iloc[0]) else med[0]
            spread = "p20-p80"
        out.append({**dict(zip(("label", "backend", "ablation", *KEYS), key)), "time_ms": float(np.median(med)),
                    "time_lo": float(lo), "time_hi": float(hi), "spread": spread, "n_runs": n, "tiles": _tiles(g)})
    return pd.DataFrame(out, columns=["label", "backend", "ablation", *KEYS, "time_ms", "time_lo", "time_hi",
                                      "spread", "n_runs", "tiles"])


def _tiles(g: pd.DataFrame) -> str:
    """Where a point's tiles came from, in a legend's words (analysis.palette.tile_words) over its rows."""
    protocols = g["tile_protocol"] if "tile_protocol" in g else pd.Series(None, index=g.index)
    tuning = g["tuning"] if "tuning" in g else pd.Series(None, index=g.index)
    found = {s for p, t in zip(protocols, tuning) for s in palette.tile_sources(p, t)}
    return palette.tile_words(sorted(found))


def tuned_label(w: pd.DataFrame) -> pd.Series:
    """backend, or "<backend>[tuned]" where every stage's tiles were searched for the point itself: its `tuning`
    sources all a search or a stored record and, where the row has a `tile_protocol`, that protocol retuned (or
    retuned-narrower) (analysis.palette.is_tuned). Fallback, pinned (borrowed) and same-sass tiles are not tuned for
    the point: they keep the plain label."""
    protocols = w["tile_protocol"] if "tile_protocol" in w else pd.Series(None, index=w.index)
    tuning = w["tuning"] if "tuning" in w else pd.Series(None, index=w.index)
    tuned = pd.Series([palette.is_tuned(p, t) for p, t in zip(protocols, tuning)],
                      index=w.index, dtype=bool)
    return w["backend"].where(~tuned, w["backend"] + "[tuned]")


def geomean(values) -> float:
    v = np.asarray(list(values), float)
    v = v[np.isfinite(v) & (v > 0)]
    return float(np.exp(np.log(v).mean())) if len(v) else float("nan")


def _case(t: pd.DataFrame) -> pd.Series:
    """shape_name, made unique with the shape label where one name covers several shapes (seqlen sweeps), and with
    the problem where the rows hold several problems (plain, with initial states, ...)."""
    n = t.groupby("shape_name")["shape"].transform("nunique")
    case = t["shape_name"].where(n <= 1, t["shape_name"] + "@" + t["shape"])
    problems = t["problem_name"].fillna("") if "problem_name" in t else pd.Series("", index=t.index)
    return case if problems.nunique() <= 1 else case + "/" + problems


def speedup_table(results, baseline: str = "mamba_ssm", stages=TIMED_STAGES, with_geomean: bool = True,
                  shape_names=None) -> pd.DataFrame:
    """Per (backend, stage, shape, dtype, GPU): time, baseline time, speedup and its interval; then one
    "geomean" row per (backend, stage, dtype, GPU) over the shapes both ran (only `shape_names` when given).
    `case` names the shape (shape_name, plus the shape label when a name covers several shapes). Raises
    ValueError when the baseline has no timed point."""
    w = results if "label" in getattr(results, "columns", []) else wide(results)
    w = w[w["ablation"].fillna("none") == "none"]
    w = w.assign(backend=tuned_label(w.assign(backend=w["label"])))  # variants (label) apart from the defaults
    if shape_names is not None:
        w = w[w["shape_name"].isin(list(shape_names))]
    t = time_summary(w, stages)
    base = t[t["backend"] == baseline]
    if base.empty:
        raise ValueError(f"baseline {baseline!r} has no timed ok point; backends with timings: "
                         f"{sorted(t['backend'].unique())}")
    base = base[[*KEYS, "time_ms", "time_lo", "time_hi"]].rename(
        columns={"time_ms": "baseline_ms", "time_lo": "baseline_lo", "time_hi": "baseline_hi"})
    m = t.merge(base, on=list(KEYS), how="left")
    m["speedup"] = m["baseline_ms"] / m["time_ms"]
    m["speedup_lo"] = m["baseline_lo"] / m["time_hi"]
    m["speedup_hi"] = m["baseline_hi"] / m["time_lo"]
    m["baseline"] = baseline
    m = m.drop(columns=["label", "ablation", "baseline_lo", "baseline_hi"])
    m["case"] = _case(m)
    if with_geomean:
        geo = []
        several = m["problem_name"].fillna("").nunique() > 1  # one geomean per problem, never across problems
        for (backend, stage, dtype, gpu, problem), g in m.dropna(subset=["speedup"]).groupby(
                ["backend", "stage", "dtype", "gpu_name", "problem_name"], sort=False, dropna=False):
            case = f"geomean/{'' if pd.isna(problem) else problem}" if several else "geomean"
            geo.append({"backend": backend, "stage": stage, "shape_name": "geomean", "case": case,
                        "shape": f"{len(g)} shapes", "problem_name": problem,
                        "dtype": dtype, "gpu_name": gpu, "speedup": geomean(g["speedup"]),
                        "speedup_lo": geomean(g["speedup_lo"]), "speedup_hi": geomean(g["speedup_hi"]),
                        "spread": g["spread"].iloc[0], "n_runs": int(g["n_runs"].sum()), "baseline": baseline})
        m = pd.concat([m, pd.DataFrame(geo)], ignore_index=True)
    order = {s: i for i, s in enumerate(TIMED_STAGES)}
    m["_s"] = m["stage"].map(order)
    m["_g"] = (m["shape_name"] == "geomean").astype(int)
    m = m.sort_values(["_s", "_g", "case", "backend"], kind="stable").drop(columns=["_s", "_g"])
    cols = ["stage", "case", "shape_name", "shape", "problem_name", "dtype", "gpu_name", "backend", "baseline",
            "time_ms", "time_lo", "time_hi", "baseline_ms", "speedup", "speedup_lo", "speedup_hi", "spread", "n_runs",
            "tiles"]
    return m[cols].reset_index(drop=True)


def speedup_matrix(table: pd.DataFrame, stage: str = "forward") -> pd.DataFrame:
    """Shapes × backends of speedup for one stage (the geomean row last): the headline table."""
    t = table[table["stage"] == stage]
    mat = t.pivot_table(index="case", columns="backend", values="speedup", aggfunc="first", sort=False)
    rows = [r for r in mat.index if not r.startswith("geomean")] + [r for r in mat.index if r.startswith("geomean")]
    return mat.loc[rows]
