"""The cuTile backend's backward (`impls.ssd`), the algorithm of our Triton backward written in cuTile: one file per
kernel (state_pass.py, the reverse walk over the chunks; chunk.py, the per-head chunk kernel; dcb.py, d(C·Bᵀ) and dC
per group; db.py, dB per group; cumsum.py, chunk_cumsum's backward), common.py for what they share, tune.py for their
launch configurations and run.py for what the forward keeps and the order of the kernels. The math and the tile
arrangement: impls/README.md, "The chunked backward"."""
