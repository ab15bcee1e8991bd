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
sp = analysis.speedup_table(w, baseline=BASELINE, shape_names=["S1", "S2", "S3", "S4"])
display(Markdown(table(analysis.speedup.speedup_matrix(sp, "forward"), index=True)))

# %%
figures.speedup_bars(sp, "forward")

# %%
for stage in ("chunk_cumsum", "fwd_pass_state", "compute_out"):
    display(Markdown(f"**{stage}**\n\n" + table(analysis.speedup.speedup_matrix(sp, stage), index=True)))

# %% [markdown]
# ## Published claims next to ours

# %%
claims = analysis.compare_claims(w)
display(Markdown(table(claims[["id", "claimed", "measured", "measured_on", "status"]])))
