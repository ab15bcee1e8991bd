"""Launch configurations of the tuned backends (cutile, triton, tilegym): the one protocol that chooses them.

A backend describes one stage's choice as a `Tunable` — its record key, its declared search space, how to run a
config as the whole stage, optionally a kernel-only timer, its fallback — and calls `resolve(tunable)`. The rest is
here, the same for every backend:

1. explicit pins: switches that fix every tuned field give the source "switches"; pins fixing some fields win over
   whatever config is chosen (`Tunable.pins`).
2. the record: tuning/<gpu slug>/<backend>_<stage>.json -> {"backend", "stage", "gpu", "entries": {key: record}};
   the file names the GPU, the key the stage's code-changing switches, shape and dtype (`tuning_key`), and the
   record's "versions" the software stack it was searched on. A record is *usable* when that stack matches today's
   (`Tunable.stack`: cuda-tile, tileiras, triton, tilegym, driver major, whichever the backend depends on); a record
   whose versions could not be established (`versions_unverified`) is used and says so.
   `Tunable.same_sass_key`, `Tunable.near_key`, then `Tunable.base_key`: the records borrowed, in that order (modes
   auto/record), when the key has none of its own (the baseline's record where the backend's switch-effects data says
   the stage's code is the baseline's; the record of the same switch set without the tricks that borrow tiles, so an
   ablation arm on top of a target's defaults runs on those defaults' tiles; a default code trick turned off runs on
   the default code's tiles).
3. the mode (`MODES`):
   - "auto":     a usable record, else the fallback; the resolution says why it fell back;
   - "record":   a usable record, else an error naming the file and the reason;
   - "fallback": the backend's fixed config, no file read;
   - "search":   search now (from scratch) and store the winner;
   - "resume":   a usable record searched over today's space (and confirmed where the backend confirms), else a
                 search that skips the configs a previous, interrupted search of the same space and stack already
                 measured (partial progress: <backend>_<stage>.partial.json, written after every config).
4. the search: every config of the declared space timed by the backend's kernel-only timer (else the whole stage
   with do_bench's median); then the fastest CONFIRM_TOP (plus `Tunable.candidates`' extras) timed again as whole
   stages (do_bench median) and the fastest stage wins — a kernel-only timer can leave kernels of the stage out.
   A config that fails to compile or launch, or whose whole stage writes NaN/Inf on the call's finite inputs
   (`nonfinite_output`), is a failure of the record, never a winner.
   A backend with its own autotuner (TileGym) passes `Tunable.own_search` instead: what it chose is stored the
   same way.
5. the record stored, atomically: config, search space and its hash, versions, date, every measured config,
   failures, the confirmation.
6. the tile protocol (`Resolution.protocol`, TILE_PROTOCOLS): how the tiles relate to the baseline switch set's,
   so that an ablation never reads a change of tiles as the effect of a switch.

Progress of a search goes to stdout: configs done / total and the best so far (every config on a terminal, else
one line per PROGRESS_INTERVAL_S seconds).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import functools
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MODES = ("auto", "search", "record", "fallback", "resume")
ROOT = Path(__file__).resolve().parent.parent / "tuning"
CONFIRM_TOP = 4  # the search's best configs (by its timer) timed again as whole stages, for every backend
PROGRESS_INTERVAL_S = 10.0  # progress lines when stdout is not a terminal
# the software a record is bound to, as named in records: distribution names, plus "tileiras" and "driver" (major)
STACK = ("cuda-tile", "tileiras", "triton", "tilegym", "driver")


# Where a stage's tiles came from, as rows record it (column `tile_protocol`, experiments/README.md): the first six
# from `resolve`, the rest from backends and the harness. An ablation compares two points' times as a switch's effect
# only where both are RETUNED or SAME_SASS.
RETUNED, RETUNED_NARROWER, SAME_SASS, PINNED = "retuned", "retuned-narrower", "same-sass", "pinned"
FALLBACK, SWITCHES = "fallback", "switches"
TILE_PROTOCOLS = {
    RETUNED: "searched under the point's own switch set (its record, or a search now), over a space covering the one "
             "that set declares and the baseline set's",
    RETUNED_NARROWER: "searched under the point's own switch set, over a space narrower than the one that set "
                      "declares today or than the baseline set's (the record names the fields it lacks)",
    SAME_SASS: "the baseline's record: the backend's switch-effects data says the stage's code is the baseline's "
               "(cuTile: the same normalised sm_90 SASS; Triton: the same launches), or the stage's record key is "
               "the baseline's (the switch is none of the stage's code-changing switches)",
    PINNED: "another switch set's tiles borrowed (base_key: the baseline's tiles for a trick turned off), "
            "where the stage's code differs from that set's",
    FALLBACK: "no usable record (or tuning=fallback): the backend's fixed fallback tiles",
    SWITCHES: "every tuned field fixed by a switch",
    "untuned": "a backend with no launch configuration to choose (the reference)",
    "peer-autotune": "a peer whose own autotuners pick its configs on the first call (mamba-ssm, vLLM, FLA)",
    "unknown": "the point recorded no describe() with protocols (failed before timing; a backend that does not say)",
    "n/a": "a row of no backend's kernels (stage `ceiling`)",
}
# the protocols whose times a switch's effect may be read from (both points of the comparison)
COMPARABLE = (RETUNED, SAME_SASS)


def join_protocols(protocols) -> str:
    """Distinct protocols (each may be joined already) in TILE_PROTOCOLS' order, others last, joined by "+"."""
    distinct = {p for text in protocols for p in str(text).split("+")}
    order = list(TILE_PROTOCOLS)
    return "+".join(sorted(distinct, key=lambda p: (order.index(p) if p in order else len(order), p)))


