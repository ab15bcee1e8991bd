"""What a faster SSD should buy end to end (Amdahl): with the SSD a share `s` of a step's time under one backend and
another backend's SSD `k` times faster, the step gets 1 / ((1 − s) + s / k) times faster; `explained` compares a
measured end-to-end speedup with that prediction (issue: within 20 %, else the gap is explained from the profile)."""

from __future__ import annotations

import math
from dataclasses import dataclass


def predicted_speedup(share: float, ssd_speedup: float) -> float:
    """The step's speedup when its SSD part (`share` of its time, 0..1) runs `ssd_speedup` times faster."""
    if not 0.0 <= share <= 1.0 or math.isnan(share):
        raise ValueError(f"share: expected a fraction in [0, 1], got {share!r}")
    if not ssd_speedup > 0.0:
        raise ValueError(f"ssd_speedup: expected > 0, got {ssd_speedup!r}")
    return 1.0 / ((1.0 - share) + share / ssd_speedup)


@dataclass(frozen=True)
class EndToEnd:
    """One comparison: the measured step speedup, the predicted one and their ratio (measured / predicted)."""

    measured: float
    predicted: float
    ratio: float
    within: bool


def explained(step_ms_base: float, step_ms_new: float, share_base: float, ssd_ms_base: float, ssd_ms_new: float,
              tolerance: float = 0.20) -> EndToEnd:
    """The base backend's step and SSD times and share against the new backend's step and SSD times: is the measured
    speedup within `tolerance` (relative) of what the base's share predicts? The speedups are compared as speedups
    minus one (the gain), so that a 2 % gain predicted and 2.3 % measured counts as 15 % off, not 0.3 %."""
    for name, value in (("step_ms_base", step_ms_base), ("step_ms_new", step_ms_new), ("ssd_ms_base", ssd_ms_base),
                        ("ssd_ms_new", ssd_ms_new)):
        if not value > 0.0:
            raise ValueError(f"{name}: expected > 0, got {value!r}")
    measured = step_ms_base / step_ms_new
    predicted = predicted_speedup(share_base, ssd_ms_base / ssd_ms_new)
    gain_measured, gain_predicted = measured - 1.0, predicted - 1.0
    if abs(gain_predicted) < 1e-12:
        within = abs(gain_measured) < 1e-3
        ratio = math.inf if not within else 1.0
    else:
        ratio = gain_measured / gain_predicted
        within = abs(ratio - 1.0) <= tolerance
    return EndToEnd(measured, predicted, ratio, within)


# --- tables over the language model's rows and the step profile -------------------------------------------------
# What makes two language-model rows the same configuration apart from the backend
LM_CONFIG = ("direction", "shape", "n_layer", "vocab_size", "glue", "compile", "dtype")


def lm_table(w, base: str = "mamba_ssm"):
    """Tokens per second per backend and configuration (LM_CONFIG) from the wide rows of one run of workload
    mamba2_lm (analysis.load.wide), with the median and its p20/p80 in ms, the peak memory in GiB and each row's
    speedup over `base` in the same configuration (NaN where the run has no `base` row there). MixedRuns where the
    rows come from several runs."""
    import pandas as pd

    from analysis.load import one_run, timed

    rows = one_run(timed(w, workload="mamba2_lm"), "language-model table")
    rows = rows[rows["stage"] == rows["direction"]].copy()
    for column in LM_CONFIG:
        if column not in rows:
            rows[column] = None
    config = list(LM_CONFIG)
    rows[config] = rows[config].astype(object).where(rows[config].notna(), "—")
    out = pd.DataFrame({**{c: rows[c] for c in (*config, "backend")},
                        "tokens_per_s": rows["tokens_per_s"], "median_ms": rows["median_ms"],
                        "p20_ms": rows["p20_ms"], "p80_ms": rows["p80_ms"],
                        "peak_gib": rows.get("peak_mem_bytes", pd.Series(float("nan"), index=rows.index)) / 2**30})
    ref = out[out["backend"] == base].set_index(config)["median_ms"]
    ref = ref[~ref.index.duplicated()]
    keys = pd.MultiIndex.from_frame(out[config])
    out[f"speedup_vs_{base}"] = ref.reindex(keys).to_numpy() / out["median_ms"].to_numpy()
    return out.sort_values([*config, "median_ms"], kind="stable").reset_index(drop=True)


