"""The definition: the SSD recurrence stepped one token at a time, in float64.

    h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_tᵀ,   y_t = C_t h_t + D x_t,   y_t <- y_t silu(z_t)

h_{-1} is the initial state; h resets to 0 wherever seq_idx differs from the previous token's (the token before
position 0 counts as sequence 0). Slow by design: use it at small sizes only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from impls.reference.chunk_cumsum import process_dt
from impls.reference.common import per_head


@dataclass
class SequentialResult:
    y: torch.Tensor  # (batch, seqlen, nheads, headdim) float64
    final_states: torch.Tensor  # (batch, nheads, headdim, dstate)
    chunk_states: torch.Tensor | None  # state entering every chunk, when chunk_size was given
    varlen_states: torch.Tensor | None  # final state of every sequence, when cu_seqlens was given


def ssd_sequential(x, dt, A, B, C, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
                   cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, math.inf), chunk_size=None):
    f64 = torch.float64
    batch, seqlen, nheads, headdim = x.shape
    dstate = B.shape[-1]
    if cu_seqlens is not None and seq_idx is None:
        from impls.api import seq_idx_from_cu_seqlens

        seq_idx = seq_idx_from_cu_seqlens(cu_seqlens, seqlen)
    dt = process_dt(dt, dt_bias, dt_softplus, dt_limit, f64)
    x64, A64 = x.to(f64), A.to(f64)
    Bh, Ch = per_head(B.to(f64), nheads), per_head(C.to(f64), nheads)
    h = torch.zeros(batch, nheads, headdim, dstate, dtype=f64, device=x.device)
    if initial_states is not None:
        h = h + initial_states.to(f64)
    previous = torch.zeros(batch, dtype=torch.long, device=x.device)
    ends = set(cu_seqlens[1:].tolist()) if cu_seqlens is not None else set()
    seq_states = {}
    chunk_states = []
    y = torch.empty(batch, seqlen, nheads, headdim, dtype=f64, device=x.device)
    for t in range(seqlen):
        if chunk_size is not None and t % chunk_size == 0:
            chunk_states.append(h.clone())
        if seq_idx is not None:
            current = seq_idx[:, t].long()
            h = h * (current == previous).to(f64)[:, None, None, None]
            previous = current
        decay = torch.exp(dt[:, t] * A64)  # (batch, nheads)
        h = decay[..., None, None] * h + (dt[:, t, :, None, None] * x64[:, t, :, :, None] * Bh[:, t, :, None, :])
        y[:, t] = torch.einsum("bhpn,bhn->bhp", h, Ch[:, t])
        if t + 1 in ends:
            seq_states[t + 1] = h[0].clone()
    if D is not None:
        D64 = D.to(f64)
        y = y + x64 * (D64[:, None] if D64.dim() == 1 else D64)
    if z is not None:
        z64 = z.to(f64)
        y = y * z64 * torch.sigmoid(z64)
    varlen = None
    if cu_seqlens is not None:
        bounds = cu_seqlens.tolist()
        varlen = torch.stack([
            seq_states[e] if e > s else torch.zeros_like(h[0]) for s, e in zip(bounds[:-1], bounds[1:])
        ])
    return SequentialResult(y, h, torch.stack(chunk_states, 1) if chunk_states else None, varlen)
