"""Sequence-length scaling, accuracy (rel_err against the float64 reference, per seqlen × dtype × backend) and
first-call cost (compile_s: the first call's wall time, compile / autotune included); each table from one run's
rows (analysis.load.one_run)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.load import SHAPE, TIMED_STAGES, gpu_key, one_run, wide

_OTHER_SHAPE = [c for c in SHAPE if c != "seqlen"]


def _w(results, what: str):
    return one_run(results if "label" in getattr(results, "columns", []) else wide(results), what)


def seqlen_table(results, stage: str = "forward", sweep_name: str | None = None) -> pd.DataFrame:
    """Time and throughput against seqlen, per backend, for every family of shapes that differ only in seqlen
    and has at least two lengths. tokens_per_s = batch·seqlen / time; ns_per_token = time / (batch·seqlen);
    scaling = the time ratio to the family's shortest length divided by the length ratio (1.0 = linear)."""
    w = _w(results, "seqlen table")
    t = w[(w["stage"] == stage) & (w["status"] == "ok") & w["median_ms"].notna()
          & (w["ablation"].fillna("none") == "none")]
    if sweep_name is not None:
        t = t[t["sweep_name"] == sweep_name]
    out = []
    for key, g in t.groupby(["backend", "dtype", "gpu_name", *_OTHER_SHAPE], dropna=False, sort=False):
        g = g.groupby("seqlen", as_index=False)["median_ms"].median().sort_values("seqlen")
        if len(g) < 2:
            continue
        info = dict(zip(["backend", "dtype", "gpu_name", *_OTHER_SHAPE], key))
        first = g.iloc[0]
        for r in g.itertuples():
            tokens = info["batch"] * r.seqlen
            out.append({**info, "seqlen": int(r.seqlen), "median_ms": r.median_ms,
                        "tokens_per_s": tokens / (r.median_ms * 1e-3), "ns_per_token": r.median_ms * 1e6 / tokens,
                        "scaling": (r.median_ms / first.median_ms) / (r.seqlen / first.seqlen)})
    cols = ["backend", "dtype", "gpu_name", *_OTHER_SHAPE, "seqlen", "median_ms", "tokens_per_s", "ns_per_token",
            "scaling"]
    return pd.DataFrame(out, columns=cols)


def accuracy_table(results, stages=TIMED_STAGES) -> pd.DataFrame:
    """rel_err and its tolerance per (backend, dtype, seqlen, stage), worst over repeats and other shape
    columns; err_over_tol > 1 is a failure of the gate. Failed points are included (status column)."""
    w = _w(results, "accuracy table")
    t = w[w["stage"].isin(stages) & w["rel_err"].notna() & (w["ablation"].fillna("none") == "none")]
    # precision: the stage's matmul precision as the backend reported it (its tolerance follows; null before
    # schema version 4)
    g = t.groupby(["backend", "dtype", "seqlen", "stage"], sort=True)
    out = g.agg(rel_err=("rel_err", "max"), tol=("tol", "max"), precision=("precision", "first"),
                n=("run_id", "nunique"),
                failed=("status", lambda s: int((s != "ok").sum()))).reset_index()
    out["err_over_tol"] = out["rel_err"] / out["tol"]
    order = {s: i for i, s in enumerate(TIMED_STAGES)}
    return out.sort_values(["stage", "backend", "dtype", "seqlen"], key=lambda c: c.map(order) if c.name == "stage"
                           else c).reset_index(drop=True)


def accuracy_matrix(table: pd.DataFrame, stage: str = "forward") -> pd.DataFrame:
    """(backend, dtype) × seqlen of rel_err for one stage."""
    t = table[table["stage"] == stage]
    return t.pivot_table(index=["backend", "dtype"], columns="seqlen", values="rel_err", aggfunc="max")


def compile_table(results) -> pd.DataFrame:
    """First-call cost per (backend, stage, shape, dtype, GPU): compile_s (median over points), the steady-state
    median_ms, and calls_to_amortize = compile_s / median time (how many steady calls the first one costs). Rows
    of two GPUs (or of a GPU and the CPU) are refused (one run)."""
    w = _w(results, "first-call cost table")
    t = w[w["stage"].isin(TIMED_STAGES) & w["compile_s"].notna() & (w["ablation"].fillna("none") == "none")]
    t = t.assign(gpu_name=gpu_key(t))
    g = t.groupby(["backend", "stage", "shape_name", "dtype", "gpu_name"], sort=False)
    out = g.agg(compile_s=("compile_s", "median"), median_ms=("median_ms", "median"),
                n=("run_id", "nunique")).reset_index()
    out["calls_to_amortize"] = np.where(out["median_ms"] > 0, out["compile_s"] * 1e3 / out["median_ms"], np.nan)
    return out
