"""Final state of every packed sequence (cu_seqlens), from the chunked stages' outputs.

Reads cu_seqlens on the host (one sync): this is the reference and the default for backends without a kernel.
"""

from __future__ import annotations

import torch

from impls import validate as check
from impls.problem import per_sequence_initial_states
from impls.reference.common import acc_dtype, per_head


def varlen_states(B, x, dt, dA_cumsum, states, cu_seqlens, initial_states=None):
    """(nseqs, nheads, headdim, dstate) fp32 (float64 in float64 mode). An empty sequence's state is zero (its own
    initial state, with one per sequence: `initial_states` (nseqs, ...))."""
    own = per_sequence_initial_states(initial_states, x)
    dtype = acc_dtype(x, dt)
    nheads, headdim, dstate, chunk = x.shape[2], x.shape[3], B.shape[3], dt.shape[-1]
    bounds = cu_seqlens.tolist()
    check.cu_seqlens_bounds(bounds, x.shape[1])  # read here anyway: a bad offset would index past the chunks
    out = torch.zeros(len(bounds) - 1, nheads, headdim, dstate, dtype=dtype, device=x.device)
    for i, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        if end <= start:
            if own:
                out[i] = initial_states[i].to(dtype)
            continue
        c = (end - 1) // chunk
        first = max(start, c * chunk)
        offsets = torch.arange(first - c * chunk, end - c * chunk, device=x.device)
        last = dA_cumsum[0, :, c, end - 1 - c * chunk]  # (nheads,)
        weight = torch.exp(last[:, None] - dA_cumsum[0, :, c, offsets]) * dt[0, :, c, offsets]
        Bh = per_head(B[0, first:end].to(dtype), nheads)
        state = torch.einsum("hs,shp,shn->hpn", weight.to(dtype), x[0, first:end].to(dtype), Bh)
        # the state entering the chunk belongs to this sequence if it started before the chunk
        # (or is sequence 0 starting at 0, whose entering state is the initial state)
        if start < c * chunk or (start == 0 and i == 0):
            state = state + torch.exp(last.to(dtype))[:, None, None] * states[0, c].to(dtype)
        elif own:  # started inside chunk c: its own initial state, decayed from its start
            before = dA_cumsum[0, :, c, first - c * chunk - 1] if first > c * chunk else torch.zeros_like(last)
            state = state + torch.exp((last - before).to(dtype))[:, None, None] * initial_states[i].to(dtype)
        out[i] = state
    return out
