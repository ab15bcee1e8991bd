"""Roofline: achieved TFLOP/s and GB/s per stage against the ceilings measured on the same GPU (the `ceiling`
rows: matmul_tflops, copy_gbps) and the cost model's floors (harness/cost_model.py: floor time =
max(flops / matmul ceiling, bytes / copy ceiling)).

The achieved numbers are recomputed from the cost model's flops/bytes and the median time, so they are
comparable across backends (they count the model's minimum traffic, not what a kernel really moved). Where
Nsight Compute measured the DRAM traffic, pass it as `ncu` (columns run_id or backend/shape_name/dtype, stage,
and dram_bytes): the table then shows measured bytes and the traffic excess over the model.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.load import one_run, timed, wide

COLUMNS = ["backend", "label", "stage", "shape_name", "dtype", "gpu_name", "median_ms", "flops", "bytes",
           "intensity", "tflops", "gbps", "matmul_tflops", "copy_gbps", "floor_ms", "bound", "frac_floor",
           "frac_floor_fused", "dram_bytes", "traffic_excess"]


def ceilings(w: pd.DataFrame) -> pd.DataFrame:
    """Per run: matmul_tflops and copy_gbps; points without their own ceiling rows take the median of the
    same GPU's."""
    c = w[w["stage"] == "ceiling"][["run_id", "gpu_name", "matmul_tflops", "copy_gbps"]]
    per_gpu = c.groupby("gpu_name")[["matmul_tflops", "copy_gbps"]].median()
    runs = w[["run_id", "gpu_name"]].drop_duplicates("run_id")
    out = runs.merge(c.drop(columns="gpu_name"), on="run_id", how="left")
    for col in ("matmul_tflops", "copy_gbps"):
        fill = out["gpu_name"].map(per_gpu[col]) if len(per_gpu) else np.nan
        out[col] = out[col].fillna(fill)
    return out.set_index("run_id")[["matmul_tflops", "copy_gbps"]]


def roofline_table(results, ncu: pd.DataFrame | None = None, stages=None, ablations: bool = False) -> pd.DataFrame:
    """One row per timed (point, stage) of ok points (default-switch points only unless `ablations`), of one run
    (analysis.load.one_run)."""
    w = one_run(results if "label" in getattr(results, "columns", []) else wide(results), "roofline table")
    t = timed(w)
    if not ablations:
        t = t[t["ablation"].fillna("none") == "none"]
    if stages is not None:
        t = t[t["stage"].isin(stages)]
    t = t.drop(columns=["matmul_tflops", "copy_gbps"]).join(ceilings(w), on="run_id")
    seconds = t["median_ms"] * 1e-3
    t = t.assign(
        intensity=t["flops"] / t["bytes"],
        tflops=np.where(t["flops"] > 0, t["flops"] / seconds / 1e12, np.nan),
        gbps=t["bytes"] / seconds / 1e9,
    )
    compute_s = t["flops"] / (t["matmul_tflops"] * 1e12)
    memory_s = t["bytes"] / (t["copy_gbps"] * 1e9)
    t["floor_ms"] = np.maximum(compute_s, memory_s) * 1e3
    t["bound"] = np.where(t["floor_ms"].isna(), "no ceiling", np.where(compute_s > memory_s, "compute", "memory"))
    t["frac_floor"] = t["floor_ms"] / t["median_ms"]
    fused_s = np.maximum(compute_s, t["bytes_fused"] / (t["copy_gbps"] * 1e9))
    t["frac_floor_fused"] = np.where(t["bytes_fused"].notna(), fused_s * 1e3 / t["median_ms"], np.nan)
    t["dram_bytes"] = np.nan
    if ncu is not None and len(ncu):
        keys = ["run_id", "stage"] if "run_id" in ncu.columns else ["backend", "shape_name", "dtype", "stage"]
        t = t.drop(columns="dram_bytes").merge(ncu[[*keys, "dram_bytes"]], on=keys, how="left")
    t["traffic_excess"] = t["dram_bytes"] / t["bytes"]
    t["gpu_name"] = t["gpu_name"].fillna(t["device_name"])
    return t[COLUMNS].reset_index(drop=True)
