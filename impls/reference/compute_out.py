"""Stage 3, reference: y = (C·Bᵀ ∘ decay mask) x inside each chunk + C·state + D x, gated by silu(z)."""

from __future__ import annotations

import torch

from impls.reference.common import acc_dtype, chunked, per_head

BLOCK_ELEMENTS = 1 << 27  # bound on the (chunk × chunk) work tensors materialised at once


def compute_out(C, B, x, dt, dA_cumsum, states, D=None, z=None, seq_idx=None):
    dtype = acc_dtype(x, dt)
    batch, seqlen, nheads, headdim = x.shape
    nchunks, chunk = dt.shape[2], dt.shape[3]
    xc = chunked(x, chunk, dtype)
    Bc = per_head(chunked(B, chunk, dtype), nheads)
    Cc = per_head(chunked(C, chunk, dtype), nheads)
    dA = dA_cumsum.to(dtype).permute(0, 2, 1, 3)  # (batch, nchunks, nheads, chunk)
    dtc = dt.to(dtype).permute(0, 2, 1, 3)
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=x.device).tril()
    seq = chunked(seq_idx, chunk) if seq_idx is not None else None  # (batch, nchunks, chunk)

    y = torch.empty_like(xc)
    step = max(1, BLOCK_ELEMENTS // max(1, batch * nheads * chunk * chunk))
    for c0 in range(0, nchunks, step):
        sl = slice(c0, min(nchunks, c0 + step))
        keep = causal.expand(batch, sl.stop - sl.start, chunk, chunk)
        if seq is not None:
            keep = keep & (seq[:, sl, :, None] == seq[:, sl, None, :])
        diff = dA[:, sl, :, :, None] - dA[:, sl, :, None, :]  # (b, c, h, l, s)
        decay = torch.exp(torch.where(keep[:, :, None], diff, float("-inf")))
        scores = torch.einsum("bclhn,bcshn->bchls", Cc[:, sl], Bc[:, sl]) * decay * dtc[:, sl, :, None, :]
        y_block = torch.einsum("bchls,bcshp->bclhp", scores, xc[:, sl])
        state_decay = torch.exp(dA[:, sl])  # (b, c, h, l)
        if seq is not None:
            state_decay = state_decay * _continues_previous_chunk(seq, seq_idx, chunk)[:, sl, None, :].to(dtype)
        y_block = y_block + torch.einsum("bclhn,bchpn->bclhp", Cc[:, sl], states[:, sl].to(dtype)) \
            * state_decay.permute(0, 1, 3, 2)[..., None]
        y[:, sl] = y_block
    y = y.reshape(batch, nchunks * chunk, nheads, headdim)[:, :seqlen]
    if D is not None:
        Dv = D.to(dtype)
        y = y + x.to(dtype) * (Dv[:, None] if Dv.dim() == 1 else Dv)
    if z is not None:
        zf = z.to(dtype)
        y = y * zf * torch.sigmoid(zf)
    return y.to(x.dtype)


def _continues_previous_chunk(seq, seq_idx, chunk):
    """(batch, nchunks, chunk): token belongs to the sequence active just before its chunk (0 before chunk 0)."""
    before = torch.zeros_like(seq[:, :, 0])
    if seq.shape[1] > 1:
        before[:, 1:] = seq_idx[:, chunk - 1::chunk][:, : seq.shape[1] - 1]
    return seq == before[..., None]
