"""Stage 3 through TileGym: `_compute_out` (intra-chunk C·Bᵀ, carried state, + D_h·x), then the adapter's finish.

TileGym reads states as (b, h, c, headdim, dstate): the contract's (b, c, h, headdim, dstate) transposed, a view
(for states that came from TileGym's stage 2 it is its own contiguous buffer again). dt is a view; the decays
need the base-2 scaling (one copy). D per channel and z are added by `adapter.finish_y`.
"""

from __future__ import annotations

from impls.tilegym import adapter
from impls.tilegym.precompile import WrapperCall


def peer_compute_out(mod, run, shape, dtype, x, B, C, d, dt_bht, decay_bht, hiddens):
    """TileGym's kernel only: y (b, t, h, p) in x's dtype, D_h·x included."""
    args = (x, B, C, d, dt_bht, decay_bht, hiddens, shape.chunk_size)
    call = WrapperCall(mod, "_compute_out", dict(x=x, b=B, c=C, d=d, dt_bht=dt_bht, decay_bht=decay_bht,
                                            hiddens=hiddens, chunk_size=shape.chunk_size))
    return run("compute_out", shape, dtype, call, args)


def compute_out(mod, run, shape, dtype, C, B, x, dt, dA_cumsum, states, D, z):
    b, h, c, q = dt.shape
    y = peer_compute_out(mod, run, shape, dtype, x, B, C, adapter.kernel_D(D, h, x), dt.reshape(b, h, c * q),
                         adapter.to_log2(dA_cumsum), states.transpose(1, 2))
    return adapter.finish_y(y, x, D, z)
