"""`python -m analysis.notebooks [NAME ...]`: the analysis notebooks, executed. Each notebooks/<NAME>.py (a jupytext
percent script, the only form kept in git) is run top to bottom in a fresh kernel from notebooks/ and written next to
it as <NAME>.ipynb with its outputs (ignored by git). $SSD_RESULTS sets their parameter, as in Jupyter."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

NOTEBOOK_DIR = Path(__file__).resolve().parents[1] / "notebooks"


def sources() -> list[Path]:
    return sorted(NOTEBOOK_DIR.glob("0*.py"))


def execute(path: Path, timeout: int = 300):
    """The notebook of the percent script `path`, executed with its folder as the working folder."""
    import jupytext
    import nbclient

    nb = jupytext.read(path)
    nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}}).execute()
    return nb


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.notebooks", description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", help="notebook names (default: all), e.g. 01_reproduce_speedups")
    a = p.parse_args(argv)
    known = {s.stem: s for s in sources()}
    unknown = [n for n in a.names if n not in known]
    if unknown:
        raise SystemExit(f"notebooks: expected names of {sorted(known)}, got {unknown}")
    import jupytext

    for name in a.names or list(known):
        out = known[name].with_suffix(".ipynb")
        jupytext.write(execute(known[name]), out)
        print(f"[notebooks] {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