# --- how each switch enters the record key ---------------------------------------------------------------------------
# Every switch of a tuned backend has one of these roles in its backend's KEY_ROLES (<backend>/tune.py), so that no new
# switch leaves the key by omission: tests/harness/test_tuning.py fails on a switch without a role, and checks each role
# against the backend's record key and pins (adding a switch: docs/add-a-switch.md).
KEY, PIN, KERNELS, NEITHER = "key", "pin", "kernels", "neither"
KEY_ROLES = {
    KEY: "changes the code of the stages it reaches: in their record key (at least away from its default), so its "
         "configs are searched and stored apart",
    PIN: "fixes launch-config fields over any record or search (0: from tuning)",
    KERNELS: "picks which kernels run: their own stage, or a flag of the call, keys their records",
    NEITHER: "changes no kernel's code and no config (where configs come from, the host's launch path, a search's "
             "workers)",
}


def unclassified(switches_cls, roles: dict[str, str]) -> list[str]:
    """What is wrong with a backend's KEY_ROLES: its switches without a role, names that are no switch of it, and
    roles that are not KEY_ROLES'; empty when every switch has exactly one known role."""
    import dataclasses

    names = [f.name for f in dataclasses.fields(switches_cls)]
    return ([f"switch {n!r} has no key role" for n in names if n not in roles]
            + [f"{n!r} is no switch of {switches_cls.__name__}" for n in roles if n not in names]
            + [f"{n!r}: unknown role {r!r} (KEY_ROLES: {sorted(KEY_ROLES)})" for n, r in roles.items()
               if r not in KEY_ROLES])


# --- the record store -----------------------------------------------------------------------------------------------
def tuning_dir() -> Path:
    return Path(os.environ.get("SSD_TUNING_DIR", ROOT))


