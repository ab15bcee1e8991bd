"""`python -m analysis.targets RESULTS [--targets FILE] [--out FILE]`: the issues' speed targets
(analysis/targets.yaml) checked on one run's rows, round by round.

Targets on a stage (`stages`) take that stage's rows; `at_least` bounds a metric from below (frac_floor, the cost
model's floor over the measured time), `min_median_ms` leaves out a stage faster than it in every round, and
`host_note_below_ms` marks a verdict other than "holds" whose eager median is that short (the host's launch is in it).

A round is one measurement of each configuration: the k-th run (by timestamp, failed ones included) of a
configuration is its round k, as `scripts/rounds.sh` lays them out; the subject's round k meets the baseline's round k
only. Per target and shape, each round compares the subject's forward median (or
`metric`) with a bound in ms or with the baseline's median of the same round; the target holds when it holds in every
round and at least `rounds` rounds are present ("too few rounds" otherwise). Only points that passed the gate count.
The rows must be one run's (analysis.load.one_run): rounds of several runs are refused.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
import yaml

from analysis.load import METRICS, one_run, timed, wide
from analysis.markdown import emit, table
from harness.cost_model import STAGES

FORWARD = "forward"

TARGETS_PATH = Path(__file__).with_name("targets.yaml")


def load_targets(path: str | Path | None = None) -> dict:
    spec = yaml.safe_load(Path(path or TARGETS_PATH).read_text())
    for t in spec["targets"]:
        for name in ("subject", *(["baseline"] if "baseline" in t else [])):
            if t[name] not in spec["subjects"]:
                raise ValueError(f"target {t['id']!r}: {name} {t[name]!r} is not under subjects")
        bounds = ("at_most_ms" in t) + ("at_least" in t) + ("baseline" in t)
        if bounds != 1 or ("baseline" in t) != ("factor" in t):
            raise ValueError(f"target {t['id']!r}: give one of at_most_ms, at_least, or baseline + factor")
        bad = [st for st in t.get("stages", [FORWARD]) if st not in (*STAGES, FORWARD)]
        if bad:
            raise ValueError(f"target {t['id']!r}: stages {bad} are none of {', '.join((*STAGES, FORWARD))}")
        if t.get("metric", "median_ms") not in METRICS:
            raise ValueError(f"target {t['id']!r}: metric {t['metric']!r} is none of {', '.join(METRICS)}")
    return spec


def select(w: pd.DataFrame, subject: dict, stage: str = "forward") -> pd.DataFrame:
    """Timed ok rows of `stage` run by the subject's backend, ablation and (at least) its switch values."""
    t = timed(w)
    t = t[(t["stage"] == stage) & (t["backend"] == subject["backend"])
          & (t["ablation"].fillna("none") == subject.get("ablation", "none"))]
    wanted = subject.get("switches") or {}
    return t[t["switch_dict"].map(lambda given: all(given.get(k) == v for k, v in wanted.items())).astype(bool)]


def numbered(w: pd.DataFrame) -> pd.DataFrame:
    """w with `round`: the k-th point of a configuration by timestamp, whatever its status, is its round k (every
    point has rows, a failed one too), so that a round a point failed in or lacks the metric in keeps its number."""
    runs = w.groupby("run_id", sort=False).agg(config_hash=("config_hash", "first"), timestamp=("timestamp", "min"))
    runs = runs.sort_values("timestamp", kind="stable")
    rank = runs.groupby("config_hash", sort=False).cumcount() + 1
    return w.assign(round=w["run_id"].map(rank))


def rounds_of(rows: pd.DataFrame, shape: str, metric: str, who: str) -> dict[int, float]:
    """Round number -> the metric at one shape, for the rounds that have it. Raises ValueError when the subject
    matches several configurations there (the selection must name one)."""
    return {k: v for k, (v, _) in rounds_with_median(rows, shape, metric, who).items()}


def rounds_with_median(rows: pd.DataFrame, shape: str, metric: str, who: str) -> dict[int, tuple[float, float]]:
    """Round number -> (the metric, the median ms) at one shape, for the rounds that have the metric."""
    at = rows[rows["shape_name"] == shape]
    if at["config_hash"].nunique() > 1:
        raise ValueError(f"{who} matches {at['config_hash'].nunique()} configurations at {shape}; "
                         "name its switches or ablation in analysis/targets.yaml")
    at = at[at[metric].notna()]
    return dict(zip(at["round"].astype(int), zip(at[metric].astype(float), at["median_ms"].astype(float))))


