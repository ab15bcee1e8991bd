"""Backward stage: d(C·Bᵀ) per group, and dC. One program per (row tile, group, chunk, batch) forms, for each source
tile s up to its rows, dG = Σ_{h in the group} dM^h ∘ L^h ∘ dt^h_s (one tl.dot per head), stores it for the dB kernel
and adds dG B_s to dC; then the entering states' term Σ_h e^{Λ^h_l} dŷ^h_l S^h_c (impls/README.md, "The chunked
backward", step 4), and with switch bwd_entry_term='dcb' dΛ's entering-state term per head from the same state tile
and the row tile's C (one more tl.dot per head, stored for the cumsum kernel). The heads of a group are summed in
registers in a fixed order: no atomics. Switch bwd_group_split k > 1: k programs per group, each over its share of
the heads, writing fp32 partials of dG and dC (partial p of group g at g·k + p of the group axis), or adding its dC
into one fp32 buffer (bwd_atomics)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from impls.chunked_backward import group_output, source_widths, sum_partials
from impls.triton import launcher
from impls.triton.backward.common import decay, gated_dy, log_decay, rows, sequence_ends, split_program
from impls.triton.clamp import pow2_at_least_16


@triton.jit
def _head_scores(x_c, dy_c, z_c, dA_c, dt_c, h, offs_l, offs_s, offs_p, mask_l, mask_s, mask_p, keep,
                 s_x_h, s_x_l, s_x_p, s_dy_h, s_dy_l, s_dy_p, s_z_h, s_z_l, s_z_p, s_dA_h, s_dA_l, s_dt_h, s_dt_l,
                 HAS_Z: tl.constexpr, EXP2: tl.constexpr, DOT_PRECISION: tl.constexpr, dtype: tl.constexpr):
    """Head h's part of dG on rows offs_l and sources offs_s, dM ∘ L ∘ dt_s (fp32), with its dŷ_l (fp32) and its
    rows' Λ (the exponential's base); `*_c` point at the chunk (x, dy, z: its first row; dA, dt: head 0's)."""
    x_h, dy_h, z_h = x_c + h * s_x_h, dy_c + h * s_dy_h, z_c + h * s_z_h
    dA_h, dt_h = dA_c + h * s_dA_h, dt_c + h * s_dt_h
    dyh_l = gated_dy(dy_h, z_h, offs_l, offs_p, mask_l, mask_p, s_dy_l, s_dy_p, s_z_l, s_z_p, HAS_Z)
    x_s = rows(x_h, offs_s, offs_p, mask_s, mask_p, s_x_l, s_x_p).to(dtype)
    dA_l = log_decay(dA_h + offs_l * s_dA_l, mask_l, EXP2)
    dA_s = log_decay(dA_h + offs_s * s_dA_l, mask_s, EXP2)
    dt_s = tl.load(dt_h + offs_s * s_dt_l, mask=mask_s, other=0.0).to(tl.float32)
    L = decay(tl.where(keep, dA_l[:, None] - dA_s[None, :], float("-inf")), EXP2)
    dM = tl.dot(dyh_l.to(dtype), tl.trans(x_s), input_precision=DOT_PRECISION)  # (l, s)
    return dM * L * dt_s[None, :], dyh_l, dA_l


@triton.jit
def _entering_term(out, C_l, S, dyh_l, scale, mask_l, DOT_PRECISION: tl.constexpr):
    """Head h's dΛ_l entering-state term e^{Λ_l} dŷ_l · (S_c C_l) on the row tile (scale: e^{Λ_l}, 0 off the
    entering sequence), stored (a store: a search runs the kernel many times)."""
    CS = tl.dot(C_l, tl.trans(S), input_precision=DOT_PRECISION)  # (rows, headdim)
    tl.store(out, scale * tl.sum(dyh_l * CS, axis=1), mask=mask_l)


@triton.jit
def _row_block(
    acc, x_c, dy_c, z_c, dA_b, dt_b, st_c, G_c, B_c, seq_b, C_l, enter_c,
    h0, lo, hi, start64, chunk_len, offs_l, offs_p, offs_n, mask_l, mask_p, mask_n, seq_l, enter,
    s_x_h, s_x_l, s_x_p, s_dy_h, s_dy_l, s_dy_p, s_z_h, s_z_l, s_z_p, s_dA_h, s_dA_l, s_dt_h, s_dt_l,
    s_seq_l, s_st_h, s_st_p, s_st_n, s_G_l, s_G_s, s_B_l, s_B_n, s_en_h,
    W: tl.constexpr, BLOCK_L: tl.constexpr, HAS_SEQ: tl.constexpr, HAS_Z: tl.constexpr, EXP2: tl.constexpr,
    DOT_PRECISION: tl.constexpr, LOOP_STAGES: tl.constexpr, ENTER_TERM: tl.constexpr,
):
    """Switch bwd_dcb_sources='chunk': the row tile against the chunk's first W sources (W ≥ its last row + 1: every
    source it depends on), one (rows × W) product per head and, in the same head walk, the entering states' term;
    dG's row block stored for those W sources (zero above the diagonal; the sources past W, which the dB kernel's
    causal mask never reads, left as they are); -> acc + dC's sources' term, one MMA with their B."""
    dtype = x_c.dtype.element_ty
    offs_c = tl.arange(0, W)
    mask_c = offs_c < chunk_len
    keep = (offs_l[:, None] >= offs_c[None, :]) & mask_l[:, None] & mask_c[None, :]
    if HAS_SEQ:
        seq_c = tl.load(seq_b + (start64 + offs_c) * s_seq_l, mask=mask_c, other=0)
        keep = keep & (seq_l[:, None] == seq_c[None, :])
    dG = tl.zeros((BLOCK_L, W), dtype=tl.float32)
    for hh in tl.range(lo, hi, num_stages=LOOP_STAGES):
        part, dyh_l, dA_l = _head_scores(
            x_c, dy_c, z_c, dA_b, dt_b, h0 + hh, offs_l, offs_c, offs_p, mask_l, mask_c, mask_p, keep, s_x_h, s_x_l,
            s_x_p, s_dy_h, s_dy_l, s_dy_p, s_z_h, s_z_l, s_z_p, s_dA_h, s_dA_l, s_dt_h, s_dt_l, HAS_Z, EXP2,
            DOT_PRECISION, dtype)
        dG += part
        # the entering states' term in the same walk
        h = h0 + hh
        scale = tl.where(enter, decay(dA_l, EXP2), 0.0)
        S = tl.load(st_c + h * s_st_h + offs_p[:, None] * s_st_p + offs_n[None, :] * s_st_n,
                    mask=mask_p[:, None] & mask_n[None, :], other=0.0).to(dtype)
        acc = tl.dot((dyh_l * scale[:, None]).to(dtype), S, acc, input_precision=DOT_PRECISION)
        if ENTER_TERM:
            _entering_term(enter_c + h * s_en_h, C_l, S, dyh_l, scale, mask_l, DOT_PRECISION)
    tl.store(G_c + offs_l[:, None] * s_G_l + offs_c[None, :] * s_G_s, dG)
    B_w = rows(B_c, offs_c, offs_n, mask_c, mask_n, s_B_l, s_B_n).to(dtype)
    return tl.dot(dG.to(dtype), B_w, acc, input_precision=DOT_PRECISION)


@triton.jit
def bwd_dcb_kernel(
    x_ptr, B_ptr, dt_ptr, dA_ptr, seq_ptr, st_ptr, dy_ptr, z_ptr, dG_ptr, dC_ptr, C_ptr, enter_ptr,
    seqlen, ngroups, nchunks, headdim, dstate, heads_per_group,
    s_x_b, s_x_l, s_x_h, s_x_p,
    s_B_b, s_B_l, s_B_g, s_B_n,
    s_dt_b, s_dt_h, s_dt_c, s_dt_l,
    s_dA_b, s_dA_h, s_dA_c, s_dA_l,
    s_seq_b, s_seq_l,
    s_st_b, s_st_c, s_st_h, s_st_p, s_st_n,
    s_dy_b, s_dy_l, s_dy_h, s_dy_p,
    s_z_b, s_z_l, s_z_h, s_z_p,
    s_G_b, s_G_c, s_G_g, s_G_l, s_G_s,
    s_dC_b, s_dC_l, s_dC_g, s_dC_n,
    s_C_b, s_C_l, s_C_g, s_C_n,
    s_en_b, s_en_h, s_en_c,
    CHUNK: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr, HAS_SEQ: tl.constexpr, HAS_Z: tl.constexpr, EXP2: tl.constexpr,
    DOT_PRECISION: tl.constexpr, SPLIT: tl.constexpr, ATOMIC: tl.constexpr, LOOP_STAGES: tl.constexpr,
    WHOLE: tl.constexpr, ENTER_TERM: tl.constexpr, WIDTHS: tl.constexpr,
):
    # flat grid: row tile fastest, then the group's share of heads (SPLIT of them), group, chunk, batch
    TILES: tl.constexpr = CHUNK // BLOCK_L
    t, gp, b, c, start, chunk_len, g, lo, hi = split_program(tl.program_id(0), ngroups, nchunks, seqlen,
                                                            heads_per_group, TILES, CHUNK, SPLIT)
    c64 = c.to(tl.int64)
    start64 = start.to(tl.int64)
    l0 = t * BLOCK_L
    offs_l = l0 + tl.arange(0, BLOCK_L)
    mask_l = offs_l < chunk_len
    offs_p = tl.arange(0, BLOCK_P)
    mask_p = offs_p < headdim
    offs_n = tl.arange(0, BLOCK_N)
    mask_n = offs_n < dstate
    dtype = x_ptr.dtype.element_ty
    B_c = B_ptr + b * s_B_b + start64 * s_B_l + g * s_B_g
    seq_b = seq_ptr + b * s_seq_b
    _, seq_before = sequence_ends(seq_b, start, chunk_len, s_seq_l, HAS_SEQ)
    enter = mask_l
    seq_l = offs_l
    if HAS_SEQ:
        seq_l = tl.load(seq_b + (start64 + offs_l) * s_seq_l, mask=mask_l, other=0)
        enter = enter & (seq_l == seq_before)
    h0 = g * heads_per_group
    acc = tl.zeros((BLOCK_L, BLOCK_N), dtype=tl.float32)
    G_c = dG_ptr + b * s_G_b + c64 * s_G_c + gp * s_G_g
    # the chunk's first row of x, dy, z and head 0's dA_cumsum and dt in it
    x_c, dy_c = x_ptr + b * s_x_b + start64 * s_x_l, dy_ptr + b * s_dy_b + start64 * s_dy_l
    z_c = z_ptr + b * s_z_b + start64 * s_z_l
    dA_b, dt_b = dA_ptr + b * s_dA_b + c64 * s_dA_c, dt_ptr + b * s_dt_b + c64 * s_dt_c
    # switch bwd_entry_term='dcb': dΛ's entering-state term per head from the state tile loaded for dC's, and C_l
    # (without ENTER_TERM nothing reads C_l, and the compiler drops its load)
    C_l = rows(C_ptr + b * s_C_b + start64 * s_C_l + g * s_C_g, offs_l, offs_n, mask_l, mask_n, s_C_l, s_C_n).to(dtype)
    enter_c = enter_ptr + b * s_en_b + c64 * s_en_c + offs_l
    if WHOLE:  # switch bwd_dcb_sources='chunk': the row tile against the sources up to its causal width
        for level in tl.static_range(WIDTHS):
            # row tiles 2^(level-1) … 2^level − 1 (tile 0 at level 0) read the chunk's first BLOCK_L·2^level sources
            if (t < (1 << level)) & (t >= ((1 << level) >> 1)):
                acc = _row_block(
                    acc, x_c, dy_c, z_c, dA_b, dt_b, st_ptr + b * s_st_b + c64 * s_st_c, G_c, B_c, seq_b, C_l, enter_c,
                    h0, lo, hi, start64, chunk_len, offs_l, offs_p, offs_n, mask_l, mask_p, mask_n, seq_l, enter,
                    s_x_h, s_x_l, s_x_p, s_dy_h, s_dy_l, s_dy_p, s_z_h, s_z_l, s_z_p, s_dA_h, s_dA_l, s_dt_h, s_dt_l,
                    s_seq_l, s_st_h, s_st_p, s_st_n, s_G_l, s_G_s, s_B_l, s_B_n, s_en_h,
                    BLOCK_L * (1 << level), BLOCK_L, HAS_SEQ, HAS_Z, EXP2, DOT_PRECISION, LOOP_STAGES, ENTER_TERM)
    else:
        for s0 in range(0, tl.minimum(l0 + BLOCK_L, chunk_len), BLOCK_S):
            offs_s = s0 + tl.arange(0, BLOCK_S)
            mask_s = offs_s < chunk_len
            keep = (offs_l[:, None] >= offs_s[None, :]) & mask_l[:, None] & mask_s[None, :]
            if HAS_SEQ:
                seq_s = tl.load(seq_b + (start64 + offs_s) * s_seq_l, mask=mask_s, other=0)
                keep = keep & (seq_l[:, None] == seq_s[None, :])
            dG = tl.zeros((BLOCK_L, BLOCK_S), dtype=tl.float32)
            # the head loop is nested: Triton's pipeliner stages its loads only when the loop asks (num_stages here)
            for hh in tl.range(lo, hi, num_stages=LOOP_STAGES):
                part, dyh_l, dA_l = _head_scores(
                    x_c, dy_c, z_c, dA_b, dt_b, h0 + hh, offs_l, offs_s, offs_p, mask_l, mask_s, mask_p, keep, s_x_h,
                    s_x_l, s_x_p, s_dy_h, s_dy_l, s_dy_p, s_z_h, s_z_l, s_z_p, s_dA_h, s_dA_l, s_dt_h, s_dt_l, HAS_Z,
                    EXP2, DOT_PRECISION, dtype)
                dG += part
            # whole tiles (every tile lies inside the chunk): the dB kernel reads the causal part of what is here
            tl.store(G_c + offs_l[:, None] * s_G_l + offs_s[None, :] * s_G_s, dG)
            B_s = rows(B_c, offs_s, offs_n, mask_s, mask_n, s_B_l, s_B_n).to(dtype)
            acc = tl.dot(dG.to(dtype), B_s, acc, input_precision=DOT_PRECISION)
        for hh in range(lo, hi):
            h = h0 + hh
            dA_l = log_decay(dA_ptr + b * s_dA_b + h * s_dA_h + c64 * s_dA_c + offs_l * s_dA_l, mask_l, EXP2)
            scale = tl.where(enter, decay(dA_l, EXP2), 0.0)
            dyh_l = gated_dy(dy_ptr + b * s_dy_b + start64 * s_dy_l + h * s_dy_h,
                             z_ptr + b * s_z_b + start64 * s_z_l + h * s_z_h, offs_l, offs_p, mask_l, mask_p, s_dy_l,
                             s_dy_p, s_z_l, s_z_p, HAS_Z)
            S = tl.load(st_ptr + b * s_st_b + c64 * s_st_c + h * s_st_h + offs_p[:, None] * s_st_p
                        + offs_n[None, :] * s_st_n, mask=mask_p[:, None] & mask_n[None, :], other=0.0).to(dtype)
            acc = tl.dot((dyh_l * scale[:, None]).to(dtype), S, acc, input_precision=DOT_PRECISION)
            if ENTER_TERM:
                _entering_term(enter_c + h * s_en_h, C_l, S, dyh_l, scale, mask_l, DOT_PRECISION)
    if ATOMIC:  # switch bwd_atomics: the group's one fp32 buffer
        tl.atomic_add(dC_ptr + b * s_dC_b + (start64 + offs_l[:, None]) * s_dC_l + g * s_dC_g
                      + offs_n[None, :] * s_dC_n, acc, mask=mask_l[:, None] & mask_n[None, :], sem="relaxed")
    else:  # dC (SPLIT 1), or this program's fp32 partial
        tl.store(dC_ptr + b * s_dC_b + (start64 + offs_l[:, None]) * s_dC_l + gp * s_dC_g
                 + offs_n[None, :] * s_dC_n, acc.to(dC_ptr.dtype.element_ty), mask=mask_l[:, None] & mask_n[None, :])


def dcb_grads(x, B, C, dt, dA_cumsum, seq_idx, states, dy, z, *, config, switches, empty, dot_precision):
    """-> (dC in C's dtype, d(C·Bᵀ) per group (batch, nchunks, ngroups·k, chunk, chunk) fp32: its causal part, k =
    switch bwd_group_split's partials of each group, partial p of group g at g·k + p; dΛ's entering-state term
    (batch, nheads, nchunks, 1, chunk) fp32 with switch bwd_entry_term='dcb', else None)."""
    batch, seqlen, nheads, headdim = x.shape
    ngroups, dstate = B.shape[2], B.shape[3]
    nchunks, chunk = dt.shape[2], dt.shape[3]
    block_l = config["block_rows"]
    split = switches.bwd_group_split
    dG = empty((batch, nchunks, ngroups * split, chunk, chunk), torch.float32, x.device)
    dC = group_output(C, split, switches.bwd_atomics, empty)
    seq = seq_idx if seq_idx is not None else dt  # never read without HAS_SEQ
    zz = z if z is not None else dy  # never read without HAS_Z
    entering = switches.bwd_entry_term == "dcb"
    terms = empty((batch, nheads, nchunks, 1, chunk), torch.float32, x.device) if entering else None
    en = terms if entering else dG  # never written without ENTER_TERM
    launcher.launch(
        bwd_dcb_kernel, ((chunk // block_l) * ngroups * split * nchunks * batch,), x, B, dt, dA_cumsum, seq, states,
        dy, zz, dG, dC, C, en,
        seqlen, ngroups, nchunks, headdim, dstate, nheads // ngroups,
        *x.stride(), *B.stride(), *dt.stride(), *dA_cumsum.stride(), seq.stride(0), seq.stride(1), *states.stride(),
        *dy.stride(), *zz.stride(), *dG.stride(), *dC.stride(), *C.stride(), *en.stride()[:3],
        CHUNK=chunk, BLOCK_L=block_l, BLOCK_S=config["block_sources"], BLOCK_P=pow2_at_least_16(headdim),
        BLOCK_N=pow2_at_least_16(dstate), HAS_SEQ=seq_idx is not None, HAS_Z=z is not None, EXP2=switches.exp2,
        DOT_PRECISION=dot_precision, SPLIT=split, ATOMIC=switches.bwd_atomics, LOOP_STAGES=config["num_stages"],
        WHOLE=switches.bwd_dcb_sources == "chunk", ENTER_TERM=entering, WIDTHS=source_widths(chunk, block_l),
        num_warps=config["num_warps"], num_stages=config["num_stages"], path=switches.launch_path,
    )
    return sum_partials(dC, ngroups, None, C.dtype), dG, terms
