"""`python -m analysis.notebooks [NAME ...]`: the analysis notebooks, executed. Each notebooks/<NAME>.py (a jupytext
percent script, the only form kept in git) is run top to bottom in a fresh kernel from notebooks/ and written next to
it as <NAME>.ipynb with its outputs (ignored by git). $SSD_RESULTS sets their parameter, as in Jupyter.

The kernel gets the checkout first on PYTHONPATH, so the notebooks import this checkout's `analysis` (in Jupyter, the
project installed by scripts/install.sh, editable, does the same); `start` is their shared first step."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "notebooks"


def sources() -> list[Path]:
    return sorted(NOTEBOOK_DIR.glob("0*.py"))


def start(results):
    """A notebook's first step: the wide table of `results` (analysis.load), with a banner when they are the
    synthetic fixture and a line saying where the points come from."""
    from IPython.display import Markdown, display

    from analysis.load import is_synthetic, load_results, resolve_results, wide

    w = wide(load_results(results))
    if is_synthetic(w):
        display(Markdown("> **SYNTHETIC FIXTURE** — test data, not measurements."))
    print(f"{w['run_id'].nunique()} points from {resolve_results(results)}")
    return w


def execute(path: Path, timeout: int = 300):
    """The notebook of the percent script `path`, executed with its folder as the working folder."""
    import jupytext
    import nbclient

    nb = jupytext.read(path)
    paths = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)  # the kernel inherits it: this checkout's packages first
    try:
        nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                resources={"metadata": {"path": str(path.parent)}}).execute()
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = old
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
