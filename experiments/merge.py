"""`python -m experiments.merge <dir> <file>`: every Parquet under <dir> (one per job) into one file, atomically.

A missing or empty <dir> is refused (writing an empty file would replace a merged file's rows with none), and so is
a <file> inside <dir> (a second merge would read its own output and count every row twice)."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness import store


class MergeError(ValueError):
    """The merge's arguments would lose or duplicate rows."""


def merge(source: Path, target: Path) -> tuple[int, int]:
    """(rows, files) merged from `source` into `target`."""
    source, target = Path(source), Path(target)
    if not source.is_dir():
        raise MergeError(f"source: {source} is not a folder")
    if target.resolve().is_relative_to(source.resolve()):
        raise MergeError(f"target: {target} is inside source {source}; a later merge would read it back as a job's "
                         "rows. Write the merged file outside the folder")
    files = store.parquet_files(source)
    if not files:
        raise MergeError(f"source: no Parquet files under {source}; nothing written to {target}")
    df = store.load(source)
    store.write_atomic(df, target)
    return len(df), len(files)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    args = parser.parse_args(argv)
    try:
        rows, files = merge(args.source, args.target)
    except MergeError as exc:
        parser.error(str(exc))
    print(f"[merge] {rows} rows from {files} files -> {args.target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
