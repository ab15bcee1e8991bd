"""Backward stage in cuTile: dB per group. One tile program per (source tile, group, batch·chunk): dB_s =
Σ_l d(C·Bᵀ)_lsᵀ C_l over the row tiles l ≥ s (the dcb kernel's d(C·Bᵀ), its causal part), plus the local states' term
Σ_h (w^h_s x^h_s) R^h_c over the heads of the group in a fixed order (impls/README.md, "The chunked backward", step
4). A source tile past the end of a short last chunk has no rows and does nothing. Switch bwd_group_split k > 1: k
programs per group, program p taking its share of the row tiles (d(C·Bᵀ) completed there, the dcb kernel's k
partials added in order as loaded) and of the heads into an fp32 partial of dB (or adding it into one fp32 buffer by
atomic adds: bwd_atomics); the per-sequence states' term is then added on the host."""

from __future__ import annotations

import math

import cuda.tile as ct
import torch

from impls.chunked_backward import group_output, sum_partials
from impls.cutile.backward.common import (
    Hints,
    add_rows,
    allocate,
    chunk_length,
    head_share,
    kernel_call,
    or_stand_in,
    per_position,
    rows,
)
from impls.cutile.common import KernelCall, next_pow2
from impls.cutile.fwd_pass_state import seq_ends

ZERO = ct.PaddingMode.ZERO


