"""Writes the analysis notebooks (no outputs): each is a parameter cell, a bootstrap cell and a few cells that call
the `analysis` package. Edit here and re-run `python notebooks/make_notebooks.py`; the .ipynb files are generated.

The parameter cell (tagged "parameters", papermill-style) reads $SSD_RESULTS, defaulting to results/2026-12-02-h200-headline-ablations/; a
missing results path is an error (analysis.load.resolve_results), never a silent switch to other data.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).parent
PARAMS = '''import os

# Results to analyse: a Parquet file, a results folder, or "wandb:<entity>/<project>[/<group>]".
RESULTS = os.environ.get("SSD_RESULTS", "results/2026-12-02-h200-headline-ablations/")
BASELINE = "mamba_ssm"'''
BOOT = '''import sys
from pathlib import Path

# Make the checkout importable when the notebook runs from notebooks/ without an installed package.
root = next(p for p in [Path.cwd(), *Path.cwd().parents] if (p / "pyproject.toml").is_file())
sys.path.insert(0, str(root))

import pandas as pd
from IPython.display import Markdown, display

import analysis
from analysis import figures
from analysis.markdown import table

w = analysis.wide(analysis.load_results(RESULTS))
if analysis.load.is_synthetic(w):
    display(Markdown("> **SYNTHETIC FIXTURE** — test data, not measurements."))
print(f"{w['run_id'].nunique()} points from {analysis.resolve_results(RESULTS)}")'''

NOTEBOOKS = {
    "01_reproduce_speedups": [
        "# Speedups over the baseline\nPer shape and stage, with the geometric mean; speedup = baseline time / "
        "backend time (higher is faster). Headline shapes S1–S4.",
        '''sp = analysis.speedup_table(w, baseline=BASELINE, shape_names=["S1", "S2", "S3", "S4"])
display(Markdown(table(analysis.speedup.speedup_matrix(sp, "forward"), index=True)))''',
        '''figures.speedup_bars(sp, "forward")''',
        '''for stage in ("chunk_cumsum", "fwd_pass_state", "compute_out"):
    display(Markdown(f"**{stage}**\\n\\n" + table(analysis.speedup.speedup_matrix(sp, stage), index=True)))''',
        "## Published claims next to ours",
        '''claims = analysis.compare_claims(w)
display(Markdown(table(claims[["id", "claimed", "measured", "measured_on", "status"]])))''',
    ],
    "02_ablations": [
        "# Ablations\nEffect of each switch = 1 − t_with / t_without (time it saves; −10 % means it costs 10 %), on "
        "top of the others and alone. No-op switches on this architecture are labelled, not measured.",
        '''backends = sorted(w.loc[w["ablation"].fillna("none") != "none", "backend"].unique())
abl = pd.concat([analysis.ablation_table(w, b) for b in backends], ignore_index=True) if backends else \\
    analysis.ablation_table(w, "none")
display(Markdown(table(abl.drop(columns=["meaning"]))))''',
        '''figures.ablation_bars(abl)''',
    ],
    "03_accuracy": [
        "# Accuracy\n‖out − ref‖ / ‖ref‖ against the float64 reference, per backend, dtype and seqlen, with the "
        "tolerance of impls/tolerance.py.",
        '''acc = analysis.accuracy_table(w)
display(Markdown(table(analysis.scaling.accuracy_matrix(acc, "forward"), index=True)))''',
        '''figures.accuracy(acc, "forward")''',
        '''worst = acc.sort_values("err_over_tol", ascending=False).head(10)
display(Markdown(table(worst)))''',
    ],
    "04_roofline": [
        "# Roofline, sequence-length scaling and first-call cost\nAchieved rates from the cost model's flops/bytes, "
        "against the ceilings measured on the same GPU.",
        '''roof = analysis.roofline_table(w)
display(Markdown(table(roof[roof["stage"] != "chunk_cumsum"])))''',
        '''figures.roofline(roof)''',
        '''sl = analysis.seqlen_table(w)
figures.seqlen_scaling(sl)''',
        '''comp = analysis.compile_table(w)
display(Markdown(table(comp[comp["median_ms"].notna()])))''',
    ],
}


def build(name: str, cells: list[str]) -> nbformat.NotebookNode:
    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells.append(new_markdown_cell(cells[0]))
    params = new_code_cell(PARAMS)
    params.metadata["tags"] = ["parameters"]
    nb.cells += [params, new_code_cell(BOOT)]
    for src in cells[1:]:
        nb.cells.append(new_markdown_cell(src) if src.startswith("#") else new_code_cell(src))
    for i, cell in enumerate(nb.cells):  # stable ids: regenerating gives identical files
        cell["id"] = f"{name[:2]}-{i}"
    return nb


def main() -> None:
    for name, cells in NOTEBOOKS.items():
        nbformat.write(build(name, cells), HERE / f"{name}.ipynb")
        print(HERE / f"{name}.ipynb")


if __name__ == "__main__":
    main()
