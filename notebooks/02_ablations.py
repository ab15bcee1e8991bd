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
# and alone; "within noise" where it is no larger than both points' noise. No-op switches on this architecture are
# labelled, not measured. The rows are one run's (analysis.load.one_run): one results file of one sweep.

# %% tags=["parameters"]
import os

# Results to analyse: "index:<experiment>[,...]" (the current files named by results/index.yaml), a Parquet file,
# a results folder, or "wandb:<entity>/<project>[/<group>]", holding one run.
RESULTS = os.environ.get("SSD_RESULTS", "index:ablate_cutile_v13_v17")
BASELINE = "mamba_ssm"
# the backward's arms, one run (its own rows: a table reads one run)
BACKWARD = os.environ.get("SSD_BACKWARD_RESULTS", "index:backward_v13_h100")

# %%
import pandas as pd
from IPython.display import Markdown, display

import analysis
from analysis import figures
from analysis.ablation import printable
from analysis.load import resolve_results
from analysis.markdown import table
from analysis.notebooks import start

w = start(RESULTS)  # the wide table; says where the points come from, and flags the synthetic fixture
source = figures.source_of(w, resolve_results(RESULTS))  # the figures' titles: card, date, rows

# %%
backends = sorted(w.loc[w["ablation"].fillna("none") != "none", "backend"].unique())
abl = pd.concat([analysis.ablation_table(w, b) for b in backends], ignore_index=True) if backends else \
    analysis.ablation_table(w, "none")
display(Markdown(table(printable(abl))))

# %%
figures.ablation_bars(abl, source)

# %% [markdown]
# ## The backward
# The same table at stage `backward` (`torch.autograd.grad` through `impls.ssd`, given dy) from the backward's arms,
# one run; a switch the run did not vary reads "not measured".

# %%
wb = start(BACKWARD)
arms = sorted(wb.loc[wb["ablation"].fillna("none") != "none", "backend"].unique())
bwd = pd.concat([analysis.ablation_table(wb, b, stage="backward") for b in arms], ignore_index=True)
display(Markdown(table(printable(bwd[bwd["status"] != "not measured"]))))
