"""`python -m analysis.before_after BEFORE AFTER [--out FILE]`: the same sweep run by two versions of the code (a
refactor's base commit, from `git archive`, and its result; scripts/before_after.sh) compared point by point. A run
may hold several rounds of the sweep (ROUNDS=2: before, after, after, before); each side's figure is the median of
its rounds' medians. A (variant, dtype, shape, stage) holds when the after-figure lies within max(2 %, the before-run's
widest p20–p80 spread, the before-rounds' range, each relative to the median) of the before-figure; the table lists
both figures, the change (printed as "within noise" when no larger than both sides' round-to-round range and p20–p80
spread, analysis.noise), the allowance and the verdict. Points present in one run only are listed as missing, never
dropped. Each side is one run (analysis.load.one_run: one card, one source tree, one run group). Exit status 1 when
any point does not hold or is missing.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from analysis.load import TIMED_STAGES, gpu_key, one_run, wide
from analysis.markdown import table
from analysis.noise import shown_effect
from harness.cost_model import BACKWARD_STAGES

KEYS = ("label", "dtype", "shape_name", "stage")  # label: the backend with its ablation or switches
STAGES = (*TIMED_STAGES, *BACKWARD_STAGES)  # the forward's stages and whole forward, the backward, forward+backward
MIN_ALLOWANCE = 0.02


def _per_point(w: pd.DataFrame) -> pd.DataFrame:
    """Per variant (backend with its ablation or switches, dtype), shape and stage: the median over the run's
    rounds of their medians (`median_ms`), the widest p20–p80 spread of a round relative to its median (`spread`),
    how far the rounds' medians lie apart relative to their median (`rounds_range`; 0 with one round) and the number
    of rounds (distinct run ids)."""
    # a stage a sweep's direction does not time (the forward's stages in a backward sweep) has no median: not a point
    w = w[(w["status"] == "ok") & w["stage"].isin(STAGES) & w["median_ms"].notna()].assign(
        spread=lambda d: (d["p80_ms"] - d["p20_ms"]) / d["median_ms"])
    g = w.groupby(list(KEYS))
    out = pd.DataFrame({"median_ms": g["median_ms"].median(), "spread": g["spread"].max(),
                        "rounds": g["run_id"].nunique()})
    out["rounds_range"] = (g["median_ms"].max() - g["median_ms"].min()) / out["median_ms"]
    return out


def compare(before: pd.DataFrame, after: pd.DataFrame) -> pd.DataFrame:
    """One row per (variant, dtype, shape, stage) of either run (wide frames, analysis.load.wide, one or more rounds
    each): before and after medians, the relative change, the allowance max(2 %, the before-run's widest p20–p80
    spread, the before-rounds' range) and the verdict (holds, differs, missing). Both runs must come from one GPU
    model: timings of two cards are not a before and an after (ValueError naming both)."""
    gpus = {side: sorted(gpu_key(w).astype(str).unique()) for side, w in (("before", before), ("after", after))}
    if len(gpus["before"]) > 1 or len(gpus["after"]) > 1 or gpus["before"] != gpus["after"]:
        raise ValueError(f"before/after: the runs must come from one GPU model, got before {gpus['before']} and "
                         f"after {gpus['after']}")
    one_run(before, "before/after: the before side")
    one_run(after, "before/after: the after side")
    b, a = _per_point(before), _per_point(after)
    out = b.add_suffix("_before").join(a.add_suffix("_after"), how="outer")
    out["change"] = out["median_ms_after"] / out["median_ms_before"] - 1
    out["allowance"] = out[["spread_before", "rounds_range_before"]].max(axis=1).clip(lower=MIN_ALLOWANCE)
    out["holds"] = out["change"].abs() <= out["allowance"]
    out["verdict"] = out["holds"].map({True: "holds", False: "differs"})
    out.loc[out["median_ms_before"].isna() | out["median_ms_after"].isna(), "verdict"] = "missing"
    return out.reset_index()


def render(cmp: pd.DataFrame) -> str:
    shown = pd.DataFrame({
        "variant": cmp["label"], "dtype": cmp["dtype"], "shape": cmp["shape_name"], "stage": cmp["stage"],
        "before ms": cmp["median_ms_before"].map("{:.4f}".format),
        "after ms": cmp["median_ms_after"].map("{:.4f}".format),
        "change": [shown_effect(c, *noises) for c, *noises in zip(
            cmp["change"], cmp["spread_before"], cmp["rounds_range_before"], cmp["spread_after"],
            cmp["rounds_range_after"])],
        "allowance": cmp["allowance"].map("{:.1%}".format),
        "rounds": [f"{b:.0f} / {a:.0f}" for b, a in zip(cmp["rounds_before"].fillna(0), cmp["rounds_after"].fillna(0))],
        "verdict": cmp["verdict"]})
    return table(shown)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--out", help="write the markdown table here as well")
    args = p.parse_args(argv)
    cmp = compare(wide(args.before), wide(args.after))
    text = render(cmp)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0 if (cmp["verdict"] == "holds").all() else 1


if __name__ == "__main__":
    sys.exit(main())
