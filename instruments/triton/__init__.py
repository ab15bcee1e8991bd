"""Triton inspection: ahead-of-time compiles, spills, golden PTX hashes, the switch-effects table, probes."""
