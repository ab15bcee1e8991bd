"""Stage 2 through TileGym: `_fwd_pass_state`, chunk states and final state in one kernel.

Layouts: the contract's dt (b, h, c, Q) is TileGym's BHT dt as a view (reshape to (b, h, t)) and its BTH dt as a
transposed view of that; the decays need the base-2 scaling (one copy, `adapter.to_log2`), BTH again a view.
TileGym writes states (b, h, c, headdim, dstate); the contract's (b, c, h, headdim, dstate) is a permuted view.
"""

from __future__ import annotations

from impls.tilegym import adapter
from impls.tilegym.precompile import WrapperCall


def peer_fwd_pass_state(mod, run, shape, dtype, x, B, dt_bht, decay_bht, init32, state_dtype):
    """TileGym's kernel only, on BHT dt/decays (b, h, t) and their BTH views: (states (b, h, c, p, n), final)."""
    dt_bth, decay_bth = dt_bht.transpose(1, 2), decay_bht.transpose(1, 2)
    args = (x, B, dt_bth, dt_bht, decay_bth, decay_bht, init32, shape.chunk_size, state_dtype)

    call = WrapperCall(mod, "_fwd_pass_state", dict(x=x, b=B, dt=dt_bth, dt_bht=dt_bht, decay_bth=decay_bth,
                                               decay_bht=decay_bht, init_state=init32, chunk_size=shape.chunk_size,
                                               state_dtype=state_dtype))
    return run("fwd_pass_state", shape, dtype, call, args, state_dtype=state_dtype)


def fwd_pass_state(mod, run, shape, dtype, B, x, dt, dA_cumsum, initial_states, state_dtype):
    b, h, c, q = dt.shape
    dt_bht = dt.reshape(b, h, c * q)  # a view for the contiguous dt the stages produce
    init32 = adapter.kernel_initial_state(initial_states, b, h, shape.headdim, shape.dstate, x)
    hiddens, final = peer_fwd_pass_state(mod, run, shape, dtype, x, B, dt_bht, adapter.to_log2(dA_cumsum),
                                         init32, state_dtype or x.dtype)
    return hiddens.permute(0, 2, 1, 3, 4), final
