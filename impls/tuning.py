"""Tuning records shared by the tuned backends (cutile, triton, tilegym): one JSON file per backend and stage.

Layout: tuning/<gpu slug>/<backend>_<stage>.json  ->  {"backend", "stage", "gpu", "entries": {key: record}}
where key names the shape and dtype (`tuning_key`) and a record holds the chosen config, the search space, the
versions it was found with, the date and the measured median. Modes:
- "search":   run the backend's search, store the winner, use it;
- "record":   use the stored record; none stored is an error;
- "fallback": a fixed config per architecture, no file read;
- "auto":     record when one is stored, else fallback (the default);
- "resume":   record when one is stored, else search and store: an interrupted search (a device call's time limit)
              picks up at the first stage without a record.
Every result row records which source ran ("search", "record" or "fallback").
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

MODES = ("auto", "search", "record", "fallback", "resume")
ROOT = Path(__file__).resolve().parent.parent / "tuning"


def tuning_dir() -> Path:
    return Path(os.environ.get("SSD_TUNING_DIR", ROOT))


def gpu_slug(gpu_name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", gpu_name).strip("_") or "unknown"


def tuning_key(shape_label: str, dtype: str, **extra) -> str:
    parts = [shape_label, dtype] + [f"{k}={v}" for k, v in sorted(extra.items())]
    return "|".join(parts)


def record_path(backend: str, stage: str, gpu_name: str) -> Path:
    return tuning_dir() / gpu_slug(gpu_name) / f"{backend}_{stage}.json"


def _read(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    with path.open() as fh:
        return json.load(fh)


def lookup(backend: str, stage: str, gpu_name: str, key: str) -> dict[str, Any] | None:
    return _read(record_path(backend, stage, gpu_name)).get("entries", {}).get(key)


def store(backend: str, stage: str, gpu_name: str, key: str, config: dict, search_space: dict | list,
          versions: dict, **extra) -> dict[str, Any]:
    """Adds or replaces one record; the file is rewritten atomically (temp file + rename)."""
    path = record_path(backend, stage, gpu_name)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = _read(path) or {"backend": backend, "stage": stage, "gpu": gpu_name, "entries": {}}
    record = {"config": config, "search_space": search_space, "versions": versions,
              "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"), **extra}
    data["entries"][key] = record
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    with tmp.open("w") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    from impls.registry import forget_built  # backends built before this record resolved their configs without it

    forget_built()
    return record


def effective_mode(mode: str, backend: str, stage: str, gpu_name: str, key: str) -> str:
    """"resume" turned into what it means for this record: "record" when one is stored, else "search"; any other
    mode as given."""
    if mode == "resume":
        return "record" if lookup(backend, stage, gpu_name, key) is not None else "search"
    return mode


def resolve(mode: str, backend: str, stage: str, gpu_name: str, key: str, fallback: dict,
            search: Callable[[], tuple[dict, dict]] | None = None) -> tuple[dict, str]:
    """The config to run and where it came from. `search()` returns (config, record extras incl. search_space
    and versions) and is only called in "search" mode."""
    if mode not in MODES:
        raise ValueError(f"tuning: expected one of {MODES}, got {mode!r}")
    if mode == "fallback":
        return dict(fallback), "fallback"
    mode = effective_mode(mode, backend, stage, gpu_name, key)
    if mode == "search":
        if search is None:
            raise ValueError(f"tuning: backend {backend!r} stage {stage!r} has no search")
        config, extras = search()
        store(backend, stage, gpu_name, key, config, extras.pop("search_space", {}), extras.pop("versions", {}),
              **extras)
        return dict(config), "search"
    record = lookup(backend, stage, gpu_name, key)
    if record is not None:
        return dict(record["config"]), "record"
    if mode == "record":
        raise ValueError(f"tuning: no record for {backend}/{stage} key {key!r} in {record_path(backend, stage, gpu_name)}")
    return dict(fallback), "fallback"