def _verdict(holds: list[bool], need: int) -> str:
    if len(holds) < need:
        return f"too few rounds ({len(holds)} of {need})"
    return "holds" if all(holds) else f"fails in {holds.count(False)} of {len(holds)} rounds"


def _all_under(mine: dict, ms: float | None) -> bool:
    """Every round's median under `ms` (False without rounds or without a bound)."""
    return ms is not None and bool(mine) and all(median < ms for _, median in mine.values())


def _any_under(mine: dict, ms: float | None) -> bool:
    """Some round's median under `ms` (False without rounds or without a bound)."""
    return ms is not None and any(median < ms for _, median in mine.values())


def check(w: pd.DataFrame, spec: dict) -> pd.DataFrame:
    """One row per (target, stage, shape): each round's figures, the verdict. A target names its stages (default the
    forward); `at_least` bounds a metric from below (frac_floor: the cost model's floor over the time), and
    `min_median_ms` leaves out a stage whose median is under it in every round (the issue's "kernels of 20 µs or
    more"); `host_note_below_ms` flags a verdict on a stage that short (its eager median holds the host's launch)."""
    out = []
    w = numbered(one_run(w, "targets"))
    for t in spec["targets"]:
        metric = t.get("metric", "median_ms")
        need = int(t.get("rounds", spec.get("rounds", 3)))
        for stage in t.get("stages", [FORWARD]):
            subject = select(w, spec["subjects"][t["subject"]], stage)
            baseline = select(w, spec["subjects"][t["baseline"]], stage) if "baseline" in t else None
            for shape in t["shapes"]:
                mine = rounds_with_median(subject, shape, metric, t["subject"])
                verdict = None
                if baseline is not None:
                    theirs = rounds_of(baseline, shape, metric, t["baseline"])
                    # round k against round k: a round either side lacks is left out, never paired with another
                    pairs = [(mine[k][0], theirs[k]) for k in sorted(mine.keys() & theirs.keys())]
                    cells = [f"{b / m:.2f}× ({m:.3f} vs {b:.3f})" for m, b in pairs]
                    holds = [b >= t["factor"] * m for m, b in pairs]
                else:
                    cells = [f"{mine[k][0]:.3f}" for k in sorted(mine)]
                    if "at_least" in t:
                        holds = [mine[k][0] >= t["at_least"] for k in sorted(mine)]
                    else:
                        holds = [mine[k][0] <= t["at_most_ms"] for k in sorted(mine)]
                    if _all_under(mine, t.get("min_median_ms")):
                        verdict = f"not counted (median under {t['min_median_ms'] * 1e3:.0f} µs)"
                if verdict is None:
                    verdict = _verdict(holds, need)
                    if verdict != "holds" and _any_under(mine, t.get("host_note_below_ms")):
                        verdict += (f" (an eager median under {t['host_note_below_ms'] * 1e3:.0f} µs holds the host's "
                                    "launch: read it against the kernel's own time)")
                out.append({"target": t["id"], "text": t["text"], "stage": stage, "shape": shape, "metric": metric,
                            "rounds": "; ".join(cells) or "not measured", "verdict": verdict})
    return pd.DataFrame(out, columns=["target", "text", "stage", "shape", "metric", "rounds", "verdict"])


def render(results: str | Path, spec: dict) -> str:
    w = wide(results)
    gpus = ", ".join(sorted(w["gpu_name"].dropna().unique())) or "no GPU"
    return "\n".join([
        "# Speed targets, round by round",
        "",
        f"Generated by `python -m analysis.targets {results}` (targets in analysis/targets.yaml), on {gpus}. Each "
        "round: the subject's figure (ms), or the baseline's time over the subject's with both figures. Do not edit: "
        "regenerate.",
        "",
        table(check(w, spec)),
        "",
    ])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.targets", description=__doc__.splitlines()[0])
    p.add_argument("results", help="a Parquet file or folder of rows (one run)")
    p.add_argument("--targets", default=None, help="targets YAML (default analysis/targets.yaml)")
    p.add_argument("--out", default=None, help="write the Markdown here instead of printing it")
    a = p.parse_args(argv)
    emit(render(a.results, load_targets(a.targets)), a.out, "targets")
    return 0


if __name__ == "__main__":
    sys.exit(main())
