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
# # Speedups over the baseline
# Per shape and stage, with the geometric mean; speedup = baseline time / backend time (higher is faster). Headline
# shapes S1–S4.

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
sp = analysis.speedup_table(w, baseline=BASELINE, shape_names=["S1", "S2", "S3", "S4"])
display(Markdown(table(analysis.speedup.speedup_matrix(sp, "forward"), index=True)))

# %%
figures.speedup_bars(sp, "forward", source=source)

# %%
for stage in ("chunk_cumsum", "fwd_pass_state", "compute_out"):
    display(Markdown(f"**{stage}**\n\n" + table(analysis.speedup.speedup_matrix(sp, stage), index=True)))

# %% [markdown]
# ## Published claims next to ours

# %%
claims = analysis.compare_claims(w)
display(Markdown(table(claims[["id", "claimed", "measured", "measured_on", "status"]])))