def share_table(profile, lm, base: str = "mamba_ssm", tolerance: float = 0.20):
    """Each backend's measured step speedup over `base` (lm_table's rows) beside the one `base`'s SSD share predicts
    (the step profile's rows, instruments/step_profile.py, of the same card: share and the SSD's time per step
    of each backend), per direction: measured, predicted, their gains' ratio and whether it is `within` tolerance.
    Rows without a profile of both backends are left out: the table says nothing it did not measure."""
    import pandas as pd

    cards = set(profile["gpu_name"].dropna()) if "gpu_name" in profile else set()
    if len(cards) > 1:
        raise ValueError(f"profile: rows of several cards ({sorted(cards)}); one card per table")
    ssd = profile.assign(ssd_ms=profile["ssd_forward_ms"] + profile["ssd_backward_ms"]).set_index(
        ["direction", "backend"])
    out = []
    for row in lm[lm["backend"] != base].itertuples(index=False):
        base_row = lm[(lm["backend"] == base) & (lm["direction"] == row.direction) & (lm["shape"] == row.shape)]
        keys = [(row.direction, base), (row.direction, row.backend)]
        if base_row.empty or not all(k in ssd.index for k in keys):
            continue
        b, n = ssd.loc[keys[0]], ssd.loc[keys[1]]
        e = explained(float(base_row["median_ms"].iloc[0]), row.median_ms, float(b["share"]), float(b["ssd_ms"]),
                      float(n["ssd_ms"]), tolerance)
        out.append({"direction": row.direction, "shape": row.shape, "backend": row.backend, "base": base,
                    "share_base": float(b["share"]), "ssd_speedup": float(b["ssd_ms"]) / float(n["ssd_ms"]),
                    "measured": e.measured, "predicted": e.predicted, "gain_ratio": e.ratio, "within": e.within})
    return pd.DataFrame(out, columns=["direction", "shape", "backend", "base", "share_base", "ssd_speedup",
                                      "measured", "predicted", "gain_ratio", "within"])


# --- the layer's parts, and the tables that sit beside the rows --------------------------------------------------
LAYER_STAGES = ("in_proj_conv", "ssd", "norm_out_proj")  # harness/workloads/mamba2_layer.py, in call order
NON_SSD = ("in_proj_conv", "norm_out_proj")
STEP_PROFILE_SUFFIX = ".step_profile.parquet"  # instruments/step_profile.py SUFFIX


def layer_parts_table(w):
    """Time per part of the Mamba-2 layer, per backend and shape, from the wide rows of one run of workload
    mamba2_layer: each stage's median (p20, p80) and share of the layer's forward, its floor where the run measured
    the card's ceilings (frac_floor × median: harness/workloads/mamba2_layer.py's costs), and a row `non_ssd` (the two
    stages around the SSD, medians and floors summed) with its time over its floor (issue target: ≤ 1.3× at the 2.7B
    layer). Stages are timed each on ready inputs, so the parts need not add up to the forward exactly."""
    import pandas as pd

    from analysis.load import one_run, timed

    rows = one_run(timed(w, workload="mamba2_layer"), "layer parts table")
    rows = rows[rows["direction"] == "forward"]
    out = []
    for (backend, shape), point in rows.groupby(["backend", "shape"], sort=True):
        by = point.drop_duplicates("stage").set_index("stage")
        if "forward" not in by.index:
            continue
        layer_ms = float(by.loc["forward", "median_ms"])
        floor = (by["frac_floor"] * by["median_ms"]) if "frac_floor" in by else pd.Series(float("nan"), index=by.index)
        for stage in (*LAYER_STAGES, "forward"):
            if stage not in by.index:
                continue
            out.append({"backend": backend, "shape": shape, "part": stage, "median_ms": by.loc[stage, "median_ms"],
                        "p20_ms": by.loc[stage, "p20_ms"], "p80_ms": by.loc[stage, "p80_ms"],
                        "share_of_layer": by.loc[stage, "median_ms"] / layer_ms, "floor_ms": floor.get(stage),
                        "x_floor": by.loc[stage, "median_ms"] / floor.get(stage)})
        if all(s in by.index for s in NON_SSD):
            measured = float(sum(by.loc[s, "median_ms"] for s in NON_SSD))
            floor_ms = float(sum(floor.get(s) for s in NON_SSD))
            out.append({"backend": backend, "shape": shape, "part": "non_ssd", "median_ms": measured,
                        "p20_ms": float("nan"), "p80_ms": float("nan"), "share_of_layer": measured / layer_ms,
                        "floor_ms": floor_ms, "x_floor": measured / floor_ms})
    return pd.DataFrame(out, columns=["backend", "shape", "part", "median_ms", "p20_ms", "p80_ms", "share_of_layer",
                                      "floor_ms", "x_floor"])


def beside(sources, suffix: str) -> list:
    """The files ending `suffix` beside resolved result sources (analysis.load.resolve_sources): under a folder
    source, or in the folder of a file source; FileNotFoundError naming the folders when there is none."""
    from pathlib import Path

    folders = sorted({Path(s) if Path(s).is_dir() else Path(s).parent for s in sources})
    found = sorted({f for folder in folders for f in folder.rglob(f"*{suffix}")})
    if not found:
        raise FileNotFoundError(f"no *{suffix} beside the rows (looked under {', '.join(map(str, folders))})")
    return found


def read_beside(sources, suffix: str):
    """The rows of every file ending `suffix` beside result sources (`beside`), with a column `source` (the file's
    name)."""
    import pandas as pd

    return pd.concat([pd.read_parquet(f).assign(source=f.name) for f in beside(sources, suffix)], ignore_index=True)


def load_step_profiles(sources):
    """The step-profile rows (instruments/step_profile.py) beside result sources, for share_table."""
    return read_beside(sources, STEP_PROFILE_SUFFIX)
