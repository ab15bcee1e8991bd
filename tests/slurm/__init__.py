"""SLURM tests: a one-node loopback cluster (cluster.py) and a sweep submitted to it."""
