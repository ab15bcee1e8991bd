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
# # Ablations
# Effect of each switch = 1 − t_with / t_without (time it saves; −10 % means it costs 10 %), on top of the others
# and alone. No-op switches on this architecture are labelled, not measured.

# %% tags=["parameters"]
import os

# Results to analyse: "index:<experiment>[,...]" (the current files named by results/index.yaml), a Parquet file,
# a results folder, or "wandb:<entity>/<project>[/<group>]".
RESULTS = os.environ.get("SSD_RESULTS", "index:ablate_cutile,ablate_triton")
BASELINE = "mamba_ssm"

# %%
import sys
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
print(f"{w['run_id'].nunique()} points from {analysis.resolve_results(RESULTS)}")

# %%
backends = sorted(w.loc[w["ablation"].fillna("none") != "none", "backend"].unique())
abl = pd.concat([analysis.ablation_table(w, b) for b in backends], ignore_index=True) if backends else \
    analysis.ablation_table(w, "none")
display(Markdown(table(abl.drop(columns=["meaning"]))))

# %%
figures.ablation_bars(abl)