def bwd_db_kernel(x, C, dt, dA, seq, ds, dG, bv, dB, seqlen, heads_per_group,
                  CHUNK: ct.Constant[int], BT: ct.Constant[int], BP: ct.Constant[int], BN: ct.Constant[int],
                  HAS_SEQ: ct.Constant[bool], HAS_BV: ct.Constant[bool], TF32: ct.Constant[bool],
                  EXP2: ct.Constant[bool], TMA: ct.Constant[bool], LAT: ct.Constant[int], SPLIT: ct.Constant[int],
                  ATOMIC: ct.Constant[bool], FTZ: ct.Constant[bool]):
    """dB in B's dtype (SPLIT 1), its fp32 partials (b, seqlen, g·SPLIT, dstate), or one fp32 buffer added into
    (ATOMIC); dG dcb's partials (b, nchunks, g·SPLIT, chunk, chunk); bv the per-sequence states' gradient of B (fp32,
    like B)."""
    k = Hints(TMA, LAT, EXP2, TF32, FTZ)
    # one flat grid axis: source tile fastest, then the group's share of heads (SPLIT of them), group, chunk, batch
    pid = ct.bid(0)
    tiles, ngroups, nchunks = CHUNK // BT, C.shape[2] * SPLIT, dA.shape[2]
    j, gp = pid % tiles, (pid // tiles) % ngroups
    c, b = (pid // (tiles * ngroups)) % nchunks, pid // (tiles * ngroups * nchunks)
    chunk_len = chunk_length(seqlen, c, CHUNK)
    if j * BT < chunk_len:
        _source_tile(x, C, dt, dA, seq, ds, dG, bv, dB, seqlen, heads_per_group, b, c, gp, j, chunk_len, CHUNK, BT, BP,
                     BN, HAS_SEQ, HAS_BV, SPLIT, ATOMIC, k)


def _source_tile(x, C, dt, dA, seq, ds, dG, bv, dB, seqlen, heads_per_group, b, c, gp, j, chunk_len, CHUNK, BT, BP,
                 BN, HAS_SEQ, HAS_BV, SPLIT, ATOMIC, k):
    g, lo, hi = head_share(gp, heads_per_group, SPLIT)
    sb = c * (CHUNK // BT) + j
    offs_s = j * BT + ct.arange(BT, dtype=ct.int32)
    mask_s = offs_s < chunk_len
    acc = ct.zeros((BT, BN), ct.float32)
    last = (chunk_len + BT - 1) // BT
    part = gp % SPLIT  # this program's share of the row tiles i ≥ j (all of them with SPLIT 1)
    for i in range(j + part * (last - j) // SPLIT, j + (part + 1) * (last - j) // SPLIT):
        offs_l = i * BT + ct.arange(BT, dtype=ct.int32)
        causal = ((offs_l.reshape((BT, 1)) >= offs_s.reshape((1, BT))) & (offs_l < chunk_len).reshape((BT, 1))
                  & mask_s.reshape((1, BT)))
        dGt = ct.load(dG, (b, c, g * SPLIT, i, j), (1, 1, 1, BT, BT), allow_tma=k.tma()).reshape((BT, BT))
        for q in ct.static_iter(range(1, SPLIT)):  # d(C·Bᵀ) complete: the group's partials added q = 1 … SPLIT − 1
            dGt = dGt + ct.load(dG, (b, c, g * SPLIT + q, i, j), (1, 1, 1, BT, BT), allow_tma=k.tma()).reshape((BT, BT))
        dGt = ct.where(causal, dGt, 0.0)  # (l, s)
        acc = k.mma(ct.transpose(dGt).astype(x.dtype), rows(C, b, c * (CHUNK // BT) + i, g, 0, BT, BN, k), acc)
    own = mask_s
    if HAS_SEQ:
        seq_s = ct.load(seq, (b, sb), (1, BT), padding_mode=ZERO, allow_tma=k.tma()).reshape((BT,))
        s_last, _ = seq_ends(seq, seqlen, b, c, CHUNK)
        own = own & (seq_s == s_last)
    for hh in range(lo, hi):
        h = g * heads_per_group + hh
        dA_s = per_position(dA, b, h, c, j, BT, k) * k.base()
        dA_last = ct.gather(dA, (b, h, c, CHUNK - 1)) * k.base()
        w = ct.where(own, k.exp(dA_last - dA_s), 0.0) * per_position(dt, b, h, c, j, BT, k)
        xw = rows(x, b, sb, h, 0, BT, BP, k).astype(ct.float32) * w.reshape((BT, 1))
        R = ct.load(ds, (b, c, h, 0, 0), (1, 1, 1, BP, BN), padding_mode=ZERO, allow_tma=k.tma(), latency=k.lat())
        acc = k.mma(xw.astype(x.dtype), R.reshape((BP, BN)), acc)
    if HAS_BV:  # the per-sequence states' gradient (cu_seqlens), from autograd
        acc = acc + rows(bv, b, sb, g, 0, BT, BN, k)
    if ATOMIC:  # switch bwd_atomics: the group's one fp32 buffer
        add_rows(dB, b, c * CHUNK + offs_s, g, acc, BT, BN)
    else:  # dB (SPLIT 1), or this program's fp32 partial
        ct.store(dB, (b, sb, gp, 0), acc.astype(dB.dtype).reshape((1, BT, 1, BN)), allow_tma=k.tma())


def blocks(chunk: int, headdim: int, dstate: int, config: dict) -> tuple[int, int, int]:
    """(source and row tile, headdim, dstate)."""
    return min(config.get("block") or 64, chunk), next_pow2(headdim), next_pow2(dstate)


def make_call(arrays, dims, chunk_size: int, flags: dict, tf32: bool, sw, config) -> KernelCall:
    """arrays = (x, C, dt, dA, seq, ds, dG, bv, dB): tensors, or ArraySpec for AOT compiles; flags: seq, bv."""
    batch, seqlen, nheads, headdim, ngroups, dstate = dims
    bt, bp, bn = blocks(chunk_size, headdim, dstate, config)
    args = (*arrays, seqlen, nheads // ngroups, chunk_size, bt, bp, bn, bool(flags["seq"]), bool(flags["bv"]),
            bool(tf32), sw.exp2, sw.tma, 4 if sw.latency_hints else 0, sw.bwd_group_split, sw.bwd_atomics,
            sw.bwd_exp2_ftz)
    grid = ((chunk_size // bt) * ngroups * sw.bwd_group_split * math.ceil(seqlen / chunk_size) * batch, 1, 1)
    return kernel_call(bwd_db_kernel, grid, args, config, sw.opt_level)


def db_grads(x, B, C, dt, dA_cumsum, seq_idx, ds, dG, extra_dB, *, sw, config, tf32: bool,
             submit=None):
    """-> dB in B's dtype (`dG`: dcb_grads' partials, switch bwd_group_split's k per group)."""
    from impls.cutile import common

    batch, seqlen, nheads, headdim = x.shape
    ngroups, dstate = B.shape[2], B.shape[3]
    chunk, dev = dt.shape[3], x.device
    dB = group_output(B, sw.bwd_group_split, sw.bwd_atomics, allocate)
    in_kernel = extra_dB if sw.bwd_group_split == 1 else None  # with partials, added to their sum (sum_partials)
    arrays = (x, C, dt, dA_cumsum, or_stand_in(seq_idx, dev, torch.int32, 2), ds, dG,
              or_stand_in(in_kernel, dev, torch.float32, 4), dB)
    flags = {"seq": seq_idx is not None, "bv": in_kernel is not None}
    call = make_call(arrays, (batch, seqlen, nheads, headdim, ngroups, dstate), chunk, flags, tf32, sw, config)
    (submit or common.launch)(call)
    return sum_partials(dB, ngroups, None if sw.bwd_group_split == 1 else extra_dB, B.dtype)
