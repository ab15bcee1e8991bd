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
# # Accuracy
# ‖out − ref‖ / ‖ref‖ against the float64 reference, per backend, dtype and seqlen, with the tolerance of
# impls/tolerance.py.

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
acc = analysis.accuracy_table(w)
display(Markdown(table(analysis.scaling.accuracy_matrix(acc, "forward"), index=True)))

# %%
figures.accuracy(acc, "forward", source=source)

# %%
worst = acc.sort_values("err_over_tol", ascending=False).head(10)
display(Markdown(table(worst)))
