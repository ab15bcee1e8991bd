"""Backward stage: dB per group. One program per (source tile, group, chunk, batch): dB_s = Σ_l d(C·Bᵀ)_lsᵀ C_l over
the row tiles l ≥ s (the dcb kernel's d(C·Bᵀ)), plus the local states' term Σ_h (w^h_s x^h_s) R^h_c over the heads of
the group in a fixed order (impls/README.md, "The chunked backward", step 4). Switch bwd_group_split k > 1: k
programs per group, program p taking its share of the row tiles (d(C·Bᵀ) completed there, the dcb kernel's k
partials added in order as loaded) and of the heads into an fp32 partial of dB (or adding it into one fp32 buffer:
bwd_atomics); the per-sequence states' term is then added on the host."""

from __future__ import annotations

import triton
import triton.language as tl

from impls.chunked_backward import group_output, sum_partials
from impls.triton import launcher
from impls.triton.backward.common import decay, log_decay, log_decay_at, rows, sequence_ends, split_program
from impls.triton.clamp import pow2_at_least_16


@triton.jit
def bwd_db_kernel(
    x_ptr, C_ptr, dt_ptr, dA_ptr, seq_ptr, ds_ptr, dG_ptr, bv_ptr, dB_ptr,
    seqlen, ngroups, nchunks, headdim, dstate, heads_per_group,
    s_x_b, s_x_l, s_x_h, s_x_p,
    s_C_b, s_C_l, s_C_g, s_C_n,
    s_dt_b, s_dt_h, s_dt_c, s_dt_l,
    s_dA_b, s_dA_h, s_dA_c, s_dA_l,
    s_seq_b, s_seq_l,
    s_ds_b, s_ds_c, s_ds_h, s_ds_p, s_ds_n,
    s_G_b, s_G_c, s_G_g, s_G_l, s_G_s,
    s_bv_b, s_bv_l, s_bv_g, s_bv_n,
    s_dB_b, s_dB_l, s_dB_g, s_dB_n,
    CHUNK: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr, HAS_SEQ: tl.constexpr, HAS_BV: tl.constexpr, EXP2: tl.constexpr,
    DOT_PRECISION: tl.constexpr, SPLIT: tl.constexpr, ATOMIC: tl.constexpr,
):
    # flat grid: source tile fastest, then the group's share of heads (SPLIT of them), group, chunk, batch
    TILES: tl.constexpr = CHUNK // BLOCK_S
    t, gp, b, c, start, chunk_len, g, lo, hi = split_program(tl.program_id(0), ngroups, nchunks, seqlen,
                                                            heads_per_group, TILES, CHUNK, SPLIT)
    c64 = c.to(tl.int64)
    start64 = start.to(tl.int64)
    s0 = t * BLOCK_S
    offs_s = s0 + tl.arange(0, BLOCK_S)
    mask_s = offs_s < chunk_len
    offs_p = tl.arange(0, BLOCK_P)
    mask_p = offs_p < headdim
    offs_n = tl.arange(0, BLOCK_N)
    mask_n = offs_n < dstate
    dtype = x_ptr.dtype.element_ty
    C_c = C_ptr + b * s_C_b + start64 * s_C_l + g * s_C_g
    G_c = dG_ptr + b * s_G_b + c64 * s_G_c + g * SPLIT * s_G_g  # the group's first partial
    acc = tl.zeros((BLOCK_S, BLOCK_N), dtype=tl.float32)
    first = (s0 // BLOCK_L) * BLOCK_L
    end = chunk_len
    if SPLIT > 1:  # this program's share of the row tiles l ≥ s
        n = tl.cdiv(chunk_len - first, BLOCK_L)
        part = (gp - g * SPLIT).to(tl.int32)
        end = tl.minimum(first + (part + 1) * n // SPLIT * BLOCK_L, chunk_len)
        first = first + part * n // SPLIT * BLOCK_L
    for l0 in range(first, end, BLOCK_L):
        offs_l = l0 + tl.arange(0, BLOCK_L)
        mask_l = offs_l < chunk_len
        causal = (offs_l[None, :] >= offs_s[:, None]) & mask_l[None, :] & mask_s[:, None]
        dGt = tl.load(G_c + offs_s[:, None] * s_G_s + offs_l[None, :] * s_G_l, mask=causal, other=0.0)  # (s, l)
        for q in tl.static_range(1, SPLIT):  # d(C·Bᵀ) complete: the group's partials added q = 1 … SPLIT − 1
            dGt += tl.load(G_c + q * s_G_g + offs_s[:, None] * s_G_s + offs_l[None, :] * s_G_l, mask=causal,
                           other=0.0)
        C_l = rows(C_c, offs_l, offs_n, mask_l, mask_n, s_C_l, s_C_n).to(dtype)
        acc = tl.dot(dGt.to(dtype), C_l, acc, input_precision=DOT_PRECISION)
    seq_b = seq_ptr + b * s_seq_b
    seq_last, _ = sequence_ends(seq_b, start, chunk_len, s_seq_l, HAS_SEQ)
    own = mask_s
    if HAS_SEQ:
        seq_s = tl.load(seq_b + (start64 + offs_s) * s_seq_l, mask=mask_s, other=0)
        own = own & (seq_s == seq_last)
    for hh in range(lo, hi):
        h = g * heads_per_group + hh
        dA_c = dA_ptr + b * s_dA_b + h * s_dA_h + c64 * s_dA_c
        dA_s = log_decay(dA_c + offs_s * s_dA_l, mask_s, EXP2)
        dt_s = tl.load(dt_ptr + b * s_dt_b + h * s_dt_h + c64 * s_dt_c + offs_s * s_dt_l, mask=mask_s,
                       other=0.0).to(tl.float32)
        w = tl.where(own, decay(log_decay_at(dA_c + (CHUNK - 1) * s_dA_l, EXP2) - dA_s, EXP2), 0.0) * dt_s
        x_s = rows(x_ptr + b * s_x_b + start64 * s_x_l + h * s_x_h, offs_s, offs_p, mask_s, mask_p, s_x_l,
                   s_x_p).to(tl.float32)
        R = tl.load(ds_ptr + b * s_ds_b + c64 * s_ds_c + h * s_ds_h + offs_p[:, None] * s_ds_p
                    + offs_n[None, :] * s_ds_n, mask=mask_p[:, None] & mask_n[None, :], other=0.0).to(dtype)
        acc = tl.dot((x_s * w[:, None]).to(dtype), R, acc, input_precision=DOT_PRECISION)
    if HAS_BV:  # the per-sequence states' gradient (cu_seqlens), from autograd
        acc += rows(bv_ptr + b * s_bv_b + start64 * s_bv_l + g * s_bv_g, offs_s, offs_n, mask_s, mask_n, s_bv_l,
                    s_bv_n).to(tl.float32)
    if ATOMIC:  # switch bwd_atomics: the group's one fp32 buffer
        tl.atomic_add(dB_ptr + b * s_dB_b + (start64 + offs_s[:, None]) * s_dB_l + g * s_dB_g
                      + offs_n[None, :] * s_dB_n, acc, mask=mask_s[:, None] & mask_n[None, :], sem="relaxed")
    else:  # dB (SPLIT 1), or this program's fp32 partial
        tl.store(dB_ptr + b * s_dB_b + (start64 + offs_s[:, None]) * s_dB_l + gp * s_dB_g
                 + offs_n[None, :] * s_dB_n, acc.to(dB_ptr.dtype.element_ty), mask=mask_s[:, None] & mask_n[None, :])


def db_grads(x, B, C, dt, dA_cumsum, seq_idx, ds, dG, extra_dB, *, config, switches, empty, dot_precision):
    """-> dB in B's dtype (`dG`: dcb_grads' partials, switch bwd_group_split's k per group)."""
    batch, seqlen, nheads, headdim = x.shape
    ngroups, dstate = B.shape[2], B.shape[3]
    nchunks, chunk = dt.shape[2], dt.shape[3]
    block_s = config["block_sources"]
    split = switches.bwd_group_split
    dB = group_output(B, split, switches.bwd_atomics, empty)
    seq = seq_idx if seq_idx is not None else dt  # never read without HAS_SEQ
    in_kernel = extra_dB if split == 1 else None  # with partials, added to their sum (sum_partials)
    bv = in_kernel if in_kernel is not None else B  # never read without HAS_BV
    launcher.launch(
        bwd_db_kernel, ((chunk // block_s) * ngroups * split * nchunks * batch,), x, C, dt, dA_cumsum, seq, ds, dG,
        bv, dB,
        seqlen, ngroups, nchunks, headdim, dstate, nheads // ngroups,
        *x.stride(), *C.stride(), *dt.stride(), *dA_cumsum.stride(), seq.stride(0), seq.stride(1), *ds.stride(),
        *dG.stride(), *bv.stride(), *dB.stride(),
        CHUNK=chunk, BLOCK_S=block_s, BLOCK_L=config["block_rows"], BLOCK_P=pow2_at_least_16(headdim),
        BLOCK_N=pow2_at_least_16(dstate), HAS_SEQ=seq_idx is not None, HAS_BV=in_kernel is not None,
        EXP2=switches.exp2, DOT_PRECISION=dot_precision, SPLIT=split, ATOMIC=switches.bwd_atomics,
        num_warps=config["num_warps"], num_stages=config["num_stages"], path=switches.launch_path,
    )
    return sum_partials(dB, ngroups, None if split == 1 else extra_dB, B.dtype)
