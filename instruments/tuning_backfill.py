"""Backfills the software versions of stored tuning records from the result rows of the run that searched them.

Records written before impls/tuning.py bound records to the stack keep fewer versions (cuda.tile and torch). The
rows of the run that produced a record carry them all (v_cuda_tile, v_tileiras, v_triton, v_tilegym, driver): the
producing run is the latest row, at most WINDOW before the record's date, of the same backend, GPU, shape and dtype
whose `tuning` column says the record's stage was searched, and whose versions agree with those the record kept.
A record with no such row, or whose row lacks a version the stack needs, gets `versions_unverified: true` (still
used; the flag shows in describe() and so in the rows).

    python -m instruments.tuning_backfill [--results results] [--tuning tuning] [--dry-run]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
from pathlib import Path

import pandas as pd

from impls import tuning

WINDOW = dt.timedelta(minutes=20)  # a search of one point takes minutes; the record is written when it ends
ROW_VERSIONS = {"cuda-tile": "v_cuda_tile", "tileiras": "v_tileiras", "triton": "v_triton", "tilegym": "v_tilegym"}
OLD_NAMES = {"cuda.tile": "cuda-tile"}  # version names records used before
LABEL = re.compile(r"b(?P<batch>\d+)-l(?P<seqlen>\d+)-h(?P<nheads>\d+)(?:-p(?P<headdim>\d+)-g(?P<ngroups>\d+)"
                   r"-n(?P<dstate>\d+))?-c(?P<chunk_size>\d+)")


def searched_rows(results: Path) -> pd.DataFrame:
    """Rows of every results/*/*.parquet where some stage was searched (one per point: the first row)."""
    frames = []
    for path in sorted(results.glob("*/*.parquet")):
        frame = pd.read_parquet(path)
        if "tuning" not in frame.columns or "timestamp" not in frame.columns:
            continue
        frame = frame[frame["tuning"].str.contains('"search"', na=False)]
        frames.append(frame.drop_duplicates(["timestamp", "backend", "tuning"]).assign(
            file=str(path.relative_to(results.parent))))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def row_versions(row) -> dict[str, str | None]:
    out = {name: (None if str(row.get(col)) in ("absent", "None", "nan", "") else str(row.get(col)))
           for name, col in ROW_VERSIONS.items()}
    driver = row.get("driver")
    out["driver"] = str(driver).split(".")[0] if isinstance(driver, str) and driver else None
    return out


def producing_row(rows: pd.DataFrame, backend: str, stage: str, gpu: str, key: str, record: dict):
    """The latest row before the record's date (within WINDOW) of the run that searched it, or None."""
    match = LABEL.match(key)
    if match is None or rows.empty:
        return None
    dims = {k: int(v) for k, v in match.groupdict().items() if v is not None and int(v)}
    dtype = key.split("|")[1]
    date = dt.datetime.fromisoformat(record["date"])
    best = None
    for _, row in rows[(rows["backend"] == backend) & (rows["gpu_name"] == gpu) & (rows["dtype"] == dtype)].iterrows():
        if any(int(row[k]) != v for k, v in dims.items()):
            continue
        if json.loads(row["tuning"]).get(stage) != "search":
            continue
        when = dt.datetime.fromisoformat(row["timestamp"])
        if not date - WINDOW <= when <= date:
            continue
        if best is None or when > dt.datetime.fromisoformat(best["timestamp"]):
            best = row
    return best


def stack(backend: str) -> tuple[str, ...]:
    """The software a record of `backend` is bound to, as the backend declares it."""
    from impls.cutile import tune as cutile_tune
    from impls.tilegym import tune as tilegym_tune
    from impls.triton import tune as triton_tune

    return {"cutile": cutile_tune.STACK, "triton": triton_tune.STACK, "tilegym": tilegym_tune.STACK}[backend]


def backfilled(record: dict, backend: str, row) -> dict:
    """The record with its versions named as impls/tuning.py names them, filled from `row` where it agrees with
    what the record kept; flagged versions_unverified where a version of the backend's stack stays unknown."""
    kept = {OLD_NAMES.get(k, k): v for k, v in (record.get("versions") or {}).items()}
    versions = dict(kept)
    source = None
    if row is not None:
        found = row_versions(row)
        if all(found.get(k) in (None, v) for k, v in kept.items() if k in found):
            versions.update({k: v for k, v in found.items() if v is not None and k in stack(backend)})
            source = f"{row['file']} row of {row['timestamp']}"
    out = {**record, "versions": versions}
    out.pop("versions_unverified", None)
    out.pop("versions_from", None)
    if source:
        out["versions_from"] = source
    if any(versions.get(k) is None for k in stack(backend)):
        out["versions_unverified"] = True
    return out


def backfill(results: Path, tuning_root: Path, dry_run: bool = False) -> list[tuple[str, str, bool]]:
    """Rewrites every record file under tuning_root; returns (file, key, verified) per record."""
    rows = searched_rows(results)
    report = []
    for path in sorted(tuning_root.glob("*/*.json")):
        if path.name.endswith(".partial.json"):
            continue
        data = json.loads(path.read_text())
        backend, stage, gpu = data["backend"], data["stage"], data["gpu"]
        for key, record in data["entries"].items():
            data["entries"][key] = backfilled(record, backend, producing_row(rows, backend, stage, gpu, key, record))
            report.append((path.name, key, not data["entries"][key].get("versions_unverified")))
        if not dry_run:
            tuning._write(path, data)
    return report


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=tuning.ROOT.parent / "results")
    parser.add_argument("--tuning", type=Path, default=tuning.ROOT)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    for name, key, verified in backfill(args.results, args.tuning, args.dry_run):
        print(f"{'verified  ' if verified else 'UNVERIFIED'} {name} {key}")


if __name__ == "__main__":
    main()
