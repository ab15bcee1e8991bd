"""Analysis of benchmark results: load the store into one tidy frame, then tables and figures that answer the
study's questions. Notebooks, `python -m analysis.report` and tests/analysis/test_analysis.py all call these functions,
so the same numbers come out of each.

Modules: load (local Parquet / W&B -> long and wide frames), switches (switch metadata and the "no-op on this
architecture" table), speedup, ablation, roofline, scaling (seqlen, accuracy, first-call cost), claims
(published claims vs ours), figures (matplotlib, Agg), markdown (tables as Markdown), report (the CLI),
language_vs_trick (cuTile vs Triton at the same arrangement and tiles, and each trick per language), noise (an effect
printed only when larger than both points' noise). Every table reads one run (load.one_run).
"""

from analysis.ablation import ablation_table
from analysis.claims import compare_claims, load_claims
from analysis.load import load_results, resolve_results, wide
from analysis.roofline import roofline_table
from analysis.scaling import accuracy_table, compile_table, seqlen_table
from analysis.speedup import speedup_table

__all__ = [
    "ablation_table", "accuracy_table", "compare_claims", "compile_table", "load_claims", "load_results",
    "resolve_results", "roofline_table", "seqlen_table", "speedup_table", "wide",
]
