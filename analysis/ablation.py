"""The ablation table: for each switch of a backend, the time with and without it, on top of the others and
alone, with switches that are no-ops on the run's architecture labelled as such instead of measured.

Effect of a switch = 1 − t_with / t_without: the fraction of the time without it that the switch saves.
+0.5 halves the time; −0.10 means the switch costs 10 % (t_with = 1.1 · t_without).
- on top of the others: t_with = the default point (every switch at its default), t_without = the same point
  with this switch off (the `ablation=<switch>` points of the sweep);
- alone: t_without = the all-off point, t_with = all off except this switch (present only if the sweep ran it;
  the standard sweep does not, and the table says "not measured").
Points are matched by their resolved switches (the `switches` JSON), not by the ablation label. Non-bool
settings that differ from the default in one key (e.g. cb_precision=fp32), and default-off switches turned on,
get a row "<switch>=<value>": the effect there is that of the default setting over this one (negative: the setting
is faster). A point that changes several such settings at once (an ablation point joined by "+", e.g.
heads_first:True+skip_first:True+pdl:True) gets one row "<a>=<v>+<b>=<w>", read the same way. Intervals use
p20/p80 (or repeats), pairing ends conservatively. `on_top` and `alone` are the effects as printed: a signed
percentage only when larger than both points' noise (analysis.noise), else "within noise". The rows must be one
run's (analysis.load.one_run).

Column `tiles`: where the compared points' tiles came from (the rows' `tile_protocol`, impls/tuning.py
TILE_PROTOCOLS; "<point> / <default>", one word where both agree, "unknown" for rows written before the column). An
effect is the switch's only where both are retuned or same-sass; any other comparison keeps its figures but its
status reads "apart: <tiles>" (pinned: the point borrowed its baseline's tiles), never "measured". Column
`tile_sources`: the two points' `tuning` sources the same way (record, search, fallback), for rows that say no
protocol; figures name them, printed tables leave them out (`printable`).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from analysis import palette
from analysis.load import one_run, timed, wide
from analysis.noise import relative_noise, shown_effect
from analysis.switches import meaning, noop_table, switch_meta
from impls.tuning import COMPARABLE, join_protocols

COLUMNS = ["backend", "stage", "shape_name", "dtype", "gpu_name", "arch", "switch", "status", "tiles", "tile_sources",
           "t_default_ms",
           "t_without_ms", "effect_on_top", "effect_on_top_lo", "effect_on_top_hi", "t_all_off_ms", "t_alone_ms",
           "effect_alone", "effect_alone_lo", "effect_alone_hi", "on_top", "alone", "meaning"]
# the numeric effects: a printed table shows `on_top` and `alone` instead (`printable`)
EFFECT_COLUMNS = ["effect_on_top", "effect_on_top_lo", "effect_on_top_hi", "effect_alone", "effect_alone_lo",
                  "effect_alone_hi"]


def _summaries(g: pd.DataFrame) -> dict[str, dict]:
    """switches JSON (canonical) -> {time, lo, hi, noise, ablation, switches, tiles}."""
    out = {}
    for key, p in g.groupby(g["switch_dict"].map(lambda d: json.dumps(d, sort_keys=True)), sort=False):
        med = p["median_ms"].to_numpy(float)
        if len(med) >= 2:
            lo, hi = med.min(), med.max()
        else:
            lo = p["p20_ms"].iloc[0] if pd.notna(p["p20_ms"].iloc[0]) else med[0]
            hi = p["p80_ms"].iloc[0] if pd.notna(p["p80_ms"].iloc[0]) else med[0]
        found = p["tile_protocol"].dropna() if "tile_protocol" in p else []
        tuning = p["tuning"] if "tuning" in p else pd.Series(None, index=p.index)
        sources = sorted({s for t in tuning for s in palette.tile_sources(None, t)})
        out[key] = {"time": float(np.median(med)), "lo": float(lo), "hi": float(hi), "noise": relative_noise(p),
                    "ablation": set(p["ablation"].fillna("none")), "switches": p["switch_dict"].iloc[0],
                    "tiles": join_protocols(found) if len(found) else "unknown",
                    "sources": "/".join(sources) or "none"}
    return out


def _sources(point, default) -> str:
    """"<point's tuning sources> / <default's>" (record, fallback, search; one where both agree); "" where either
    point is missing: what a figure names where `tiles` is unknown (rows written before tile_protocol)."""
    if point is None or default is None:
        return ""
    return point["sources"] if point["sources"] == default["sources"] else f"{point['sources']} / {default['sources']}"


def _tiles(point, default) -> str:
    """"<point's protocol> / <default's>" (one word where both agree); "" where either point is missing."""
    if point is None or default is None:
        return ""
    return point["tiles"] if point["tiles"] == default["tiles"] else f"{point['tiles']} / {default['tiles']}"


def _apart(status: str, tiles: str) -> str:
    """`status`, or "apart: <tiles>" for a measured comparison whose tiles are not both retuned or same-sass."""
    if not status.startswith("measured") or all(p in COMPARABLE for t in tiles.split(" / ") for p in t.split("+")):
        return status
    return f"apart: {tiles} ({status})"


def _effect(with_, without):
    """(effect, lo, hi) of 1 − t_with / t_without; NaNs when either point is missing."""
    if with_ is None or without is None:
        return (np.nan,) * 3
    return (1 - with_["time"] / without["time"], 1 - with_["hi"] / without["lo"], 1 - with_["lo"] / without["hi"])


def _default_point(candidates: list[dict], backend: str) -> dict:
    """The point run at the backend's declared defaults; several ablation-"none" points exist when a sweep also
    set switches explicitly (e.g. one switch alone): prefer the declared defaults, else the most switches on."""
    declared = {r["name"]: r["default"] for r in switch_meta(backend)}
    for p in candidates:
        shared = set(declared) & set(p["switches"])
        if shared and all(p["switches"][k] == declared[k] for k in shared):
            return p
    return max(candidates, key=lambda p: sum(v is True for v in p["switches"].values()))


def _shown(effect: tuple, *points) -> str:
    """The effect as printed (analysis.noise.shown_effect against the noise of the points it compares)."""
    return shown_effect(effect[0], *(p["noise"] for p in points if p is not None))


def printable(table: pd.DataFrame) -> pd.DataFrame:
    """The table as a page prints it: the effects as `on_top` and `alone` (within noise or a percentage), without
    the numeric effect columns, the switch's meaning and the tuning sources (figures read those)."""
    return table.drop(columns=[*EFFECT_COLUMNS, "meaning", "tile_sources"])


