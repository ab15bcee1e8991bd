"""Small helpers shared by the reference stages: accumulation dtype, chunk padding, head repetition."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def acc_dtype(*tensors) -> torch.dtype:
    """float64 if any input is float64 (the ground-truth mode), else float32."""
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def chunked(t: torch.Tensor, chunk_size: int, dtype=None) -> torch.Tensor:
    """(batch, seqlen, ...) -> (batch, nchunks, chunk_size, ...), zero-padded at the end."""
    seqlen = t.shape[1]
    nchunks = math.ceil(seqlen / chunk_size)
    pad = nchunks * chunk_size - seqlen
    if dtype is not None:
        t = t.to(dtype)
    if pad:
        t = F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad))
    return t.reshape(t.shape[0], nchunks, chunk_size, *t.shape[2:])


def per_head(t: torch.Tensor, nheads: int) -> torch.Tensor:
    """Repeats the group dimension (-2) of B or C so that head h reads group h // (nheads // ngroups)."""
    return t.repeat_interleave(nheads // t.shape[-2], dim=-2)


def chunk_last_index(seqlen: int, chunk_size: int, device) -> torch.Tensor:
    """Position of the last valid token of every chunk."""
    nchunks = math.ceil(seqlen / chunk_size)
    ends = torch.arange(1, nchunks + 1, device=device) * chunk_size
    return ends.clamp(max=seqlen) - 1


def skip_and_gate(y: torch.Tensor, x: torch.Tensor, D=None, z=None) -> torch.Tensor:
    """The output epilogue, in y's dtype: y + D ⊙ x (D per head (nheads,) or per channel (nheads, headdim)),
    then the gate y ⊙ z ⊙ sigmoid(z)."""
    dtype = y.dtype
    if D is not None:
        Dv = D.to(dtype)
        y = y + x.to(dtype) * (Dv[:, None] if Dv.dim() == 1 else Dv)
    if z is not None:
        zf = z.to(dtype)
        y = y * zf * torch.sigmoid(zf)
    return y


def chunk_blocks(nchunks: int, chunk_size: int, seqlen: int, chunks_per_block: int):
    """Blocks of whole chunks: (slice of chunk indices, slice of the tokens they hold)."""
    step = max(1, chunks_per_block)
    for c0 in range(0, nchunks, step):
        c1 = min(nchunks, c0 + step)
        yield slice(c0, c1), slice(c0 * chunk_size, min(seqlen, c1 * chunk_size))


def decay_since_sequence_start(dA_cumsum, seq_chunked):
    """(batch, nheads, nchunks, chunk): Λ_l − Λ_{j0−1}, the decay from the start of token l's sequence inside its
    chunk (j0, or the chunk's first position for a sequence that began before) to l (Λ_{−1} = 0)."""
    chunk = seq_chunked.shape[-1]
    pos = torch.arange(chunk, device=seq_chunked.device)
    starts = torch.ones_like(seq_chunked, dtype=torch.bool)
    starts[..., 1:] = seq_chunked[..., 1:] != seq_chunked[..., :-1]
    j0 = torch.cummax(torch.where(starts, pos, 0), dim=-1).values  # (batch, nchunks, chunk)
    index = (j0 - 1).clamp(min=0)[:, None].expand_as(dA_cumsum)
    before = torch.where(j0[:, None] > 0, torch.gather(dA_cumsum, -1, index), torch.zeros_like(dA_cumsum))
    return dA_cumsum - before
