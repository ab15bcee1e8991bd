"""Stage 3, reference: y = (C·Bᵀ ∘ decay mask) x inside each chunk + C·state + D x, gated by silu(z).

Works through blocks of chunks, so that its (chunk × chunk) work tensors and the head-repeated B and C stay
bounded (BLOCK_ELEMENTS) at any sequence length (the 2^20-token problem included)."""

from __future__ import annotations

import torch

from impls.problem import per_sequence_initial_states
from impls.reference.common import (
    acc_dtype,
    chunk_blocks,
    chunked,
    decay_since_sequence_start,
    per_head,
    skip_and_gate,
)

BLOCK_ELEMENTS = 1 << 27  # bound on the (chunk × chunk) work tensors materialised at once


def compute_out(C, B, x, dt, dA_cumsum, states, D=None, z=None, seq_idx=None, round_operand=None,
                initial_states=None):
    """y of every token. `round_operand` (impls/reference/same_precision.py) rounds each matmul operand as a kernel
    of a lower precision does (the scores before they meet x, too); None keeps them as computed. With one initial
    state per packed sequence (`initial_states` (nseqs, ...), seq_idx given), a token of a sequence that starts
    inside its chunk also reads that sequence's initial state, decayed from the sequence's start."""
    dtype = acc_dtype(x, dt)
    r = round_operand or _as_is
    batch, seqlen, nheads, headdim = x.shape
    nchunks, chunk = dt.shape[2], dt.shape[3]
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=x.device).tril()
    seq = chunked(seq_idx, chunk) if seq_idx is not None else None  # (batch, nchunks, chunk)
    continues = _continues_previous_chunk(seq, seq_idx, chunk) if seq is not None else None
    starting = per_sequence_initial_states(initial_states, x) and seq is not None
    since = decay_since_sequence_start(dA_cumsum.to(dtype), seq) if starting else None

    y = torch.empty(batch, nchunks, chunk, nheads, headdim, dtype=dtype, device=x.device)
    for sl, tokens in chunk_blocks(nchunks, chunk, seqlen, BLOCK_ELEMENTS // max(1, batch * nheads * chunk * chunk)):
        xc = chunked(x[:, tokens], chunk, dtype)  # (b, c, l, h, p) for this block of chunks
        Bc = per_head(chunked(B[:, tokens], chunk, dtype), nheads)
        Cc = per_head(chunked(C[:, tokens], chunk, dtype), nheads)
        dA = dA_cumsum[:, :, sl].to(dtype).permute(0, 2, 1, 3)  # (b, c, h, l)
        dtc = dt[:, :, sl].to(dtype).permute(0, 2, 1, 3)
        keep = causal.expand(batch, sl.stop - sl.start, chunk, chunk)
        if seq is not None:
            keep = keep & (seq[:, sl, :, None] == seq[:, sl, None, :])
        diff = dA[..., :, None] - dA[..., None, :]  # (b, c, h, l, s)
        decay = torch.exp(torch.where(keep[:, :, None], diff, float("-inf")))
        scores = torch.einsum("bclhn,bcshn->bchls", r(Cc), r(Bc)) * decay * dtc[..., None, :]
        y_block = torch.einsum("bchls,bcshp->bclhp", r(scores), r(xc))
        state_decay = torch.exp(dA)  # (b, c, h, l)
        if continues is not None:
            state_decay = state_decay * continues[:, sl, None, :].to(dtype)
        y_block = y_block + torch.einsum("bclhn,bchpn->bclhp", r(Cc), r(states[:, sl].to(dtype))) \
            * state_decay.permute(0, 1, 3, 2)[..., None]
        if starting:  # the tokens of a sequence that starts in this chunk: its own initial state
            h0 = initial_states.to(dtype)[seq[:, sl].long()]  # (b, c, l, h, p, n)
            from_start = torch.exp(since[:, :, sl].permute(0, 2, 3, 1)) * (~continues[:, sl, :, None]).to(dtype)
            y_block = y_block + torch.einsum("bclhn,bclhpn->bclhp", r(Cc), r(h0)) * from_start[..., None]
        y[:, sl] = y_block
    y = y.reshape(batch, nchunks * chunk, nheads, headdim)[:, :seqlen]
    return skip_and_gate(y, x, D, z).to(x.dtype)


def _as_is(t):
    return t


def _continues_previous_chunk(seq, seq_idx, chunk):
    """(batch, nchunks, chunk): token belongs to the sequence active just before its chunk (0 before chunk 0)."""
    before = torch.zeros_like(seq[:, :, 0])
    if seq.shape[1] > 1:
        before[:, 1:] = seq_idx[:, chunk - 1::chunk][:, : seq.shape[1] - 1]
    return seq == before[..., None]
