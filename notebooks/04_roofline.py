# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Roofline, sequence-length scaling and first-call cost
# Achieved rates from the cost model's flops/bytes, against the ceilings measured on the same GPU.

# %% tags=["parameters"]
import os

# Results to analyse: "index:<experiment>[,...]" (the current files named by results/index.yaml), a Parquet file,
# a results folder, or "wandb:<entity>/<project>[/<group>]".
RESULTS = os.environ.get("SSD_RESULTS", "index:headline")
BASELINE = "mamba_ssm"

# %%
import sys
from pathlib import Path

# Make the checkout importable when the notebook runs from notebooks/ without an installed package.
root = next(p for p in [Path.cwd(), *Path.cwd().parents] if (p / "pyproject.toml").is_file())
sys.path.insert(0, str(root))

from IPython.display import Markdown, display

import analysis
from analysis import figures
from analysis.markdown import table

w = analysis.wide(analysis.load_results(RESULTS))
if analysis.load.is_synthetic(w):
    display(Markdown("> **SYNTHETIC FIXTURE** — test data, not measurements."))
print(f"{w['run_id'].nunique()} points from {analysis.resolve_results(RESULTS)}")

# %%
roof = analysis.roofline_table(w)
display(Markdown(table(roof[roof["stage"] != "chunk_cumsum"])))

# %%
figures.roofline(roof)

# %%
sl = analysis.seqlen_table(w)
figures.seqlen_scaling(sl)

# %%
comp = analysis.compile_table(w)
display(Markdown(table(comp[comp["median_ms"].notna()])))
