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
# # End to end: the Mamba-2 layer and language model
# Tokens per second of the language model per backend and configuration (prefill and training step), the time per
# part of the layer beside its floor, the SSD's share of a step with the speedup it predicts beside the measured one,
# and the loss curves of one short training run per backend inside the reference backend's band. The step profile
# (`*.step_profile.parquet`) and the curves (`*.curves.parquet`) are read from the folder of the rows.

# %% tags=["parameters"]
import os

# Results to analyse: "index:<experiment>[,...]" (the current files named by results/index.yaml), a Parquet file,
# a results folder, or "wandb:<entity>/<project>[/<group>]"; the step profile and curves sit beside the rows.
RESULTS = os.environ.get("SSD_RESULTS", "index:end_to_end")
BASELINE = "mamba_ssm"

# %%
from IPython.display import Markdown, display

from analysis import curves, end_to_end, figures
from analysis.load import resolve_results, resolve_sources
from analysis.markdown import table
from analysis.notebooks import start

w = start(RESULTS)  # the wide table; says where the points come from, and flags the synthetic fixture
sources = resolve_sources(RESULTS)
print(figures.source_of(w, resolve_results(RESULTS)).title())  # the card, the dates and the rows every table reads

# %% [markdown]
# ## Tokens per second (workload `mamba2_lm`)

# %%
lm = end_to_end.lm_table(w, BASELINE)
display(Markdown(table(lm)))

# %% [markdown]
# ## Time per part of the layer (workload `mamba2_layer`), beside the non-SSD floor

# %%
display(Markdown(table(end_to_end.layer_parts_table(w))))

# %% [markdown]
# ## The SSD's share of a step and the speedup it predicts

# %%
profile = end_to_end.load_step_profiles(sources)
display(Markdown(table(end_to_end.share_table(profile, lm, BASELINE))))

# %% [markdown]
# ## Loss curves against the reference backend's band

# %%
rows = curves.load_curves_beside(sources)
band = curves.band(rows)
verdicts = curves.check(rows, band)
for v in verdicts:
    print(f"{v.backend} seeds {list(v.seeds)}: {'inside' if v.ok else 'OUTSIDE'}, accuracy {v.accuracy:.4f}"
          + (f"; {v.reason}" if v.reason else ""))
curves.figure(rows, band, verdicts)
