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
from IPython.display import Markdown, display

import analysis
from analysis import figures
from analysis.load import resolve_results
from analysis.markdown import table
from analysis.notebooks import start

w = start(RESULTS)  # the wide table; says where the points come from, and flags the synthetic fixture
source = figures.source_of(w, resolve_results(RESULTS))  # the figures' titles: card, date, rows

# %%
roof = analysis.roofline_table(w)
display(Markdown(table(roof[roof["stage"] != "chunk_cumsum"])))

# %%
figures.roofline(roof, source)

# %%
sl = analysis.seqlen_table(w)
figures.seqlen_scaling(sl, source)

# %%
comp = analysis.compile_table(w)
display(Markdown(table(comp[comp["median_ms"].notna()])))
