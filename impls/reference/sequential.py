"""The definition: the SSD recurrence stepped one token at a time, in float64.

    h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_tᵀ,   y_t = C_t h_t + D x_t,   y_t <- y_t silu(z_t)

h_{-1} is the initial state; h resets to 0 wherever seq_idx differs from the previous token's (the token before
position 0 counts as sequence 0) — or, with one initial state per sequence (initial_states (nseqs, ...) for the one
row of packed sequences), to that sequence's. Slow by design: use it at small sizes only.

Independent of the chunked code it checks: dt processing, the head-to-group mapping and the sequence index of
cu_seqlens are written out here again, not imported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


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
        seq_idx = _sequence_numbers(cu_seqlens.tolist(), seqlen, x.device)
    dt = _step_sizes(dt, dt_bias, dt_softplus, dt_limit)
    x64, A64 = x.to(f64), A.to(f64)
    group = torch.arange(nheads, device=x.device) // (nheads // B.shape[2])  # head h reads group h // (H / G)
    Bh, Ch = B.to(f64)[:, :, group], C.to(f64)[:, :, group]
    h = torch.zeros(batch, nheads, headdim, dstate, dtype=f64, device=x.device)
    # one initial state per sequence (rows of initial_states counting the sequences of the one row of x): each
    # sequence starts from its own; else the row's initial state is sequence 0's and the others start from zero
    per_sequence = initial_states is not None and initial_states.shape[0] != batch
    if initial_states is not None:
        h = h + initial_states.to(f64)[:1] if per_sequence else h + initial_states.to(f64)
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
            same = (current == previous).to(f64)[:, None, None, None]
            start = initial_states.to(f64)[current] if per_sequence else 0.0
            h = h * same + (1 - same) * start
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
        empty = [initial_states.to(f64)[i] if per_sequence else torch.zeros_like(h[0]) for i in range(len(bounds) - 1)]
        varlen = torch.stack([seq_states[e] if e > s else empty[i]
                              for i, (s, e) in enumerate(zip(bounds[:-1], bounds[1:]))])
    return SequentialResult(y, h, torch.stack(chunk_states, 1) if chunk_states else None, varlen)


def _step_sizes(dt, dt_bias, dt_softplus, dt_limit):
    """dt + dt_bias, then softplus(v) = log(1 + e^v) (v itself above 20, as the contract says), then the clamp
    (not applied for the default (0, inf)); float64."""
    v = dt.to(torch.float64)
    if dt_bias is not None:
        v = v + dt_bias.to(torch.float64)
    if dt_softplus:
        v = torch.where(v > 20.0, v, torch.log1p(torch.exp(torch.clamp(v, max=20.0))))
    lo, hi = (float(b) for b in dt_limit)
    if (lo, hi) != (0.0, math.inf):
        v = torch.clamp(v, lo, hi)
    return v


def _sequence_numbers(bounds: list[int], seqlen: int, device) -> torch.Tensor:
    """(1, seqlen): position t belongs to the sequence i with bounds[i] <= t < bounds[i + 1] (the last such i
    where sequences are empty)."""
    seq = torch.empty(seqlen, dtype=torch.long)
    for i, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        seq[start:end] = i
    return seq[None].to(device)
