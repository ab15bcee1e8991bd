"""Stage 1 through TileGym: `_chunk_cumsum(A, dt)` on the processed dt, mapped to the contract's outputs.

TileGym returns (decay (b, t, h), decay (b, h, t), dt (b, h, t)), decays in base 2. The contract's dt
(b, h, nchunks, Q) fp32 is a view of TileGym's (b, h, t) dt (seqlen % chunk == 0, so t = nchunks·Q); dA_cumsum
needs the base-2 decays scaled back by ln 2 (one copy, `adapter.to_natural`).
"""

from __future__ import annotations

import dataclasses

from impls.tilegym import adapter
from impls.tilegym.precompile import WrapperCall


def peer_chunk_cumsum(mod, run, shape, dtype, A, dt32):
    """TileGym's kernel only: (decay_bth, decay_bht, dt_bht)."""
    # its tuning depends on (batch, seqlen, nheads, chunk) only: the stage call (which sees dt alone) and the
    # whole forward must look up the same record
    shape = dataclasses.replace(shape, headdim=0, ngroups=0, dstate=0)
    A32 = A.to(dt32.dtype).contiguous()  # fp32 (float64 only in the CPU mapping tests' float64 mode)
    call = WrapperCall(mod, "_chunk_cumsum", dict(a=A32, dt=dt32, chunk_size=shape.chunk_size))
    return run("chunk_cumsum", shape, dtype, call, (A32, dt32, shape.chunk_size))


def chunk_cumsum(mod, run, shape, dtype, dt, A, dt_bias, dt_softplus, dt_limit):
    dt32 = adapter.processed_dt(dt, dt_bias, dt_softplus, dt_limit, A)
    _decay_bth, decay_bht, dt_bht = peer_chunk_cumsum(mod, run, shape, dtype, A, dt32)
    b, h = dt_bht.shape[:2]
    return (dt_bht.view(b, h, shape.nchunks, shape.chunk_size),
            adapter.to_natural(decay_bht, shape.nchunks, shape.chunk_size))
