"""The experiment harness: Hydra sweeps over backends × shapes × problems, correctness-gated honest timing, and
long-format results with provenance (Parquet, optionally W&B).

Entry points: `python -m experiments.bench` (run / sweep), `python -m experiments.merge` (one Parquet per sweep),
`python -m experiments.sync` (replay local rows into W&B), `python -m experiments.multigpu` (one process per GPU).
The results schema is documented in experiments/README.md.
"""
