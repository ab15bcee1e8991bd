"""Print the node ids of the tests under PATH... whose id matches a regular expression, one per line.

    python scripts/select_tests.py REGEX PATH [PATH ...]

`scripts/gpu_session.sh tests_matching` runs exactly those: on the GPU image's pytest 9.1.1, `-k` with `or` matched
every test of a file (docs/gpu-runbook.md), so a selection by words is made here, from the collected ids, with
Python's `re.search`. Exit status 1 when nothing matches (nothing would run).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # pytest's rootdir: the ids it prints are relative to it


def collected(paths: list[str]) -> list[str]:
    """The node ids pytest collects under `paths` (relative to the repository or absolute; collection only: nothing
    runs, no GPU is touched), with absolute paths."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *paths],
                          capture_output=True, text=True, cwd=ROOT)
    # absolute, so that the ids run from any working directory
    ids = [str(ROOT / line.strip()) for line in done.stdout.splitlines() if "::" in line]
    if done.returncode not in (0, 5) or not ids and done.returncode != 5:
        raise RuntimeError(f"pytest could not collect {paths}: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    return ids


def matching(pattern: str, paths: list[str]) -> list[str]:
    rx = re.compile(pattern)
    return [node for node in collected(paths) if rx.search(node)]


def main(argv: list[str]) -> int:
    if {"-h", "--help"} & set(argv):
        print(__doc__)
        return 0
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    ids = matching(argv[0], argv[1:])
    print("\n".join(ids))
    return 0 if ids else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
