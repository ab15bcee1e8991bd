"""Switch metadata for the analysis: what each backend's switches mean (impls.registry.switch_table) and which
are no-ops on which architecture, so an ablation never reports a no-op's timing noise as an effect.

The no-op table comes from the caller (`noop_switches=`) or from impls/<backend>/switch_<what>_effects.json when
the backend ships one (instruments/cutile/switch_effects.py writes per-stage, per-dtype rows: {"rows": [{"stage",
"dtype", "switch", "arch", "effect": "no-op on sm_90" | ...}]}). Other accepted layouts:
  {"sm_90": {"tma": "why"}}  |  {"sm_90": ["tma"]}  |  {"tma": {"sm_90": "no-op: why"}}
  {"tma": {"sm_90": {"noop": true, "why": "..."}}}, optionally wrapped in {"noop": ...} / {"switches": ...},
  or keyed by backend name first ({"cutile": {...}}).
Architectures are written sm_XY (from "sm90", "9.0", "sm_90").
Switches retired from the kernels keep what the analysis needs of them to read their committed rows (their declared
defaults and their switch-effects rows) in analysis/retired_switches.json (`retired`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis.load import repo_root

RETIRED_PATH = Path(__file__).with_name("retired_switches.json")
_ARCH = re.compile(r"^(?:sm_?)?(\d+)(?:\.(\d))?$")


def norm_arch(key: Any) -> str | None:
    """'sm90' / 'sm_90' / '9.0' / '90' -> 'sm_90'; None when `key` is not an architecture."""
    m = _ARCH.match(str(key).strip().lower())
    if not m:
        return None
    major, minor = m.groups()
    if minor is not None:  # compute capability "9.0"
        return f"sm_{major}{minor}"
    return f"sm_{major}"


def _noop_reason(value) -> str | None:
    if value is True:
        return "no-op"
    if isinstance(value, str):
        return value if value.lower().replace("-", "").replace("_", "").startswith("noop") else None
    if isinstance(value, dict):
        flag = value.get("noop", value.get("no_op", value.get("no-op")))
        if flag:
            return str(value.get("why") or value.get("reason") or value.get("note") or "no-op")
    return None


@dataclass(frozen=True)
class NoopEntry:
    """`switch` is a no-op on `arch` (for one stage / dtype when given, else for all)."""

    arch: str
    switch: str
    reason: str
    stage: str | None = None
    dtype: str | None = None


class NoopTable:
    """Which switches are no-ops where. `reason(arch, switch, stage, dtype)` -> why, or None when the switch
    is not known to be a no-op there. For the whole forward, a per-stage table counts a switch as a no-op only
    when it is one in every stage the table lists for that dtype."""

    def __init__(self, entries=(), per_stage_total: dict | None = None):
        self.entries = list(entries)
        # (arch, switch, dtype) -> number of stages the per-stage table examined
        self.per_stage_total = dict(per_stage_total or {})

    def __bool__(self):
        return bool(self.entries)

    def reason(self, arch: str, switch: str, stage: str | None = None, dtype: str | None = None) -> str | None:
        hits = [e for e in self.entries if e.arch == arch and e.switch == switch
                and (e.dtype is None or dtype is None or e.dtype == dtype)]
        general = [e for e in hits if e.stage is None]
        if general:
            return general[0].reason
        staged = [e for e in hits if e.stage is not None]
        if not staged:
            return None
        if stage in (None, "forward"):
            stages = {e.stage for e in staged}
            total = self.per_stage_total.get((arch, switch, dtype), len(stages))
            return f"{staged[0].reason} in all {len(stages)} stages" if stages and len(stages) == total else None
        same = [e for e in staged if e.stage == stage]
        return same[0].reason if same else None


def _from_rows(rows) -> NoopTable:
    """The per-stage layout instruments/cutile/switch_effects.py writes: rows of {stage, dtype, switch, arch,
    effect}."""
    entries, totals = [], {}
    for r in rows:
        arch = norm_arch(r.get("arch", "")) or str(r.get("arch"))
        key = (arch, r["switch"], r.get("dtype"))
        totals[key] = totals.get(key, 0) + 1
        reason = _noop_reason(r.get("effect")) or _noop_reason(r)
        if reason:
            entries.append(NoopEntry(arch, r["switch"], reason, r.get("stage"), r.get("dtype")))
    return NoopTable(entries, totals)


def normalise_noop(obj, backend: str | None = None) -> NoopTable:
    """Any accepted layout -> NoopTable."""
    if not obj:
        return NoopTable()
    if isinstance(obj, NoopTable):
        return obj
    if not isinstance(obj, dict):
        raise ValueError(f"no-op table: expected a mapping, got {type(obj).__name__}")
    if isinstance(obj.get("rows"), list):
        return _from_rows(obj["rows"])
    for wrapper in ("noop", "no_op", "switches", "effects"):
        if wrapper in obj and isinstance(obj[wrapper], (dict, list)) and all(
                k in (wrapper, "backend", "source", "version", "generated_by") for k in obj):
            inner = obj[wrapper]
            return _from_rows(inner) if isinstance(inner, list) else normalise_noop(inner, backend)
    if backend is not None and backend in obj and isinstance(obj[backend], dict):
        return normalise_noop(obj[backend], None)
    entries = []
    if all(norm_arch(k) for k in obj):  # arch first
        for arch, switches in obj.items():
            a = norm_arch(arch)
            if isinstance(switches, (list, tuple, set)):
                entries += [NoopEntry(a, s, "no-op") for s in switches]
            elif isinstance(switches, dict):
                for s, v in switches.items():
                    reason = v if isinstance(v, str) and v else _noop_reason(v)
                    if reason:
                        entries.append(NoopEntry(a, s, reason))
        return NoopTable(entries)
    for switch, per_arch in obj.items():  # switch first
        if not isinstance(per_arch, dict):
            continue
        for arch, v in per_arch.items():
            a, reason = norm_arch(arch), _noop_reason(v)
            if a and reason:
                entries.append(NoopEntry(a, switch, reason))
    return NoopTable(entries)


def effects_file(backend: str) -> Path | None:
    """The backend's switch-effects table, impls/<backend>/switch_<what>_effects.{json,yaml,yml} (<what>: what the
    table compares, e.g. cuTile's `sass`, Triton's `launch`); None without one. Two are refused, naming them."""
    found = sorted(p for p in (repo_root() / "impls" / backend).glob("switch_*effects.*")
                   if p.suffix in (".json", ".yaml", ".yml"))
    if len(found) > 1:
        raise ValueError(f"{backend}: more than one switch-effects table: {[p.name for p in found]}")
    return found[0] if found else None


def noop_table(backend: str, noop_switches=None) -> NoopTable:
    """The no-op table of `backend`: from `noop_switches` when given (any accepted layout, optionally keyed by
    backend name), else from impls/<backend>/switch_<what>_effects.*, else empty."""
    if noop_switches is not None:
        return normalise_noop(noop_switches, backend)
    path = effects_file(backend)
    if path is None:
        return NoopTable()
    if path.suffix == ".json":
        obj = json.loads(path.read_text())
    else:
        import yaml

        obj = yaml.safe_load(path.read_text())
    retired_rows = retired("effects").get(backend, [])
    if retired_rows and isinstance(obj, dict) and isinstance(obj.get("rows"), list):
        obj = {**obj, "rows": obj["rows"] + retired_rows}
    return normalise_noop(obj, backend)


def retired(part: str) -> dict:
    """One part of analysis/retired_switches.json ("defaults" or "effects"), by backend."""
    return json.loads(RETIRED_PATH.read_text())[part]


def switch_meta(backend: str) -> list[dict[str, Any]]:
    """impls.registry.switch_table of the backend's Switches ([] when the backend cannot be imported here)."""
    try:
        from impls.registry import backend_class, switch_table

        return switch_table(backend_class(backend).Switches)
    except Exception:  # noqa: BLE001 - metadata is optional for the analysis (e.g. cuda.tile absent)
        return []


# where a config comes from, not what ran differently: left out of a point's label
NOT_A_VARIANT = ("tuning",)


def explicit_switches(backend: str, switches: dict) -> dict:
    """The switches of a point that differ from the backend's declared defaults (tuning mode aside): what makes a
    point a variant rather than the backend as published. {} when the backend's metadata is unavailable."""
    declared = {r["name"]: r["default"] for r in switch_meta(backend)}
    if declared:  # a retired switch away from its default still makes a variant of its committed rows
        declared = {**retired("defaults").get(backend, {}), **declared}
    # None: not recorded (a row written before the switch existed ran what is now its default)
    return {k: v for k, v in switches.items()
            if k in declared and k not in NOT_A_VARIANT and v is not None and v != declared[k]}


def meaning(backend: str, switch: str, arch: str) -> str:
    """What `switch` does on `arch` (sm_90 / sm_100 text of the declaration, else its help)."""
    for row in switch_meta(backend):
        if row["name"] == switch:
            key = {"sm_90": "sm90", "sm_100": "sm100"}.get(arch)
            return str(row.get(key) or row.get("help") or "")
    return ""
