"""What the "tilegym" adapter does outside TileGym's kernels, one documented step each (docs/peers.md).

TileGym 1.5.1's Mamba-2 forward takes an already processed dt (no dt_bias, softplus or dt_limit), a per-head D
that it always adds, a mandatory fp32 initial state, no z, and works with decays in base 2 (dA_cumsum · log2 e)
in two layouts, (b, t, h) "BTH" and (b, h, t) "BHT". These helpers bridge the contract to that: each is a small
PyTorch step the harness can time apart from the peer's kernels.
"""

from __future__ import annotations

import math

import torch

from impls.reference.chunk_cumsum import process_dt
from impls.reference.common import acc_dtype, skip_and_gate

LOG2E = math.log2(math.e)  # TileGym's decays are natural-log cumulative sums times this


def processed_dt(dt, dt_bias, dt_softplus, dt_limit, A=None):
    """dt + dt_bias, softplus, clamp — the contract's dt processing — in fp32 (float64 for float64 inputs),
    (batch, seqlen, nheads) contiguous. TileGym's chunk_cumsum starts from a processed dt."""
    return process_dt(dt, dt_bias, dt_softplus, dt_limit, acc_dtype(dt, A)).contiguous()


def kernel_D(D, nheads, like):
    """The (nheads,) D TileGym's compute_out always adds: D itself when per head, else zeros (D per channel is
    added in `finish_y` instead)."""
    if D is not None and D.dim() == 1:
        return D.to(acc_dtype(like)).contiguous()
    return torch.zeros(nheads, dtype=acc_dtype(like), device=like.device)


def kernel_initial_state(initial_states, batch, nheads, headdim, dstate, like):
    """TileGym needs an fp32 initial state (the final state takes its dtype): zeros when none is given."""
    dtype = acc_dtype(like)
    if initial_states is None:
        return torch.zeros(batch, nheads, headdim, dstate, dtype=dtype, device=like.device)
    return initial_states.to(dtype).contiguous()


def to_log2(dA_cumsum):
    """Contract dA_cumsum (natural log, (b, h, c, Q)) -> TileGym's base-2 decays (b, h, c·Q): one elementwise copy."""
    b, h, c, q = dA_cumsum.shape
    return (dA_cumsum * LOG2E).reshape(b, h, c * q)


def to_natural(decay_bht, nchunks, chunk):
    """TileGym's base-2 decays (b, h, t) -> contract dA_cumsum (b, h, c, Q): one elementwise copy."""
    b, h, _ = decay_bht.shape
    return (decay_bht * (1.0 / LOG2E)).reshape(b, h, nchunks, chunk)


def needs_finish(D, z) -> bool:
    return (D is not None and D.dim() == 2) or z is not None


def finish_y(y, x, D, z):
    """Adds D·x for a per-channel D (TileGym adds only a per-head D) and applies the z gate y·silu(z), in fp32
    (float64 for float64 inputs), rounding once to x's dtype. Returns y itself when neither applies."""
    if not needs_finish(D, z):
        return y
    per_channel_D = D if D is not None and D.dim() == 2 else None  # a per-head D is in TileGym's kernel
    return skip_and_gate(y.to(acc_dtype(x)), x, per_channel_D, z).to(x.dtype)


STEPS = {
    "prepare.dt": "dt + dt_bias, softplus (threshold 20), clamp to dt_limit, in fp32 — TileGym takes a processed dt",
    "prepare.initial_state": "zeros (b, h, headdim, dstate) fp32 when no initial state is given (TileGym requires "
                             "one); a given one is cast to fp32",
    "prepare.D": "zeros (nheads,) when D is absent or per channel (TileGym's compute_out always adds D_h·x)",
    "stage.log2": "stage calls only: dA_cumsum (natural log) scaled by log2(e) into TileGym's base-2 decays, and "
                  "back for chunk_cumsum's output (one fp32 elementwise copy of b·h·seqlen each); ssd_forward "
                  "keeps TileGym's base-2 decays between its kernels and converts once, for the returned dA_cumsum",
    "finish.D_z": "per-channel D·x and the z gate y·silu(z), fp32, one rounding to x's dtype (TileGym lacks both)",
}