def _noop_status(arch: str, reason: str) -> str:
    if reason.lower().startswith("no-op on"):
        return reason
    return f"no-op on {arch}" if reason == "no-op" else f"no-op on {arch} ({reason})"


def ablation_table(results, backend: str, stage: str = "forward", noop_switches=None) -> pd.DataFrame:
    """One row per (shape, dtype, GPU, switch) of `backend` at `stage`; see the module docstring."""
    w = one_run(results if "label" in getattr(results, "columns", []) else wide(results), f"ablation table ({backend})")
    rows = timed(w, stages=(stage,))
    rows = rows[rows["backend"] == backend]
    out = []
    for (shape_name, dtype, gpu, arch), g in rows.groupby(
            ["shape_name", "dtype", rows["gpu_name"].fillna(rows["device_name"]), "arch"], sort=False):
        points = _summaries(g)
        defaults = [p for p in points.values() if "none" in p["ablation"]]
        if not defaults or len(points) < 2:  # no ablation was run at this shape
            continue
        base = _default_point(defaults, backend)
        D = base["switches"]
        def find(d, points=points):
            return points.get(json.dumps(d, sort_keys=True))

        bools = [k for k, v in D.items() if v is True]
        all_off = find({**D, **{k: False for k in bools}})
        table = noop_table(backend, noop_switches)
        noop = {k: r for k in D if (r := table.reason(arch, k, stage, dtype))}
        common = {"backend": backend, "stage": stage, "shape_name": shape_name, "dtype": dtype, "gpu_name": gpu,
                  "arch": arch, "t_default_ms": base["time"],
                  "t_all_off_ms": all_off["time"] if all_off else np.nan}
        for s in bools:
            without, alone = find({**D, s: False}), find({**D, **{k: False for k in bools}, s: True})
            top, solo = _effect(base, without), _effect(alone, all_off)
            if s in noop:
                status = _noop_status(arch, noop[s])
                top, solo = (np.nan,) * 3, (np.nan,) * 3  # never a measured effect: the difference is noise
            elif without is None and alone is None:
                status = "not measured"
            elif alone is None:
                status = "measured (on top); alone not measured"
            elif without is None:
                status = "measured (alone); on top not measured"
            else:
                status = "measured"
            tiles = _tiles(without, base) or _tiles(alone, all_off)
            out.append({**common, "switch": s, "status": _apart(status, tiles), "tiles": tiles,
                        "tile_sources": _sources(without, base) or _sources(alone, all_off),
                        "t_without_ms": without["time"] if without else np.nan,
                        "t_alone_ms": alone["time"] if alone else np.nan,
                        "effect_on_top": top[0], "effect_on_top_lo": top[1], "effect_on_top_hi": top[2],
                        "effect_alone": solo[0], "effect_alone_lo": solo[1], "effect_alone_hi": solo[2],
                        "on_top": _shown(top, base, without), "alone": _shown(solo, alone, all_off),
                        "meaning": meaning(backend, s, arch)})
        for p in points.values():  # settings changed from the default, none of them a default-on switch turned off
            diff = sorted(k for k in set(D) | set(p["switches"]) if p["switches"].get(k) != D.get(k))
            if not diff or any(D.get(k) is True for k in diff):
                continue
            top = _effect(base, p)
            quiet = [k for k in diff if k in noop]
            status = _noop_status(arch, noop[quiet[0]]) if len(diff) == 1 and quiet else "measured (on top)"
            if len(diff) == 1 and quiet:
                top = (np.nan,) * 3
            label = "+".join(f"{k}={p['switches'].get(k)}" for k in diff)
            what = "; ".join(f"default {D.get(k)!r} vs {p['switches'].get(k)!r}: " + meaning(backend, k, arch)
                             for k in diff)
            out.append({**common, "switch": label, "status": _apart(status, _tiles(p, base)), "tiles": _tiles(p, base),
                        "tile_sources": _sources(p, base),
                        "t_without_ms": p["time"], "t_alone_ms": np.nan, "effect_on_top": top[0],
                        "effect_on_top_lo": top[1], "effect_on_top_hi": top[2], "effect_alone": np.nan,
                        "effect_alone_lo": np.nan, "effect_alone_hi": np.nan, "on_top": _shown(top, base, p),
                        "alone": "", "meaning": what})
        if bools:
            eff = _effect(base, all_off)
            tiles = _tiles(all_off, base)
            out.append({**common, "switch": "all (default vs all off)", "tiles": tiles,
                        "tile_sources": _sources(all_off, base),
                        "status": _apart("measured", tiles) if all_off else "not measured",
                        "t_without_ms": common["t_all_off_ms"],
                        "t_alone_ms": np.nan, "effect_on_top": eff[0], "effect_on_top_lo": eff[1],
                        "effect_on_top_hi": eff[2], "effect_alone": np.nan, "effect_alone_lo": np.nan,
                        "effect_alone_hi": np.nan, "on_top": _shown(eff, base, all_off), "alone": "",
                        "meaning": "every bool switch at its default vs all of them off"})
    return pd.DataFrame(out, columns=COLUMNS)
