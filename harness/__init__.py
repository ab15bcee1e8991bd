"""The measurement pipeline behind `python -m experiments.bench`: a point's typed steps (plan → gate → time →
record), the correctness gate, honest timing, the cost model and the results store with its provenance."""
