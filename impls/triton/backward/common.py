"""Pieces the backward's kernels share: the exponential in its base, tiles of (batch, seqlen, heads, channels)
tensors, the gated incoming gradient dŷ = dy ⊙ silu(z), and the chunk's sequence predicates."""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def chunk_program(pid, per_chunk, nchunks, seqlen, TILES: tl.constexpr, CHUNK: tl.constexpr):
    """Program `pid` of a flat grid whose tiles run fastest, then `per_chunk` (the heads or the groups), the chunks,
    the batch rows -> (tile, head or group (int64), batch row (int64), chunk, its first position, its length)."""
    t = pid % TILES
    i = ((pid // TILES) % per_chunk).to(tl.int64)
    bc = pid // (TILES * per_chunk)
    c = bc % nchunks
    b = (bc // nchunks).to(tl.int64)
    start = c * CHUNK
    return t, i, b, c, start, tl.minimum(CHUNK, seqlen - start)


@triton.jit
def split_program(pid, ngroups, nchunks, seqlen, heads_per_group, TILES: tl.constexpr, CHUNK: tl.constexpr,
                  SPLIT: tl.constexpr):
    """Program `pid` of a per-group kernel's flat grid whose tiles run fastest, then the SPLIT shares of a group's
    heads (switch bwd_group_split), the groups, the chunks, the batch rows -> (tile, the partial's index g·SPLIT + p
    (int64), batch row, chunk, its first position, its length, the group g (int64), the share's heads [lo, hi) within
    the group: [p·H/SPLIT, (p+1)·H/SPLIT) of H = heads_per_group). SPLIT 1: `chunk_program`'s, every head."""
    if SPLIT == 1:
        t, g, b, c, start, chunk_len = chunk_program(pid, ngroups, nchunks, seqlen, TILES, CHUNK)
        gp = g
        lo = 0
        hi = heads_per_group
    else:
        t, gp, b, c, start, chunk_len = chunk_program(pid, ngroups * SPLIT, nchunks, seqlen, TILES, CHUNK)
        g = gp // SPLIT
        part = (gp % SPLIT).to(tl.int32)
        lo = part * heads_per_group // SPLIT
        hi = (part + 1) * heads_per_group // SPLIT
    return t, gp, b, c, start, chunk_len, g, lo, hi


@triton.jit
def decay(v, EXP2: tl.constexpr):
    """exp of `v`, already in the exponential's base (log2 e folded in by `log_decay` when EXP2)."""
    if EXP2:
        return tl.exp2(v)
    else:
        return tl.exp(v)


@triton.jit
def log_decay(ptrs, mask, EXP2: tl.constexpr):
    """dA_cumsum at `ptrs` in fp32, times log2 e when EXP2 (the one multiply per loaded value)."""
    v = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    if EXP2:
        v = v * 1.4426950408889634
    return v


@triton.jit
def log_decay_at(ptr, EXP2: tl.constexpr):
    """dA_cumsum at one position (the chunk's last: Λ_last), as `log_decay` reads it."""
    v = tl.load(ptr).to(tl.float32)
    if EXP2:
        v = v * 1.4426950408889634
    return v


@triton.jit
def rows(base, offs_l, offs_c, mask_l, mask_c, s_l, s_c):
    """A (positions, channels) tile of a (…, seqlen, …, channels) tensor at `base`, masked to zero, as stored."""
    return tl.load(base + offs_l[:, None] * s_l + offs_c[None, :] * s_c, mask=mask_l[:, None] & mask_c[None, :],
                   other=0.0)


@triton.jit
def gated_dy(dy_base, z_base, offs_l, offs_p, mask_l, mask_p, s_dy_l, s_dy_p, s_z_l, s_z_p, HAS_Z: tl.constexpr):
    """dŷ = dy ⊙ silu(z) (dy without z) as an fp32 (positions, headdim) tile."""
    dy = rows(dy_base, offs_l, offs_p, mask_l, mask_p, s_dy_l, s_dy_p).to(tl.float32)
    if HAS_Z:
        z = rows(z_base, offs_l, offs_p, mask_l, mask_p, s_z_l, s_z_p).to(tl.float32)
        dy = dy * z * tl.sigmoid(z)
    return dy


@triton.jit
def sequence_ends(seq_b, start, chunk_len, s_seq_l, HAS_SEQ: tl.constexpr):
    """(sequence of the chunk's last token, of the token before the chunk: 0 before the first chunk); zeros without
    seq_idx. `seq_b` is the batch row's seq_idx, `start` the chunk's first position."""
    if HAS_SEQ:
        last = tl.load(seq_b + (start + chunk_len - 1).to(tl.int64) * s_seq_l)
        before = tl.load(seq_b + (start - 1).to(tl.int64) * s_seq_l, mask=start > 0, other=0)
    else:
        last = 0
        before = 0
    return last, before
