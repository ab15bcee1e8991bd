"""`python -m experiments.merge <dir> <file>`: every Parquet under <dir> (one per job) into one file, atomically."""

from __future__ import annotations

import argparse
from pathlib import Path

from experiments import store


def merge(source: Path, target: Path) -> int:
    df = store.load(source)
    store.write_atomic(df, target)
    return len(df)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    args = parser.parse_args(argv)
    n = merge(args.source, args.target)
    print(f"[merge] {n} rows from {len(store.parquet_files(args.source))} files -> {args.target}")


if __name__ == "__main__":
    main()
