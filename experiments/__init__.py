"""The entry points of the experiment harness: `python -m experiments.bench` (run / sweep), `python -m
experiments.merge` (one Parquet per sweep), `python -m experiments.sync` (replay local rows into W&B), `python -m
experiments.multigpu` (one process per GPU). The pipeline they run (Hydra sweeps over backends × shapes × problems,
correctness-gated honest timing, long-format results with provenance) is the package harness/; the results schema
is documented in experiments/README.md.
"""
