"""Stage 2, reference: each chunk's own state, then the states carried across chunks."""

from __future__ import annotations

import torch

from impls.problem import per_sequence_initial_states
from impls.reference.common import (
    acc_dtype,
    chunk_blocks,
    chunk_last_index,
    chunked,
    decay_since_sequence_start,
    per_head,
)

BLOCK_ELEMENTS = 1 << 27  # bound on the head-repeated B (and x) materialised at once


def chunk_local_states(B, x, dt, dA_cumsum, seq_idx=None, round_operand=None):
    """State each chunk builds from zero: sum_t exp(dA_cs[last] - dA_cs[t]) dt_t x_t B_tᵀ, counting only the
    tokens of the sequence that is active at the chunk's last token. (batch, nchunks, nheads, headdim, dstate).
    Works through blocks of chunks so the head-repeated B stays bounded at any sequence length. `round_operand`
    rounds the matmul's operands (x scaled by its weight, and B) as a lower-precision kernel does; None: as computed."""
    dtype = acc_dtype(x, dt)
    batch, seqlen, nheads, headdim = x.shape
    nchunks, chunk = dt.shape[2], dt.shape[3]
    weight = torch.exp(dA_cumsum[..., -1:] - dA_cumsum) * dt  # (batch, nheads, nchunks, chunk)
    if seq_idx is not None:
        same = chunked(seq_idx, chunk) == seq_idx[:, chunk_last_index(seqlen, chunk, x.device)][..., None]
        weight = weight * same[:, None].to(weight.dtype)
    weight = weight.to(dtype)
    local = torch.empty(batch, nchunks, nheads, headdim, B.shape[-1], dtype=dtype, device=x.device)
    per_block = BLOCK_ELEMENTS // max(1, batch * chunk * nheads * max(headdim, B.shape[-1]))
    for sl, tokens in chunk_blocks(nchunks, chunk, seqlen, per_block):
        xc = chunked(x[:, tokens], chunk, dtype)
        Bc = per_head(chunked(B[:, tokens], chunk, dtype), nheads)
        if round_operand is None:
            local[:, sl] = torch.einsum("bhcs,bcshp,bcshn->bchpn", weight[:, :, sl], xc, Bc)
        else:
            scaled = round_operand(xc * weight[:, :, sl].permute(0, 2, 3, 1)[..., None])
            local[:, sl] = torch.einsum("bcshp,bcshn->bchpn", scaled, round_operand(Bc))
    return local


def pass_states(local, chunk_decay, initial_states=None, chunk_seq=None, starts=None):
    """S_0 = initial (or 0); S_{c+1} = exp(dA_c) S_c [same sequence] + local_c (+ starts_c: the initial state of a
    sequence that starts in chunk c, decayed to its end). Returns (S_0..S_{C-1}, S_C)."""
    batch, nchunks, nheads, headdim, dstate = local.shape
    state = torch.zeros(batch, nheads, headdim, dstate, dtype=local.dtype, device=local.device)
    if initial_states is not None:
        state = state + initial_states.to(local.dtype)
    entering = torch.empty_like(local)
    previous_seq = torch.zeros(batch, dtype=torch.long, device=local.device)
    for c in range(nchunks):
        entering[:, c] = state
        decay = torch.exp(chunk_decay[:, :, c])  # (batch, nheads)
        if chunk_seq is not None:
            decay = decay * (chunk_seq[:, c] == previous_seq)[:, None].to(decay.dtype)
            previous_seq = chunk_seq[:, c].long()
        state = decay[..., None, None] * state + local[:, c]
        if starts is not None:
            state = state + starts[:, c]
    return entering, state


def _sequence_starts(initial_states, dA_cumsum, seq_idx, last, chunk_seq, dtype):
    """(batch, nchunks, nheads, headdim, dstate): for a chunk whose last token's sequence s starts inside it, s's
    initial state decayed from its start to the chunk's end, exp(Λ_last − Λ_{j0−1}) h0_s; zero where s continues
    the previous chunk's sequence (sequence 0 at chunk 0 continues the state before position 0)."""
    chunk = dA_cumsum.shape[-1]
    since = decay_since_sequence_start(dA_cumsum.to(dtype), chunked(seq_idx, chunk))  # (b, h, c, l)
    in_chunk = last - torch.arange(len(last), device=last.device) * chunk
    decay = torch.exp(since[..., torch.arange(len(last), device=last.device), in_chunk])  # (b, h, c)
    previous = torch.zeros_like(chunk_seq)
    previous[:, 1:] = chunk_seq[:, :-1]
    starting = (chunk_seq != previous).to(dtype)  # (b, c)
    h0 = initial_states.to(dtype)[chunk_seq.long()]  # (b, c, h, p, n)
    return (decay.permute(0, 2, 1) * starting[..., None])[..., None, None] * h0


def fwd_pass_state(B, x, dt, dA_cumsum, initial_states=None, seq_idx=None, state_dtype=None, round_operand=None):
    local = chunk_local_states(B, x, dt, dA_cumsum, seq_idx, round_operand)
    chunk_seq, starts = None, None
    if seq_idx is not None:
        last = chunk_last_index(x.shape[1], dt.shape[-1], x.device)
        chunk_seq = seq_idx[:, last]
        if per_sequence_initial_states(initial_states, x):
            starts = _sequence_starts(initial_states, dA_cumsum, seq_idx, last, chunk_seq, local.dtype)
            initial_states = initial_states[:1]  # sequence 0's: the state before position 0
    entering, final = pass_states(local, dA_cumsum[..., -1], initial_states, chunk_seq, starts)
    final_dtype = torch.float64 if final.dtype == torch.float64 else torch.float32
    return entering.to(state_dtype or x.dtype), final.to(final_dtype)
