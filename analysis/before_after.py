"""`python -m analysis.before_after BEFORE AFTER [--out FILE]`: the same sweep run by two versions of the code (a
refactor's base commit, from `git archive`, and its result) compared point by point. A (backend, shape, stage)
holds when the after-median lies within max(2 %, the before-run's p20–p80 spread relative to its median) of the
before-median; the table lists both medians, the change, the allowance and the verdict. Points present in one run
only are listed as missing, never dropped. Exit status 1 when any point does not hold or is missing.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from analysis.load import wide
from analysis.markdown import table

KEYS = ("backend", "shape_name", "stage")
STAGES = ("chunk_cumsum", "fwd_pass_state", "compute_out", "forward")
MIN_ALLOWANCE = 0.02


def _medians(w: pd.DataFrame) -> pd.DataFrame:
    w = w[(w["status"] == "ok") & w["stage"].isin(STAGES)]
    return w.groupby(list(KEYS))[["median_ms", "p20_ms", "p80_ms"]].median()


def compare(before: pd.DataFrame, after: pd.DataFrame) -> pd.DataFrame:
    """One row per (backend, shape, stage) of either run (wide frames, analysis.load.wide): before and after
    medians, the relative change, the allowance max(2 %, (p80 − p20) / median of the before-run) and `holds`."""
    b, a = _medians(before), _medians(after)
    out = b.join(a.add_suffix("_after"), how="outer").rename(columns={c: f"{c}_before" for c in b.columns})
    out["change"] = out["median_ms_after"] / out["median_ms_before"] - 1
    spread = (out["p80_ms_before"] - out["p20_ms_before"]) / out["median_ms_before"]
    out["allowance"] = spread.clip(lower=MIN_ALLOWANCE)
    out["holds"] = out["change"].abs() <= out["allowance"]
    out["verdict"] = out["holds"].map({True: "holds", False: "differs"})
    out.loc[out["median_ms_before"].isna() | out["median_ms_after"].isna(), "verdict"] = "missing"
    return out.reset_index()


def render(cmp: pd.DataFrame) -> str:
    shown = pd.DataFrame({
        "backend": cmp["backend"], "shape": cmp["shape_name"], "stage": cmp["stage"],
        "before ms": cmp["median_ms_before"].map("{:.4f}".format),
        "after ms": cmp["median_ms_after"].map("{:.4f}".format),
        "change": cmp["change"].map("{:+.1%}".format), "allowance": cmp["allowance"].map("{:.1%}".format),
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