def gpu_slug(gpu_name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", gpu_name).strip("_") or "unknown"


def tuning_key(shape_label: str, dtype: str, **extra) -> str:
    parts = [shape_label, dtype] + [f"{k}={v}" for k, v in sorted(extra.items())]
    return "|".join(parts)


def switches_key(shape_label: str, dtype: str, switches, always: tuple[str, ...], away: tuple[str, ...],
                 flags: dict) -> str:
    """A record key of the switches `always` names, of those `away` names where they differ from their declared
    values (`type(switches)()`: records stored before such a switch existed keep their keys), and the call's flags."""
    declared = type(switches)()
    keyed = {name: getattr(switches, name) for name in always}
    keyed.update({name: getattr(switches, name) for name in away if getattr(switches, name) != getattr(declared, name)})
    return tuning_key(shape_label, dtype, **keyed, **flags)


def record_path(backend: str, stage: str, gpu_name: str) -> Path:
    return tuning_dir() / gpu_slug(gpu_name) / f"{backend}_{stage}.json"


def partial_path(backend: str, stage: str, gpu_name: str) -> Path:
    return tuning_dir() / gpu_slug(gpu_name) / f"{backend}_{stage}.partial.json"


class RecordFileError(ValueError):
    """A tuning-record file that is not readable JSON: named, never overwritten."""


def _read(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    with path.open() as fh:
        try:
            return json.load(fh)
        except ValueError as exc:
            raise RecordFileError(f"{path}: not a readable tuning-record file ({exc}); repair or remove it") from exc


@contextlib.contextmanager
def _locked(path: Path):
    """One writer at a time for a record file's read-change-write (processes of one machine: an flock on a lock
    file kept outside the tuning folder, which is committed and shipped whole)."""
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    lock = Path(tempfile.gettempdir()) / "ssd-tuning-locks" / f"{digest}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _write(path: Path, data: dict) -> None:
    """Whole file or nothing: a temp file, fsync, rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    with tmp.open("w") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def lookup(backend: str, stage: str, gpu_name: str, key: str) -> dict[str, Any] | None:
    return _read(record_path(backend, stage, gpu_name)).get("entries", {}).get(key)


def store(backend: str, stage: str, gpu_name: str, key: str, config: dict, search_space: dict | list,
          versions: dict, **extra) -> dict[str, Any]:
    """Adds or replaces one record (with the space's hash and the date); the file is rewritten atomically."""
    path = record_path(backend, stage, gpu_name)
    record = {"config": config, "search_space": search_space, "space_hash": space_hash(search_space),
              "versions": versions, "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"), **extra}
    with _locked(path):  # another process's record stored meanwhile is read here, not lost
        data = _read(path) or {"backend": backend, "stage": stage, "gpu": gpu_name, "entries": {}}
        data["entries"][key] = record
        _write(path, data)
    from impls.registry import forget_built  # backends built before this record resolved their configs without it

    forget_built()
    return record


def space_hash(space: Any) -> str:
    return hashlib.sha256(json.dumps(space, sort_keys=True, default=str).encode()).hexdigest()[:16]


@functools.cache
def same_code_rows(path: str) -> frozenset[tuple[str, str, str, str]]:
    """(stage, dtype, switch, arch) of a backend's switch-effects table (impls/<backend>/switch_effects.json:
    {"rows": [{"stage", "dtype", "switch", "arch", "effect"}]}) whose effect says the stage's code with the switch
    alone away from its default is the defaults' ("no-op on ...")."""
    with open(path) as fh:
        rows = json.load(fh)["rows"]
    return frozenset((r["stage"], r["dtype"], r["switch"], r["arch"]) for r in rows
                     if str(r["effect"]).startswith("no-op"))


# --- the software stack ---------------------------------------------------------------------------------------------
def _run(args: list[str]) -> str | None:
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _dist_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def tileiras_version() -> str | None:
    """The wheel's version, else the `tileiras` on PATH (`tileiras --version`: "... V13.4.92")."""
    version = _dist_version("nvidia-cuda-tileiras")
    if version:
        return version
    tool = shutil.which("tileiras")
    match = re.search(r"\bV(\d+\.\d+\.\d+)", (_run([tool, "--version"]) if tool else None) or "")
    return match.group(1) if match else None


@functools.cache
def _driver_major() -> str | None:
    text = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    return text.splitlines()[0].strip().split(".")[0] if text else None


def stack_versions(names: tuple[str, ...]) -> dict[str, str | None]:
    """Today's versions of `names` (of STACK); None where absent (no driver on a CPU machine)."""
    probes = {"tileiras": tileiras_version, "driver": _driver_major}
    unknown = set(names) - set(STACK)
    if unknown:
        raise ValueError(f"tuning stack: unknown component(s) {sorted(unknown)}; expected some of {STACK}")
    return {n: probes[n]() if n in probes else _dist_version(n) for n in names}


def stack_mismatch(record: dict, today: dict[str, str | None]) -> str | None:
    """Why `record` was searched on another stack than `today`, or None when it matches. A version the record
    lacks counts as a mismatch unless the record is flagged versions_unverified (used, and said so)."""
    stored = record.get("versions") or {}
    for name, now in today.items():
        if name not in stored:
            if record.get("versions_unverified"):
                continue
            return f"the record has no {name} version (today {now})"
        if stored[name] != now:
            return f"{name} {stored[name]} in the record, {now} today"
    return None


# --- what a backend hands over, what it gets back ------------------------------------------------------------------
Timer = Callable[[dict], "float | dict"]


@dataclass
class Tunable:
    """One stage's choice of launch config, as a backend describes it."""

    backend: str
    stage: str
    key: str  # tuning_key(...): shape, dtype, the code-changing switches
    gpu: str  # the record file's GPU
    mode: str  # one of MODES
    fallback: dict  # the fixed config (pins already applied, if the backend wants them there)
    space: Any = None  # the declared search space, stored with the record (a change makes `resume` search again)
    configs: list[dict] = field(default_factory=list)  # the configs a search measures, in order
    run: Callable[[dict], Any] | None = None  # the whole stage with a config (confirmation; default timer)
    timer: Timer | None = None  # kernel-only time of one config, µs (or {"us": ..., extras}); raises if it fails
    candidates: Callable[[list[dict]], list[dict]] | None = None  # extra configs to confirm, from the ranking
    pins: dict = field(default_factory=dict)  # fields the switches fix; they win over any chosen config
    pinned_all: bool = False  # the pins fix every tuned field: no record, no search (source "switches")
    base_key: str | None = None  # record borrowed in auto/record when `key` (and the two below) has none
    # the same switch set without the tricks that borrow their tiles (the arm's baseline, e.g. a target's defaults):
    # borrowed after `same_sass_key`, before `base_key`
    near_key: str | None = None
    # the baseline's key where the stage's code is the baseline's (the backend's switch-effects data, or the same
    # key): its record is borrowed first in auto/record, protocol SAME_SASS
    same_sass_key: str | None = None
    baseline_space: Any = None  # the space the baseline switch set declares: a narrower search is RETUNED_NARROWER
    stack: tuple[str, ...] = ()  # the software (of STACK) a record is bound to
    own_search: Callable[[], dict] | None = None  # a backend's own autotuner: runs it, returns the chosen config
    stage_timer: Callable[[Callable[[], Any]], float] | None = None  # whole-stage timer in ms (default: do_bench)
    # what `nonfinite_output` reads of a config's outputs (default: `run`'s whole outputs): the whole stage's outputs
    # where run is None, or the elements a stage writes by design (impls.chunked_backward.written_elements)
    output: Callable[[dict], Any] | None = None


@dataclass
class Resolution:
    """The config a stage runs with and where it came from; `as_dict` goes into describe() and so into rows."""

    config: dict
    source: str  # "switches" | "record" | "search" | "fallback"
    key: str = ""  # the record key used (the borrowed one when borrowed)
    reason: str = ""  # why a fallback ran or a record was borrowed / searched again
    versions_unverified: bool = False
    protocol: str = ""  # TILE_PROTOCOLS: how these tiles relate to the baseline switch set's

    def as_dict(self) -> dict[str, Any]:
        out = {"config": dict(self.config), "source": self.source, "key": self.key, "tile_protocol": self.protocol}
        if self.reason:
            out["reason"] = self.reason
        if self.versions_unverified:
            out["versions_unverified"] = True
        return out


def resolve(t: Tunable) -> Resolution:
    """The config `t.stage` runs with (module docstring: pins -> record -> mode -> search -> store -> fallback)."""
    if t.mode not in MODES:
        raise ValueError(f"tuning: expected one of {MODES}, got {t.mode!r}")
    if t.pinned_all:
        return Resolution(dict(t.pins), "switches", t.key, "every tuned field fixed by a switch", protocol=SWITCHES)
    if t.mode == "fallback":
        return _pinned(Resolution(dict(t.fallback), "fallback", t.key, "tuning=fallback", protocol=FALLBACK), t)
    today = stack_versions(t.stack)
    if t.mode == "search":
        return _pinned(_searched(t, _search(t, today, resume=False), t.space), t)
    record, key, reason = _usable_record(t, today)
    if t.mode == "resume":
        stale = reason or _stale(t, record)
        if record is None or stale:
            found = _searched(t, _search(t, today, resume=True), t.space)
            found.reason = "; ".join(r for r in (stale or "no record", found.reason) if r)
            return _pinned(found, t)
        return _pinned(_from_record(t, record, key, ""), t)
    if record is not None and not reason:
        borrowed = f"borrowed the record of {key}" if key != t.key else ""
        return _pinned(_from_record(t, record, key, borrowed), t)
    if t.mode == "record":
        where = record_path(t.backend, t.stage, t.gpu)
        raise ValueError(f"tuning: no usable record for {t.backend}/{t.stage} key {t.key!r} in {where}: {reason}")
    return _pinned(Resolution(dict(t.fallback), "fallback", t.key, reason or "no record", protocol=FALLBACK), t)


def _pinned(res: Resolution, t: Tunable) -> Resolution:
    res.config.update(t.pins)
    return res


def declared_fields(t: Tunable) -> set[str] | None:
    """The config fields the stage reads: its declared search space's (a dict of values per field), its fallback's
    and its pins'; None where the stage declares no such space (a backend whose own autotuner writes its records,
    TileGym's: nothing of ours to check them against)."""
    if not isinstance(t.space, dict):
        return None
    return set(t.space) | set(t.fallback) | set(t.pins)


def check_fields(t: Tunable, record: dict, key: str) -> None:
    """Raises RecordFileError when the record's config holds a field the stage does not read (a misspelt or stale
    field would otherwise run silently on the stage's default for it)."""
    fields = declared_fields(t)
    unknown = sorted(set(record["config"]) - fields) if fields is not None else []
    if unknown:
        raise RecordFileError(f"{record_path(t.backend, t.stage, t.gpu)}: record {key!r} has config field(s) "
                              f"{unknown} that {t.backend}/{t.stage} does not read (its fields: {sorted(fields)}); "
                              "repair or remove the record")


def _from_record(t: Tunable, record: dict, key: str, reason: str) -> Resolution:
    unverified = bool(record.get("versions_unverified"))
    res = Resolution(dict(record["config"]), "record", key, reason, unverified)
    if key == t.same_sass_key:
        res.protocol = SAME_SASS
        if key != t.key:
            res.reason = f"{reason}: the stage's code is that key's (switch effects)"
    elif key != t.key:
        res.protocol = PINNED
    else:
        res = _searched(t, res, record.get("search_space"))
    if unverified:
        res.reason = "; ".join(r for r in (res.reason, "record's versions unverified") if r)
    return res


def _searched(t: Tunable, res: Resolution, searched: Any) -> Resolution:
    """`res` (tiles searched under the point's own key, over `searched`) marked RETUNED, or RETUNED_NARROWER with
    the gaps in its reason when `searched` lacks values of the space the stage declares or of the baseline's."""
    gaps = space_gaps(searched, t.space) + space_gaps(searched, t.baseline_space, "the baseline's ")
    res.protocol = RETUNED_NARROWER if gaps else RETUNED
    if gaps:
        res.reason = "; ".join(r for r in (res.reason, "searched over a narrower space: " + "; ".join(gaps)) if r)
    return res


def space_gaps(searched: Any, declared: Any, whose: str = "") -> list[str]:
    """What of the `declared` space a search over `searched` did not cover ([] when it covers it, or when nothing
    is declared): per field of a dict space the values it lacks; for a list of configs (TileGym's) the count of
    configs it lacks."""
    if declared is None:
        return []
    if searched is None:
        return ["the record names no search space"]
    if isinstance(declared, dict) and isinstance(searched, dict):
        return [f"{field} lacks {whose}{lacking}" for field, values in declared.items()
                if (lacking := [v for v in values if v not in searched.get(field, [])])]
    if isinstance(declared, list) and isinstance(searched, list):
        have = {json.dumps(c, sort_keys=True, default=str) for c in searched}
        lacking = [c for c in declared if json.dumps(c, sort_keys=True, default=str) not in have]
        return [f"{len(lacking)} of {whose}{len(declared)} declared configs"] if lacking else []
    return [f"a space of another layout than {whose}the declared one"]


def _usable_record(t: Tunable, today: dict) -> tuple[dict | None, str, str]:
    """(record, its key, why it cannot be used or ""): the key's own record, else (auto/record) the same-SASS key's,
    the near key's, then the base key's; a record holding a field the stage does not read raises (`check_fields`)."""
    record = lookup(t.backend, t.stage, t.gpu, t.key)
    key = t.key
    for borrowed in (t.same_sass_key, t.near_key, t.base_key):
        if record is None and borrowed and t.mode in ("auto", "record"):
            record, key = lookup(t.backend, t.stage, t.gpu, borrowed), borrowed
    if record is None:
        return None, t.key, "no record"
    check_fields(t, record, key)
    mismatch = stack_mismatch(record, today)
    return record, key, f"searched on another stack: {mismatch}" if mismatch else ""


def _stale(t: Tunable, record: dict) -> str:
    """Why `resume` searches again although a usable record exists: another space, or never confirmed where this
    backend confirms."""
    if record.get("search_space") != t.space:
        return "the record was searched over another space"
    if t.run is not None and t.own_search is None and not record.get("confirmed"):
        return "the record was never confirmed as whole stages"
    return ""


# --- the search -----------------------------------------------------------------------------------------------------
def _search(t: Tunable, today: dict, resume: bool) -> Resolution:
    versions = {**today, "torch": _dist_version("torch")}  # torch for the record's provenance; not compared
    if t.own_search is not None:
        config = dict(t.own_search())
        store(t.backend, t.stage, t.gpu, t.key, config, t.space, versions,
              searched_by=f"{t.backend}'s own autotuner")
        return Resolution(config, "search", t.key)
    if not t.configs:
        raise ValueError(f"tuning: {t.backend}/{t.stage} has an empty search space")
    measurements, failures = _measure(t, today, resume)
    ranked = [m["config"] for m in sorted(measurements, key=lambda m: m["us"])]
    best, confirmed = ranked[0], []
    if t.run is not None:
        confirmed = confirm(confirm_candidates(ranked, t.candidates), t.run, _stage_timer(t))
        best = confirmed[0]["config"]
    timer = "kernel-only (the backend's)" if t.timer else f"whole stage ({_stage_timer(t).__name__})"
    store(t.backend, t.stage, t.gpu, t.key, best, t.space, versions, timer=timer,
          search_us=next(m["us"] for m in measurements if m["config"] == best),
          confirmed=confirmed, measurements=measurements, failures=failures)
    _drop_partial(t)
    return Resolution(dict(best), "search", t.key)


def _measure(t: Tunable, today: dict, resume: bool) -> tuple[list[dict], list[dict]]:
    """Every config of `t.configs` timed once (the ones a previous search of the same configs and stack measured
    skipped when resuming), the progress saved after each; (measurements, failures)."""
    done = _load_partial(t, today) if resume else {"measurements": [], "failures": []}
    measurements, failures = done["measurements"], done["failures"]
    measured = [m["config"] for m in measurements] + [f["config"] for f in failures]
    progress = Progress(f"{t.backend}/{t.stage} {t.key}", len(t.configs))
    timer = t.timer or (lambda cfg: 1000.0 * _stage_timer(t)(lambda: t.run(cfg)))
    for cfg in t.configs:
        if cfg in measured:
            continue
        try:
            m = timer(cfg)
            bad = nonfinite_output(t.output or t.run, cfg)
            if bad:
                raise ArithmeticError(bad)
            measurements.append({"config": cfg, **(m if isinstance(m, dict) else {"us": round(m, 2)})})
        except Exception as exc:  # a config that does not compile, fit or launch, or writes NaN/Inf
            failures.append({"config": cfg, "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
        measured.append(cfg)
        _save_partial(t, today, measurements, failures)
        progress.update(len(measured), min(measurements, key=lambda m: m["us"], default=None))
    progress.finish(len(measured), min(measurements, key=lambda m: m["us"], default=None))
    if not measurements:
        raise RuntimeError(f"tuning {t.backend}/{t.stage}: no config of the search space ran; first failure: "
                           f"{failures[0] if failures else 'none tried'}")
    return measurements, failures


def nonfinite_output(run: Callable[[dict], Any] | None, cfg: dict) -> str:
    """Why the stage's output under `cfg` cannot be kept ("" when every floating element is finite, or when there is
    no whole-stage call to ask): a config the compiler gets wrong (a warpgroup MMA left running while its register
    operand is overwritten writes NaN/Inf rows on sm_90, as vLLM's chunk-scan autotuner records of Triton) must not
    win the search on its speed. The search's inputs are the call's own, finite. `run` is `Tunable.output` where
    given (the search confirms nothing: cuTile's chunk_cumsum, serial stage 2 and fused kernel; or a backward stage
    whose buffers are written in part by design), else the stage's whole call; measurements a resumed search reads
    from a partial file were asked when they were taken, if the code then did."""
    if run is None:
        return ""
    import torch

    stack = [run(cfg)]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            if item.is_floating_point() and not bool(torch.isfinite(item).all()):
                return f"non-finite values in the stage's output, shape {tuple(item.shape)} (a miscompiled config?)"
        elif isinstance(item, (tuple, list)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif hasattr(item, "__dataclass_fields__"):
            stack.extend(getattr(item, f) for f in item.__dataclass_fields__)
    return ""


def confirm_candidates(ranked: list[dict], extra: Callable[[list[dict]], list[dict]] | None = None) -> list[dict]:
    """The configs to time as whole stages: the CONFIRM_TOP best of the ranking, plus `extra(ranked)` not among
    them."""
    picked = list(ranked[:CONFIRM_TOP])
    for cfg in extra(ranked) if extra else []:
        if cfg not in picked:
            picked.append(cfg)
    return picked


def do_bench_ms(fn: Callable[[], Any]) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def wall_ms(fn: Callable[[], Any], reps: int = 3) -> float:
    """Median wall time of `reps` calls (after one): for CPU runs (the Triton interpreter), where do_bench cannot."""
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(1000.0 * (time.perf_counter() - start))
    return sorted(times)[len(times) // 2]


def _stage_timer(t: Tunable) -> Callable[[Callable[[], Any]], float]:
    return t.stage_timer or do_bench_ms


def confirm(candidates: list[dict], run_config: Callable[[dict], Any],
            timer: Callable[[Callable[[], Any]], float] | None = None) -> list[dict]:
    """Each candidate timed as the whole stage (`run_config(config)`), median of `timer` (ms; do_bench's by
    default) in µs; sorted, fastest first."""
    timer = timer or do_bench_ms
    timed = []
    for cfg in candidates:
        run_config(cfg)  # compiled already by the search; one call more to settle allocations
        timed.append({"config": cfg, "stage_median_us": round(1000.0 * timer(lambda cfg=cfg: run_config(cfg)), 2)})
    return sorted(timed, key=lambda t: t["stage_median_us"])


def _partial_id(t: Tunable, today: dict) -> dict:
    return {"space_hash": space_hash(t.configs), "versions": today}


def _load_partial(t: Tunable, today: dict) -> dict:
    """What an interrupted search of the same configs on the same stack measured (nothing otherwise)."""
    entry = _read(partial_path(t.backend, t.stage, t.gpu)).get(t.key)
    if entry and {k: entry.get(k) for k in ("space_hash", "versions")} == _partial_id(t, today):
        return {"measurements": list(entry["measurements"]), "failures": list(entry["failures"])}
    return {"measurements": [], "failures": []}


def _save_partial(t: Tunable, today: dict, measurements: list, failures: list) -> None:
    path = partial_path(t.backend, t.stage, t.gpu)
    with _locked(path):
        data = _read(path)
        data[t.key] = {**_partial_id(t, today), "measurements": measurements, "failures": failures}
        _write(path, data)


def _drop_partial(t: Tunable) -> None:
    path = partial_path(t.backend, t.stage, t.gpu)
    with _locked(path):
        data = _read(path)
        if data.pop(t.key, None) is not None:
            if data:
                _write(path, data)
            else:
                path.unlink()


class Progress:
    """Configs done / total and the best so far: every update on a terminal, else one line per `interval` s."""

    def __init__(self, label: str, total: int, stream=None, interval: float = PROGRESS_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic):
        self.label, self.total, self.stream, self.interval, self.clock = label, total, stream, interval, clock
        self.last = clock()

    def _out(self):
        return self.stream or sys.stdout

    def line(self, done: int, best: dict | None) -> str:
        shown = f"best {best['us']:.1f} µs {best['config']}" if best else "none ran yet"
        return f"tuning {self.label}: {done}/{self.total} configs, {shown}"

    def update(self, done: int, best: dict | None) -> None:
        out = self._out()
        now = self.clock()
        if (hasattr(out, "isatty") and out.isatty()) or now - self.last >= self.interval:
            print(self.line(done, best), file=out, flush=True)
            self.last = now

    def finish(self, done: int, best: dict | None) -> None:
        print(self.line(done, best), file=self._out(), flush=True)
