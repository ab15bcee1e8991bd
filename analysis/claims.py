"""Published claims (analysis/claims.yaml) next to our measurements, with a status that is "reproduced" only
when we measured the same thing on comparable hardware and shapes.

Each claim says what it compares (`kind`: speedup | value | qualitative), the claimed number(s), the
architectures we count as comparable (`comparable_arch`), and `ours`: which of our measurements answers it
(backend / baseline / stage / shape filter). Status, first match wins:
- "source not located"                       the claim has no URL (we could not find the primary source);
- "not reproducible here: Blackwell-only"    the claim needs sm_100 hardware (Tensor Memory, tcgen05); the
                                             measured column shows what we measured instead, `instead` what the
                                             sm_100 AOT build shows;
- "not measured in this run: its rows are X"  the claim's measurement names rows of another run (`ours.results`),
                                             read only with `other_runs` (a table reads one run);
- "not measured"                             no result rows answer it;
- "not comparable: <why>"                    measured on another architecture, or shapes/dtype differ;
- "context only: <why>"                      `proxy`: our nearest measurement, not the claim's kernel;
- "reproduced" / "not reproduced"            the measured value inside / outside the claimed range widened by
                                             `tolerance` (relative, default 0.10).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from analysis.load import one_run, timed, wide
from analysis.speedup import geomean, time_summary

CLAIMS_PATH = Path(__file__).with_name("claims.yaml")
COLUMNS = ["id", "source", "url", "quote", "gpu", "shapes", "date", "claimed", "measured", "measured_on", "status",
           "note"]


def load_claims(path: str | Path | None = None) -> list[dict]:
    data = yaml.safe_load(Path(path or CLAIMS_PATH).read_text())
    claims = data["claims"] if isinstance(data, dict) else data
    for c in claims:
        for key in ("id", "source", "kind"):
            if key not in c:
                raise ValueError(f"claim {c.get('id', '?')!r} lacks {key!r}")
    return claims


def _select(w: pd.DataFrame, ours: dict) -> pd.DataFrame:
    """The timed rows of the claim's stage and shapes: the points run without an ablation, and, for a backend whose
    switches the claim names (`switches`, `baseline_switches`), an ablation point that sets only named switches
    ("heads_first:True+pdl:True": an arm run as an ablation; `_with_switches` then checks the values)."""
    t = timed(w)
    named: dict[str, set] = {}
    for b, sw in (("backend", "switches"), ("baseline", "baseline_switches")):
        if ours.get(sw) and ours.get(b):
            named.setdefault(ours[b], set()).update(ours[sw])

    def counts(backend, ablation) -> bool:
        if pd.isna(ablation) or ablation == "none":
            return True
        return {part.partition(":")[0] for part in str(ablation).split("+")} <= named.get(backend, set())

    keep = [counts(b, a) for b, a in zip(t["backend"], t["ablation"])]
    t = t[pd.Series(keep, index=t.index, dtype=bool) & (t["stage"] == ours.get("stage", "forward"))]
    if ours.get("shape_names"):
        t = t[t["shape_name"].isin(ours["shape_names"])]
    for col, value in (ours.get("shape") or {}).items():
        t = t[t[col] == value]
    if ours.get("dtype"):
        t = t[t["dtype"] == ours["dtype"]]
    return t


def _with_switches(t: pd.DataFrame, backend: str, switches: dict) -> pd.DataFrame:
    """`t` with the backend's rows narrowed to the points run with these switch values (other backends' untouched)."""
    matches = t["switch_dict"].map(lambda given: all(given.get(k) == v for k, v in switches.items()))
    return t[(t["backend"] != backend) | matches]


def _named(switches: dict | None) -> str:
    """" k=v" for each switch a claim names (its description's part)."""
    return "".join(f" {k}={v}" for k, v in (switches or {}).items())


def _measure(w: pd.DataFrame, claim: dict) -> tuple[float, str, pd.DataFrame]:
    """(measured value, description, rows used). `ours.results` (a results source such as
    "index:headline,triton_tricks": files of one run) replaces the caller's rows for this claim; `ours.switches`
    keeps only the backend's points run with those switch values, `ours.baseline_switches` the baseline's."""
    ours = claim.get("ours") or {}
    if ours.get("results"):
        w = one_run(wide(ours["results"]), f"claim {claim['id']} ({ours['results']})")
    t = _select(w, ours)
    if ours.get("switches") and ours.get("backend"):
        t = _with_switches(t, ours["backend"], ours["switches"])
    if ours.get("baseline_switches") and ours.get("baseline"):
        t = _with_switches(t, ours["baseline"], ours["baseline_switches"])
    if claim["kind"] == "speedup" and ours.get("backend") and ours.get("baseline"):
        s = time_summary(t, stages=(ours.get("stage", "forward"),))
        keys = ["shape_name", "shape", "problem_name", "dtype", "gpu_name"]
        a = s[s["backend"] == ours["backend"]][[*keys, "time_ms"]]
        b = s[s["backend"] == ours["baseline"]][[*keys, "time_ms"]]
        m = a.merge(b, on=keys, suffixes=("", "_base"))
        if m.empty:
            return np.nan, "", t.iloc[0:0]
        value = geomean(m["time_ms_base"] / m["time_ms"])
        used = t[t["backend"].isin([ours["backend"], ours["baseline"]]) & t["shape"].isin(m["shape"])]
        return value, f"{ours['backend']}{_named(ours.get('switches'))} over {ours['baseline']}" \
                      f"{_named(ours.get('baseline_switches'))}, {ours.get('stage', 'forward')}, " \
                      f"geomean of {len(m)} shape(s)", used
    if claim["kind"] == "value" and ours.get("metric", "median_ms") == "median_ms":
        if ours.get("backends"):
            t = t[t["backend"].isin(ours["backends"])]
        if t.empty:
            return np.nan, "", t
        best = t.groupby("backend")["median_ms"].median()
        return float(best.min()), f"fastest of ours ({best.idxmin()}), {ours.get('stage', 'forward')} median_ms", t
    return np.nan, "", t.iloc[0:0]


def _claimed(claim: dict) -> tuple[float, float, str]:
    c = claim.get("claimed") or {}
    if "value" in c:
        lo = hi = float(c["value"])
    elif "low" in c:
        lo, hi = float(c["low"]), float(c.get("high", c["low"]))
    else:
        return np.nan, np.nan, str(c.get("text", ""))
    unit = c.get("unit", "×" if claim["kind"] == "speedup" else "")
    text = f"{lo:g}{unit}" if lo == hi else f"{lo:g}–{hi:g}{unit}"
    return lo, hi, text


def compare_claims(results, claims: list[dict] | str | Path | None = None, other_runs: bool = False) -> pd.DataFrame:
    """One row per claim: what it says, what we measured, the status (see the module docstring). `results` are one
    run's rows (analysis.load.one_run); a claim whose measurement names rows of its own (`ours.results`) reads them,
    each claim one run, only with `other_runs` (the table then holds several runs), else it says where they are."""
    w = one_run(results if "label" in getattr(results, "columns", []) else wide(results), "claims table")
    if claims is None or isinstance(claims, (str, Path)):
        claims = load_claims(claims)
    out = []
    for c in claims:
        lo, hi, claimed_text = _claimed(c)
        elsewhere = None if other_runs else (c.get("ours") or {}).get("results")
        value, what, used = (np.nan, "", w.iloc[0:0]) if elsewhere else _measure(w, c)
        archs = sorted(set(used["arch"])) if len(used) else []
        gpus = sorted(set(used["gpu_name"].dropna())) if len(used) else []
        measured_on = ", ".join(gpus or archs)
        unit = (c.get("claimed") or {}).get("unit", "×" if c["kind"] == "speedup" else "")
        measured = f"{value:.3g}{unit} ({what})" if np.isfinite(value) else ""
        comparable = set(c.get("comparable_arch") or [])
        note = str(c.get("note") or "")
        if not c.get("url"):
            status = "source not located"
        elif c.get("blackwell_only"):
            status = "not reproducible here: Blackwell-only"
            if c.get("instead"):
                note = (note + " " if note else "") + f"Instead (sm_100 AOT build): {c['instead']}"
        elif elsewhere:
            status = f"not measured in this run: its rows are {elsewhere}"
        elif not np.isfinite(value):
            status = "not measured"
        elif comparable and not set(archs) <= comparable:
            status = f"not comparable: measured on {', '.join(archs)}, claim on {', '.join(sorted(comparable))}"
        elif c.get("proxy"):
            status = f"context only: {c['proxy']}"
        elif not np.isfinite(lo):
            status = "not comparable: the claim has no number"
        else:
            tol = float(c.get("tolerance", 0.10))
            status = "reproduced" if lo * (1 - tol) <= value <= hi * (1 + tol) else "not reproduced"
        out.append({"id": c["id"], "source": c["source"], "url": c.get("url") or "", "quote": c.get("quote") or "",
                    "gpu": c.get("gpu", ""), "shapes": c.get("shapes", ""), "date": str(c.get("date") or ""),
                    "claimed": claimed_text, "measured": measured, "measured_on": measured_on, "status": status,
                    "note": note})
    return pd.DataFrame(out, columns=COLUMNS)
