"""Stage 3, Triton: y = (C·Bᵀ ∘ L)·x + exp(dA_cs)·C·stateᵀ + D·x inside each chunk, gated by silu(z).

One program per (headdim tile, tile of chunk rows, head, chunk, batch). It holds its rows of C (all of dstate)
and computes, in fp32:
  1. the state term C_m·S_cᵀ scaled by exp(dA_cs[m]) (zero for rows whose sequence started inside the chunk);
  2. for every BLOCK_K-wide tile of earlier positions k (up to the causal edge): the scores C_m·B_kᵀ — on the fly
     (switch cb_mode="inline"), or read from the (b, c, g, chunk, chunk) fp32 C·Bᵀ that `cb_kernel` computed once
     per group ("shared": the heads of a group then stop recomputing it) — times exp(dA_cs[m] − dA_cs[k])·dt_k on
     the causal, same-sequence part, then the MMA with x_k;
  3. the D skip and the silu(z) gate, and one store in x's dtype.
Operands of each MMA are in the input dtype (fp32 accumulation); with fp32 inputs `cb_precision` picks tf32 or
ieee. A state tensor in another dtype (state_dtype) is cast to the input dtype for its MMA.

Switches: `operand_swap` computes the transposed tile yᵀ = S_c·C_mᵀ + xᵀ·(B·Cᵀ ∘ Lᵀ), putting chunk positions
on the MMA's N dimension and headdim on M; `exp2` turns every exp into exp2 with log2 e folded into dA_cs as
loaded; `decay_factor` takes the source tiles wholly before the row tile with the factored decay of impls/README.md
(no mask, no exp per (row, source) pair; the row factor scales their sum, in a second accumulator or, with
`decay_single`, in the one that holds the state term scaled by exp(dA_ref)); `transposed_layout` only matters
through the strides of `states` (fwd_pass_state's output): this kernel
reads states through their strides; `tma` loads C, B, x and the states and stores y through tensor descriptors
(impls/triton/descriptors.py), made in the kernel or, with `tma_descriptors='host'`, once on the host and passed
in (C_hd, B_hd, x_hd, y_hd, st_hd; None otherwise). The kernel's parts (c_rows, row_terms, state_term,
intra_chunk, epilogue) are jit functions that the fused kernel (impls/triton/fused.py) calls in another order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from impls.triton import descriptors, launcher
from impls.triton.chunk_cumsum import ex2
from impls.triton.fwd_pass_state import program_coords, rows_desc, states_desc
from impls.triton.grid import cdiv, next_pow2
from impls.triton.occupancy import maxnreg


@triton.jit
def _decay(v, EXP2: tl.constexpr, FTZ: tl.constexpr = True):
    # v is already in the exp's base: log2 e has been folded in when EXP2; FTZ: switch exp2_ftz (`ex2`)
    if EXP2:
        return ex2(v, FTZ)
    else:
        return tl.exp(v)


@triton.jit
def cb_kernel(C_ptr, B_ptr, cb_ptr, seqlen, nchunks, ngroups,
              s_C_b, s_C_l, s_C_g, s_C_n, s_B_b, s_B_l, s_B_g, s_B_n, s_cb_b, s_cb_c, s_cb_g, s_cb_m, s_cb_k,
              dstate, CHUNK: tl.constexpr, BLOCK: tl.constexpr, BLOCK_DSTATE: tl.constexpr,
              DOT_PRECISION: tl.constexpr, LOWER: tl.constexpr = False):
    """cb[b, c, g, m, k] = C_m·B_kᵀ (fp32) for one (BLOCK x BLOCK) tile of one chunk; with LOWER (switch
    cb_lower_triangle) the programs cover the tiles on or below the diagonal only, the others left unwritten."""
    # flat grid (axis 0 has no 65535 limit): tile fastest, then group, chunk, batch
    tiles: tl.constexpr = CHUNK // BLOCK  # a constexpr: LOWER's static_range ends at it
    pid = tl.program_id(0)
    if LOWER:
        pairs = tiles * (tiles + 1) // 2
        t = pid % pairs
        ti = 0
        for r in tl.static_range(1, tiles):  # the row of pair t: t = ti(ti + 1)/2 + tj, 0 <= tj <= ti
            ti = tl.where(t >= r * (r + 1) // 2, r, ti)
        tj = t - ti * (ti + 1) // 2
        g = ((pid // pairs) % ngroups).to(tl.int64)
        bc = pid // (pairs * ngroups)
    else:
        t = pid % (tiles * tiles)
        ti = t // tiles
        tj = t % tiles
        g = ((pid // (tiles * tiles)) % ngroups).to(tl.int64)
        bc = pid // (tiles * tiles * ngroups)
    c = bc % nchunks
    b = (bc // nchunks).to(tl.int64)
    offs_m = ti * BLOCK + tl.arange(0, BLOCK)
    offs_k = tj * BLOCK + tl.arange(0, BLOCK)
    offs_n = tl.arange(0, BLOCK_DSTATE)
    start64 = (c * CHUNK).to(tl.int64)
    chunk_len = tl.minimum(CHUNK, seqlen - c * CHUNK)
    Cm = tl.load(C_ptr + b * s_C_b + start64 * s_C_l + g * s_C_g + offs_m[:, None] * s_C_l + offs_n[None, :] * s_C_n,
                 mask=(offs_m < chunk_len)[:, None] & (offs_n < dstate)[None, :], other=0.0)
    Bt = tl.load(B_ptr + b * s_B_b + start64 * s_B_l + g * s_B_g + offs_n[:, None] * s_B_n + offs_k[None, :] * s_B_l,
                 mask=(offs_n < dstate)[:, None] & (offs_k < chunk_len)[None, :], other=0.0)
    cb = tl.dot(Cm, Bt, input_precision=DOT_PRECISION)
    cb_base = cb_ptr + b * s_cb_b + c.to(tl.int64) * s_cb_c + g * s_cb_g
    tl.store(cb_base + offs_m[:, None] * s_cb_m + offs_k[None, :] * s_cb_k, cb)


@triton.jit
def _per_source(dA_base, dt_base, offs_k, mask_k, s_dA_l, s_dt_l, EXP2: tl.constexpr, EXP_FOLD: tl.constexpr = False):
    """dA_cumsum (in the exp's base) and dt at the source positions offs_k. EXP_FOLD (switch exp_fold): dt_base
    points at q = dA_cumsum − log(dt) in the exp's base (`fold_kernel`), returned in dA_cumsum's place (dt = 0 gave
    +inf, whose exp is 0), and the second value is that same q, read by no one."""
    if EXP_FOLD:
        q_k = tl.load(dt_base + offs_k * s_dt_l, mask=mask_k, other=0.0)
        return q_k, q_k
    dA_k = tl.load(dA_base + offs_k * s_dA_l, mask=mask_k, other=0.0).to(tl.float32)
    if EXP2:
        dA_k = dA_k * 1.4426950408889634
    dt_k = tl.load(dt_base + offs_k * s_dt_l, mask=mask_k, other=0.0).to(tl.float32)
    return dA_k, dt_k


@triton.jit
def fold_kernel(dt_ptr, dA_ptr, q_ptr, n, EXP2: tl.constexpr, BLOCK: tl.constexpr):
    """Switch exp_fold: q = dA_cumsum − log(dt) in the exp's base (dA_cumsum·log2(e) − log2(dt) with EXP2) over n
    contiguous fp32 elements of stage 1's (batch, nheads, nchunks, chunk) outputs; dt = 0 gives q = +inf."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    dt = tl.load(dt_ptr + offs, mask=mask, other=1.0)
    dA = tl.load(dA_ptr + offs, mask=mask, other=0.0)
    if EXP2:
        q = dA * 1.4426950408889634 - tl.log2(dt)
    else:
        q = dA - tl.log(dt)
    tl.store(q_ptr + offs, q, mask=mask)


@triton.jit
def _cb_tile(cb_base, B_base, B_desc, CmT, b, g, row0, offs_m, offs_k, offs_n, mask_m, mask_k, mask_n, s_cb_m, s_cb_k,
             s_B_l, s_B_n, dtype, BLOCK_K: tl.constexpr, BLOCK_DSTATE: tl.constexpr, SWAP: tl.constexpr,
             SHARED_CB: tl.constexpr, DOT_PRECISION: tl.constexpr, TMA: tl.constexpr, CB_LOWER: tl.constexpr = False):
    """C·Bᵀ for (rows offs_m, sources offs_k) in fp32: (rows, k), or (k, rows) with SWAP (CmT is then Cᵀ). With TMA
    the B tile (positions row0 .. row0 + BLOCK_K of group g, batch b) comes through B_desc. CB_LOWER (switch
    cb_lower_triangle): the shared C·Bᵀ holds only its tiles on or below the diagonal, so only the causal
    elements (source <= row, written there) are loaded, the rest read as 0 (masked by causality anyway)."""
    if SHARED_CB:
        if CB_LOWER:
            if SWAP:
                cb = tl.load(cb_base + offs_k[:, None] * s_cb_k + offs_m[None, :] * s_cb_m,
                             mask=mask_k[:, None] & mask_m[None, :] & (offs_k[:, None] <= offs_m[None, :]),
                             other=0.0)
            else:
                cb = tl.load(cb_base + offs_m[:, None] * s_cb_m + offs_k[None, :] * s_cb_k,
                             mask=mask_m[:, None] & mask_k[None, :] & (offs_k[None, :] <= offs_m[:, None]),
                             other=0.0)
        elif SWAP:
            cb = tl.load(cb_base + offs_k[:, None] * s_cb_k + offs_m[None, :] * s_cb_m,
                         mask=mask_k[:, None] & mask_m[None, :], other=0.0)
        else:
            cb = tl.load(cb_base + offs_m[:, None] * s_cb_m + offs_k[None, :] * s_cb_k,
                         mask=mask_m[:, None] & mask_k[None, :], other=0.0)
    elif TMA:
        Bk = B_desc.load([b, row0, g, 0]).reshape(BLOCK_K, BLOCK_DSTATE).to(dtype)  # (k, dstate)
        if SWAP:
            cb = tl.dot(Bk, CmT, input_precision=DOT_PRECISION)
        else:
            cb = tl.dot(CmT, tl.trans(Bk), input_precision=DOT_PRECISION)
    elif SWAP:
        Bk = tl.load(B_base + offs_k[:, None] * s_B_l + offs_n[None, :] * s_B_n,
                     mask=mask_k[:, None] & mask_n[None, :], other=0.0).to(dtype)  # (k, dstate)
        cb = tl.dot(Bk, CmT, input_precision=DOT_PRECISION)
    else:
        Bt = tl.load(B_base + offs_n[:, None] * s_B_n + offs_k[None, :] * s_B_l,
                     mask=mask_n[:, None] & mask_k[None, :], other=0.0).to(dtype)  # (dstate, k)
        cb = tl.dot(CmT, Bt, input_precision=DOT_PRECISION)
    return cb


@triton.jit
def _scores_x(x_base, x_desc, scores, acc, b, h, row0, p0, offs_k, offs_p, mask_k, mask_p, s_x_l, s_x_p, dtype,
              BLOCK_K: tl.constexpr, BLOCK_P: tl.constexpr, SWAP: tl.constexpr, DOT_PRECISION: tl.constexpr,
              TMA: tl.constexpr):
    """acc + scores·x_k (rows, headdim), or + x_kᵀ·scores (headdim, rows) with SWAP; scores cast to x's dtype."""
    if TMA:
        xk = x_desc.load([b, row0, h, p0]).reshape(BLOCK_K, BLOCK_P).to(dtype)  # (k, headdim)
        if SWAP:
            acc = tl.dot(tl.trans(xk), scores.to(dtype), acc, input_precision=DOT_PRECISION)
        else:
            acc = tl.dot(scores.to(dtype), xk, acc, input_precision=DOT_PRECISION)
    elif SWAP:
        xt = tl.load(x_base + offs_p[:, None] * s_x_p + offs_k[None, :] * s_x_l,
                     mask=mask_p[:, None] & mask_k[None, :], other=0.0).to(dtype)  # (headdim, k)
        acc = tl.dot(xt, scores.to(dtype), acc, input_precision=DOT_PRECISION)
    else:
        xk = tl.load(x_base + offs_k[:, None] * s_x_l + offs_p[None, :] * s_x_p,
                     mask=mask_k[:, None] & mask_p[None, :], other=0.0).to(dtype)  # (k, headdim)
        acc = tl.dot(scores.to(dtype), xk, acc, input_precision=DOT_PRECISION)
    return acc


@triton.jit
def c_rows(C_base, C_desc, b, g, row0, offs_m, offs_n, mask_m, mask_n, s_C_l, s_C_n, dtype, BLOCK_M: tl.constexpr,
           BLOCK_DSTATE: tl.constexpr, SWAP: tl.constexpr, TMA: tl.constexpr):
    """The row tile of C as an MMA operand: (dstate, rows) with SWAP, else (rows, dstate)."""
    if TMA:
        Cm = C_desc.load([b, row0, g, 0]).reshape(BLOCK_M, BLOCK_DSTATE).to(dtype)
        if SWAP:
            Cm = tl.trans(Cm)
    elif SWAP:
        Cm = tl.load(C_base + offs_n[:, None] * s_C_n + offs_m[None, :] * s_C_l,
                     mask=mask_n[:, None] & mask_m[None, :], other=0.0).to(dtype)
    else:
        Cm = tl.load(C_base + offs_m[:, None] * s_C_l + offs_n[None, :] * s_C_n,
                     mask=mask_m[:, None] & mask_n[None, :], other=0.0).to(dtype)
    return Cm


@triton.jit
def row_terms(dA_base, seq_base, c, offs_m, mask_m, s_dA_l, s_seq_l, EXP2: tl.constexpr, HAS_SEQ: tl.constexpr,
              EXP2_FTZ: tl.constexpr = True):
    """Per row: dA_cumsum in the exp's base, the entering state's scale exp(dA) (zero for rows whose sequence
    started inside the chunk), and the rows' sequence ids (offs_m without seq_idx: never read)."""
    dA_m = tl.load(dA_base + offs_m * s_dA_l, mask=mask_m, other=0.0).to(tl.float32)
    if EXP2:
        dA_m = dA_m * 1.4426950408889634
    state_scale = _decay(dA_m, EXP2, EXP2_FTZ)
    seq_m = offs_m
    if HAS_SEQ:
        seq_m = tl.load(seq_base + offs_m * s_seq_l, mask=mask_m, other=0)
        # the entering state belongs to the sequence active just before the chunk (sequence 0 before chunk 0)
        seq_before = tl.load(seq_base - s_seq_l, mask=c > 0, other=0)
        state_scale = tl.where(seq_m == seq_before, state_scale, 0.0)
    return dA_m, state_scale, seq_m


@triton.jit
def state_scale_at_ref(dA_base, seq_base, c, m0, chunk_len, seq_m, s_dA_l, s_seq_l, EXP2: tl.constexpr,
                       HAS_SEQ: tl.constexpr, EXP2_FTZ: tl.constexpr, BLOCK_M: tl.constexpr):
    """Switch decay_single: the entering state's scale exp(dA_ref) per row (dA_ref at the row tile's first row; zero
    for rows whose sequence started inside the chunk), the row factor exp(dA_m − dA_ref) coming after the factored
    tiles (`intra_chunk`)."""
    scale = _decay(_row_ref(dA_base, m0, chunk_len, s_dA_l, EXP2), EXP2, EXP2_FTZ) + tl.zeros([BLOCK_M], tl.float32)
    if HAS_SEQ:
        seq_before = tl.load(seq_base - s_seq_l, mask=c > 0, other=0)
        scale = tl.where(seq_m == seq_before, scale, 0.0)
    return scale


@triton.jit
def state_term(st_base, st_desc, CmT, state_scale, b, c, h, p0, offs_n, offs_p, mask_n, mask_p, s_st_p, s_st_n,
               dtype, BLOCK_P: tl.constexpr, BLOCK_DSTATE: tl.constexpr, SWAP: tl.constexpr,
               DOT_PRECISION: tl.constexpr, TMA: tl.constexpr, ST_N_CONTIG: tl.constexpr, CACHE: tl.constexpr):
    """exp(dA_m)·C_m·S_cᵀ: (rows, headdim), or (headdim, rows) with SWAP. With TMA the state tile comes through
    st_desc (in the states' memory order, ST_N_CONTIG: dstate contiguous); CACHE is the pointer loads' modifier."""
    if TMA:
        if ST_N_CONTIG:
            S = st_desc.load([b, c, h, p0, 0]).reshape(BLOCK_P, BLOCK_DSTATE).to(dtype)  # (headdim, dstate)
        else:
            S = tl.trans(st_desc.load([b, c, h, 0, p0]).reshape(BLOCK_DSTATE, BLOCK_P).to(dtype))
        if SWAP:
            out = tl.dot(S, CmT, input_precision=DOT_PRECISION) * state_scale[None, :]
        else:
            out = tl.dot(CmT, tl.trans(S), input_precision=DOT_PRECISION) * state_scale[:, None]
    elif SWAP:
        S = tl.load(st_base + offs_p[:, None] * s_st_p + offs_n[None, :] * s_st_n,
                    mask=mask_p[:, None] & mask_n[None, :], other=0.0, cache_modifier=CACHE).to(dtype)
        out = tl.dot(S, CmT, input_precision=DOT_PRECISION) * state_scale[None, :]  # (headdim, rows)
    else:
        St = tl.load(st_base + offs_n[:, None] * s_st_n + offs_p[None, :] * s_st_p,
                     mask=mask_n[:, None] & mask_p[None, :], other=0.0, cache_modifier=CACHE).to(dtype)
        out = tl.dot(CmT, St, input_precision=DOT_PRECISION) * state_scale[:, None]  # (rows, headdim)
    return out


@triton.jit
def _masked_step(cb, acc, dA_base, dt_base, x_base, x_desc, dA_m, seq_m, seq_k, b, h, row0, p0, offs_m, offs_k,
                 offs_p, mask_k, mask_p, s_dA_l, s_dt_l, s_x_l, s_x_p, dtype, BLOCK_K: tl.constexpr,
                 BLOCK_P: tl.constexpr, HAS_SEQ: tl.constexpr, SWAP: tl.constexpr, EXP2: tl.constexpr,
                 DOT_PRECISION: tl.constexpr, TMA: tl.constexpr, EXP2_FTZ: tl.constexpr = True,
                 EXP_FOLD: tl.constexpr = False):
    """acc + one head's term of a source tile reaching the diagonal: C·Bᵀ (cb) masked causally (and by sequence),
    times exp(dA_m − dA_k)·dt_k (EXP_FOLD: exp(dA_m − q_k), `_per_source`), then the MMA with x_k."""
    dA_k, dt_k = _per_source(dA_base, dt_base, offs_k, mask_k, s_dA_l, s_dt_l, EXP2, EXP_FOLD)
    if SWAP:
        keep = (offs_k[:, None] <= offs_m[None, :]) & mask_k[:, None]
        if HAS_SEQ:
            keep = keep & (seq_k[:, None] == seq_m[None, :])
        # mask the exponent, not the exp: above the diagonal it is positive and may overflow
        decay = _decay(tl.where(keep, dA_m[None, :] - dA_k[:, None], float("-inf")), EXP2, EXP2_FTZ)
        if EXP_FOLD:
            scores = cb * decay
        else:
            scores = cb * decay * dt_k[:, None]
    else:
        keep = (offs_m[:, None] >= offs_k[None, :]) & mask_k[None, :]
        if HAS_SEQ:
            keep = keep & (seq_m[:, None] == seq_k[None, :])
        decay = _decay(tl.where(keep, dA_m[:, None] - dA_k[None, :], float("-inf")), EXP2, EXP2_FTZ)
        if EXP_FOLD:
            scores = cb * decay
        else:
            scores = cb * decay * dt_k[None, :]
    return _scores_x(x_base, x_desc, scores, acc, b, h, row0, p0, offs_k, offs_p, mask_k, mask_p, s_x_l, s_x_p,
                     dtype, BLOCK_K, BLOCK_P, SWAP, DOT_PRECISION, TMA)


@triton.jit
def _factored_step(cb, off, dA_ref, dA_base, dt_base, x_base, x_desc, seq_m, seq_k, b, h, row0, p0, offs_k, offs_p,
                   mask_k, mask_p, s_dA_l, s_dt_l, s_x_l, s_x_p, dtype, BLOCK_K: tl.constexpr, BLOCK_P: tl.constexpr,
                   HAS_SEQ: tl.constexpr, SWAP: tl.constexpr, EXP2: tl.constexpr, DOT_PRECISION: tl.constexpr,
                   TMA: tl.constexpr, EXP2_FTZ: tl.constexpr = True, EXP_FOLD: tl.constexpr = False):
    """off + one head's term of a source tile wholly before the row tile, with the factored decay: C·Bᵀ (cb) times
    exp(dA_ref − dA_k)·dt_k (EXP_FOLD: exp(dA_ref − q_k)) per source column (no causal mask), then the MMA with x_k."""
    dA_k, dt_k = _per_source(dA_base, dt_base, offs_k, mask_k, s_dA_l, s_dt_l, EXP2, EXP_FOLD)
    w = _decay(dA_ref - dA_k, EXP2, EXP2_FTZ)
    if not EXP_FOLD:
        w = w * dt_k
    if SWAP:
        scores = cb * w[:, None]
    else:
        scores = cb * w[None, :]
    if HAS_SEQ:
        if SWAP:
            scores = tl.where(seq_k[:, None] == seq_m[None, :], scores, 0.0)
        else:
            scores = tl.where(seq_m[:, None] == seq_k[None, :], scores, 0.0)
    return _scores_x(x_base, x_desc, scores, off, b, h, row0, p0, offs_k, offs_p, mask_k, mask_p, s_x_l, s_x_p,
                     dtype, BLOCK_K, BLOCK_P, SWAP, DOT_PRECISION, TMA)


@triton.jit
def _row_ref(dA_base, m0, chunk_len, s_dA_l, EXP2: tl.constexpr):
    """dA_cumsum at the row tile's first row, in the exp's base (the factored decay's reference point)."""
    dA_ref = tl.load(dA_base + m0 * s_dA_l, mask=m0 < chunk_len, other=0.0).to(tl.float32)
    if EXP2:
        dA_ref = dA_ref * 1.4426950408889634
    return dA_ref


@triton.jit
def _scale_rows(acc, off, row_scale, SWAP: tl.constexpr):
    if SWAP:
        return acc + off * row_scale[None, :]
    else:
        return acc + off * row_scale[:, None]


@triton.jit
def _rows_scaled(acc, row_scale, SWAP: tl.constexpr):
    if SWAP:
        return acc * row_scale[None, :]
    else:
        return acc * row_scale[:, None]


@triton.jit
def intra_chunk(acc, acc1, B_base, x_base, x_base1, cb_base, dA_base, dA_base1, dt_base, dt_base1, seq_base, B_desc,
                x_desc, CmT, dA_m, dA_m1, seq_m, b, g, h, start, m0, p0, chunk_len, offs_m, offs_n, offs_p, mask_m,
                mask_n, mask_p, s_B_l, s_B_n, s_x_l, s_x_p, s_dA_l, s_dt_l, s_seq_l, s_cb_m, s_cb_k, dtype,
                BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_DSTATE: tl.constexpr,
                HAS_SEQ: tl.constexpr, SWAP: tl.constexpr, EXP2: tl.constexpr, DOT_PRECISION: tl.constexpr,
                SHARED_CB: tl.constexpr, DECAY_FACTOR: tl.constexpr, TMA: tl.constexpr, HB: tl.constexpr,
                EXP2_FTZ: tl.constexpr = True, CB_LOWER: tl.constexpr = False, EXP_FOLD: tl.constexpr = False,
                DECAY_SINGLE: tl.constexpr = False):
    """(acc, acc1) + the chunk's own tokens' term for the row tile starting at m0, up to its causal edge: for head h
    into acc, and with HB = 2 for head h + 1 (same group) into acc1 (its x_base1, dA_base1, dt_base1, dA_m1),
    C·Bᵀ computed once per source tile for both. With HB = 1 acc1 is returned as given. DECAY_SINGLE (switch
    decay_single, with DECAY_FACTOR): acc and acc1 come scaled by exp(dA_ref) per row instead of exp(dA_m)
    (`row_terms`), the factored tiles are summed onto them and the sum scaled by exp(dA_m − dA_ref)."""
    k_end = tl.minimum(chunk_len, m0 + BLOCK_M)
    k_masked = 0
    if DECAY_FACTOR:
        # source tiles wholly before the row tile: exp(dA_m - dA_k) = exp(dA_m - dA_ref)·exp(dA_ref - dA_k) with
        # dA_ref at the tile's first row (impls/README.md, factored decay): no mask, no exp per (row, source)
        k_masked = (m0 // BLOCK_K) * BLOCK_K
        dA_ref = _row_ref(dA_base, m0, chunk_len, s_dA_l, EXP2)
        dA_ref1 = _row_ref(dA_base1, m0, chunk_len, s_dA_l, EXP2)
        if DECAY_SINGLE:  # one accumulator: the factored tiles onto the state term, relative to dA_ref
            off = acc
            off1 = acc1
        else:
            off = tl.zeros(acc.shape, dtype=tl.float32)
            off1 = tl.zeros(acc1.shape, dtype=tl.float32)
        for k0 in tl.range(0, k_masked, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            mask_k = offs_k < chunk_len
            seq_k = offs_k
            if HAS_SEQ:
                seq_k = tl.load(seq_base + offs_k * s_seq_l, mask=mask_k, other=0)
            cb = _cb_tile(cb_base, B_base, B_desc, CmT, b, g, start + k0, offs_m, offs_k, offs_n, mask_m, mask_k,
                          mask_n, s_cb_m, s_cb_k, s_B_l, s_B_n, dtype, BLOCK_K, BLOCK_DSTATE, SWAP, SHARED_CB,
                          DOT_PRECISION, TMA, CB_LOWER)
            off = _factored_step(cb, off, dA_ref, dA_base, dt_base, x_base, x_desc, seq_m, seq_k, b, h, start + k0,
                                 p0, offs_k, offs_p, mask_k, mask_p, s_dA_l, s_dt_l, s_x_l, s_x_p, dtype, BLOCK_K,
                                 BLOCK_P, HAS_SEQ, SWAP, EXP2, DOT_PRECISION, TMA, EXP2_FTZ, EXP_FOLD)
            if HB == 2:
                off1 = _factored_step(cb, off1, dA_ref1, dA_base1, dt_base1, x_base1, x_desc, seq_m, seq_k, b, h + 1,
                                      start + k0, p0, offs_k, offs_p, mask_k, mask_p, s_dA_l, s_dt_l, s_x_l, s_x_p,
                                      dtype, BLOCK_K, BLOCK_P, HAS_SEQ, SWAP, EXP2, DOT_PRECISION, TMA, EXP2_FTZ,
                                      EXP_FOLD)
        if DECAY_SINGLE:
            acc = _rows_scaled(off, _decay(dA_m - dA_ref, EXP2, EXP2_FTZ), SWAP)
            if HB == 2:
                acc1 = _rows_scaled(off1, _decay(dA_m1 - dA_ref1, EXP2, EXP2_FTZ), SWAP)
        else:
            acc = _scale_rows(acc, off, _decay(dA_m - dA_ref, EXP2, EXP2_FTZ), SWAP)
            if HB == 2:
                acc1 = _scale_rows(acc1, off1, _decay(dA_m1 - dA_ref1, EXP2, EXP2_FTZ), SWAP)
    for k0 in tl.range(k_masked, k_end, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < chunk_len
        seq_k = offs_k
        if HAS_SEQ:
            seq_k = tl.load(seq_base + offs_k * s_seq_l, mask=mask_k, other=0)
        cb = _cb_tile(cb_base, B_base, B_desc, CmT, b, g, start + k0, offs_m, offs_k, offs_n, mask_m, mask_k,
                      mask_n, s_cb_m, s_cb_k, s_B_l, s_B_n, dtype, BLOCK_K, BLOCK_DSTATE, SWAP, SHARED_CB,
                      DOT_PRECISION, TMA, CB_LOWER)
        acc = _masked_step(cb, acc, dA_base, dt_base, x_base, x_desc, dA_m, seq_m, seq_k, b, h, start + k0, p0,
                           offs_m, offs_k, offs_p, mask_k, mask_p, s_dA_l, s_dt_l, s_x_l, s_x_p, dtype, BLOCK_K,
                           BLOCK_P, HAS_SEQ, SWAP, EXP2, DOT_PRECISION, TMA, EXP2_FTZ, EXP_FOLD)
        if HB == 2:
            acc1 = _masked_step(cb, acc1, dA_base1, dt_base1, x_base1, x_desc, dA_m1, seq_m, seq_k, b, h + 1,
                                start + k0, p0, offs_m, offs_k, offs_p, mask_k, mask_p, s_dA_l, s_dt_l, s_x_l, s_x_p,
                                dtype, BLOCK_K, BLOCK_P, HAS_SEQ, SWAP, EXP2, DOT_PRECISION, TMA, EXP2_FTZ, EXP_FOLD)
    return acc, acc1


@triton.jit
def epilogue(acc, x_base, z_base, y_base, y_desc, D_ptr, b, h, row0, p0, offs_m, offs_p, mask_m, mask_p,
             s_x_l, s_x_p, s_z_l, s_z_p, s_y_l, s_y_p, s_D_h, s_D_p, BLOCK_M: tl.constexpr, BLOCK_P: tl.constexpr,
             HAS_D: tl.constexpr, HAS_Z: tl.constexpr, SWAP: tl.constexpr, EXP2: tl.constexpr, TMA: tl.constexpr,
             EXP2_FTZ: tl.constexpr = True):
    """D skip, z gate and the store of y, in the accumulator's orientation; with TMA the store goes through y_desc."""
    if SWAP:
        offs_row = offs_p[:, None] * s_x_p + offs_m[None, :] * s_x_l
        mask_tile = mask_p[:, None] & mask_m[None, :]
        z_offs = offs_p[:, None] * s_z_p + offs_m[None, :] * s_z_l
        y_offs = offs_p[:, None] * s_y_p + offs_m[None, :] * s_y_l
    else:
        offs_row = offs_m[:, None] * s_x_l + offs_p[None, :] * s_x_p
        mask_tile = mask_m[:, None] & mask_p[None, :]
        z_offs = offs_m[:, None] * s_z_l + offs_p[None, :] * s_z_p
        y_offs = offs_m[:, None] * s_y_l + offs_p[None, :] * s_y_p
    if HAS_D:
        D = tl.load(D_ptr + h.to(tl.int64) * s_D_h + offs_p * s_D_p, mask=mask_p, other=0.0).to(tl.float32)
        x_tile = tl.load(x_base + offs_row, mask=mask_tile, other=0.0).to(tl.float32)
        if SWAP:
            acc += x_tile * D[:, None]
        else:
            acc += x_tile * D[None, :]
    if HAS_Z:
        zt = tl.load(z_base + z_offs, mask=mask_tile, other=0.0).to(tl.float32)
        if EXP2:
            acc = acc * zt / (1.0 + ex2(-zt * 1.4426950408889634, EXP2_FTZ))
        else:
            acc = acc * zt / (1.0 + tl.exp(-zt))
    out = acc.to(y_base.dtype.element_ty)
    if TMA:
        if SWAP:
            out = tl.trans(out)
        y_desc.store([b, row0, h, p0], out.reshape(1, BLOCK_M, 1, BLOCK_P))
    else:
        tl.store(y_base + y_offs, out, mask=mask_tile)


@triton.jit
def tile_coords(m0, p0, c, seqlen, headdim, dstate, CHUNK: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_P: tl.constexpr, BLOCK_DSTATE: tl.constexpr):
    """A program's offsets and masks inside chunk c: headdim columns from p0, chunk rows from m0, all of dstate;
    also the chunk's first position and its length (the last chunk may be short)."""
    offs_p = p0 + tl.arange(0, BLOCK_P)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_DSTATE)
    start = c * CHUNK
    chunk_len = tl.minimum(CHUNK, seqlen - start)
    return offs_p, offs_m, offs_n, start, chunk_len, offs_p < headdim, offs_m < chunk_len, offs_n < dstate


@triton.jit
def program_bases(C_ptr, B_ptr, x_ptr, dt_ptr, dA_ptr, st_ptr, cb_ptr, seq_ptr, z_ptr, y_ptr, b, start, g, h, c,
                  s_C, s_B, s_x, s_dt, s_dA, s_st, s_cb, s_seq, s_z, s_y):
    """The program's operands at (batch b (64-bit), chunk c from position start, group g, head h): C, B, x, seq,
    z, y at the chunk's first position, dt and dA at the chunk, the states at (b, c, h), C·Bᵀ at (b, c, g) (a
    kernel that reads none passes a stand-in; the unused pointer compiles to nothing). Each s_* is that tensor's
    strides in its dimension order (`STRIDE_RANKS`). The offsets are 64-bit: batch·stride, position·stride and
    chunk·stride pass 2^31 at a million tokens."""
    start64 = start.to(tl.int64)
    C_base = C_ptr + b * s_C[0] + start64 * s_C[1] + g.to(tl.int64) * s_C[2]
    B_base = B_ptr + b * s_B[0] + start64 * s_B[1] + g.to(tl.int64) * s_B[2]
    x_base = x_ptr + b * s_x[0] + start64 * s_x[1] + h.to(tl.int64) * s_x[2]
    dt_base = dt_ptr + b * s_dt[0] + h.to(tl.int64) * s_dt[1] + c.to(tl.int64) * s_dt[2]
    dA_base = dA_ptr + b * s_dA[0] + h.to(tl.int64) * s_dA[1] + c.to(tl.int64) * s_dA[2]
    st_base = st_ptr + b * s_st[0] + c.to(tl.int64) * s_st[1] + h.to(tl.int64) * s_st[2]
    cb_base = cb_ptr + b * s_cb[0] + c.to(tl.int64) * s_cb[1] + g.to(tl.int64) * s_cb[2]
    seq_base = seq_ptr + b * s_seq[0] + start64 * s_seq[1]
    z_base = z_ptr + b * s_z[0] + start64 * s_z[1] + h.to(tl.int64) * s_z[2]
    y_base = y_ptr + b * s_y[0] + start64 * s_y[1] + h.to(tl.int64) * s_y[2]
    return C_base, B_base, x_base, dt_base, dA_base, st_base, cb_base, seq_base, z_base, y_base


@triton.jit
def heads_first_pid(pid, tiles, head_blocks):
    """The program id in the default order (`program_coords`: tile fastest, then head block) of the program
    `pid` of the heads-first order (head block fastest, then tile; chunk and batch slowest in both)."""
    hb = pid % head_blocks
    tile = (pid // head_blocks) % tiles
    return (pid - pid % (tiles * head_blocks)) + hb * tiles + tile


def operand_args(x, dt, D, z, seq_idx):
    """The kernels' optional operands and the strides they are read with: (D, z, seq) arguments (stand-ins never
    read when absent) and D's (head, headdim) strides (a per-head D is read with a zero headdim stride)."""
    if D is not None:
        D_strides = (D.stride(0), D.stride(1) if D.dim() == 2 else 0)
    else:
        D_strides = (0, 0)
    D_arg = D if D is not None else dt  # never read without HAS_D
    z_arg = z if z is not None else x  # never read without HAS_Z
    seq = seq_idx if seq_idx is not None else dt  # never read without HAS_SEQ
    return D_arg, z_arg, seq, D_strides


# compute_out_kernel's stride arguments: one tuple per tensor, its strides in its dimension order, and their count
# (what an ahead-of-time signature declares for each, instruments/triton/aot.py): C, B (batch, position, group, dstate);
# x, z, y (batch, position, head, headdim); dt, dA (batch, head, chunk, position); the states (batch, chunk, head,
# headdim, dstate); D (head, headdim); seq_idx (batch, position); C·Bᵀ (batch, chunk, group, row, source)
STRIDE_RANKS = {"s_C": 4, "s_B": 4, "s_x": 4, "s_dt": 4, "s_dA": 4, "s_st": 5, "s_D": 2, "s_z": 4, "s_seq": 2,
                "s_y": 4, "s_cb": 5}


@triton.jit
def compute_out_kernel(
    C_ptr, B_ptr, x_ptr, dt_ptr, dA_ptr, st_ptr, D_ptr, z_ptr, seq_ptr, cb_ptr, y_ptr,
    C_hd, B_hd, x_hd, y_hd, st_hd,
    batch, seqlen, nheads, nchunks, headdim, dstate, ngroups, heads_per_group,
    s_C, s_B, s_x, s_dt, s_dA, s_st, s_D, s_z, s_seq, s_y, s_cb,
    CHUNK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_P: tl.constexpr,
    BLOCK_DSTATE: tl.constexpr,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_SEQ: tl.constexpr,
    SWAP: tl.constexpr, EXP2: tl.constexpr, DOT_PRECISION: tl.constexpr, SHARED_CB: tl.constexpr,
    DECAY_FACTOR: tl.constexpr, TMA: tl.constexpr, ST_N_CONTIG: tl.constexpr, HB: tl.constexpr,
    HEADS_FIRST: tl.constexpr,
    HOST_DESC: tl.constexpr,
    EXP2_FTZ: tl.constexpr = True,
    CB_LOWER: tl.constexpr = False,
    EXP_FOLD: tl.constexpr = False,
    DECAY_SINGLE: tl.constexpr = False,
):
    # flat grid (axis 0 has no 65535 limit): headdim tile fastest, then row tile, head block (HB heads of one
    # group: h and, with HB = 2, h + 1), chunk, batch; HEADS_FIRST (switch heads_first): the head block fastest.
    # The strides come as one tuple per tensor (STRIDE_RANKS)
    pid = tl.program_id(0)
    tiles_p = tl.cdiv(headdim, BLOCK_P)
    tiles = tiles_p * (CHUNK // BLOCK_M)
    if HEADS_FIRST:
        pid = heads_first_pid(pid, tiles, nheads // HB)
    tile, h, c, b32, b = program_coords(pid, tiles, nheads, nchunks, HB)
    g = h // heads_per_group
    m0 = (tile // tiles_p) * BLOCK_M
    p0 = (tile % tiles_p) * BLOCK_P
    offs_p, offs_m, offs_n, start, chunk_len, mask_p, mask_m, mask_n = tile_coords(
        m0, p0, c, seqlen, headdim, dstate, CHUNK, BLOCK_M, BLOCK_P, BLOCK_DSTATE)
    # 64-bit base offsets: batch·stride, position·stride and chunk·stride pass 2^31 at a million tokens
    C_base, B_base, x_base, dt_base, dA_base, st_base, cb_base, seq_base, z_base, y_base = program_bases(
        C_ptr, B_ptr, x_ptr, dt_ptr, dA_ptr, st_ptr, cb_ptr, seq_ptr, z_ptr, y_ptr, b, start, g, h, c,
        s_C, s_B, s_x, s_dt, s_dA, s_st, s_cb, s_seq, s_z, s_y)
    dtype = x_ptr.dtype.element_ty
    if HOST_DESC:  # made once on the host (tma_descriptors='host'), same boxes as below
        C_desc = C_hd
        B_desc = B_hd
        x_desc = x_hd
        y_desc = y_hd
        st_desc = st_hd
    elif TMA:
        C_desc = rows_desc(C_ptr, batch, seqlen, ngroups, dstate, s_C[0], s_C[1], s_C[2], BLOCK_M, BLOCK_DSTATE)
        B_desc = rows_desc(B_ptr, batch, seqlen, ngroups, dstate, s_B[0], s_B[1], s_B[2], BLOCK_K, BLOCK_DSTATE)
        x_desc = rows_desc(x_ptr, batch, seqlen, nheads, headdim, s_x[0], s_x[1], s_x[2], BLOCK_K, BLOCK_P)
        y_desc = rows_desc(y_ptr, batch, seqlen, nheads, headdim, s_y[0], s_y[1], s_y[2], BLOCK_M, BLOCK_P)
        st_desc = states_desc(st_ptr, batch, nchunks, nheads, headdim, dstate, s_st[0], s_st[1], s_st[2], s_st[3],
                              s_st[4], BLOCK_P, BLOCK_DSTATE, ST_N_CONTIG)
    else:
        C_desc = None
        B_desc = None
        x_desc = None
        y_desc = None
        st_desc = None

    dA_m, state_scale, seq_m = row_terms(dA_base, seq_base, c, offs_m, mask_m, s_dA[3], s_seq[1], EXP2, HAS_SEQ,
                                         EXP2_FTZ)
    if DECAY_SINGLE:
        state_scale = state_scale_at_ref(dA_base, seq_base, c, m0, chunk_len, seq_m, s_dA[3], s_seq[1], EXP2, HAS_SEQ,
                                         EXP2_FTZ, BLOCK_M)
    CmT = c_rows(C_base, C_desc, b32, g, start + m0, offs_m, offs_n, mask_m, mask_n, s_C[1], s_C[3], dtype, BLOCK_M,
                 BLOCK_DSTATE, SWAP, TMA)
    # 1. the entering state's contribution; 2. the chunk's own tokens, up to the causal edge of this row tile
    acc = state_term(st_base, st_desc, CmT, state_scale, b32, c, h, p0, offs_n, offs_p, mask_n, mask_p, s_st[3],
                     s_st[4], dtype, BLOCK_P, BLOCK_DSTATE, SWAP, DOT_PRECISION, TMA, ST_N_CONTIG, "")
    if HB == 2:  # the second head of the tile: its own per-head operands; C, each B tile and C·Bᵀ are shared
        x_base1 = x_base + s_x[2]
        dt_base1 = dt_base + s_dt[1]
        dA_base1 = dA_base + s_dA[1]
        dA_m1, state_scale1, seq_m = row_terms(dA_base1, seq_base, c, offs_m, mask_m, s_dA[3], s_seq[1], EXP2,
                                               HAS_SEQ, EXP2_FTZ)
        if DECAY_SINGLE:
            state_scale1 = state_scale_at_ref(dA_base1, seq_base, c, m0, chunk_len, seq_m, s_dA[3], s_seq[1], EXP2,
                                              HAS_SEQ, EXP2_FTZ, BLOCK_M)
        acc1 = state_term(st_base + s_st[2], st_desc, CmT, state_scale1, b32, c, h + 1, p0, offs_n, offs_p, mask_n,
                          mask_p, s_st[3], s_st[4], dtype, BLOCK_P, BLOCK_DSTATE, SWAP, DOT_PRECISION, TMA,
                          ST_N_CONTIG, "")
    else:
        x_base1 = x_base
        dt_base1 = dt_base
        dA_base1 = dA_base
        dA_m1 = dA_m
        acc1 = acc
    acc, acc1 = intra_chunk(acc, acc1, B_base, x_base, x_base1, cb_base, dA_base, dA_base1, dt_base, dt_base1,
                            seq_base, B_desc, x_desc, CmT, dA_m, dA_m1, seq_m, b32, g, h, start, m0, p0, chunk_len,
                            offs_m, offs_n, offs_p, mask_m, mask_n, mask_p, s_B[1], s_B[3], s_x[1], s_x[3], s_dA[3],
                            s_dt[3], s_seq[1], s_cb[3], s_cb[4], dtype, BLOCK_M, BLOCK_K, BLOCK_P, BLOCK_DSTATE,
                            HAS_SEQ, SWAP, EXP2, DOT_PRECISION, SHARED_CB, DECAY_FACTOR, TMA, HB, EXP2_FTZ,
                            CB_LOWER, EXP_FOLD, DECAY_SINGLE)
    # 3. D skip, z gate, store
    epilogue(acc, x_base, z_base, y_base, y_desc, D_ptr, b32, h, start + m0, p0, offs_m, offs_p, mask_m, mask_p,
             s_x[1], s_x[3], s_z[1], s_z[3], s_y[1], s_y[3], s_D[0], s_D[1], BLOCK_M, BLOCK_P, HAS_D, HAS_Z, SWAP,
             EXP2, TMA, EXP2_FTZ)
    if HB == 2:
        epilogue(acc1, x_base1, z_base + s_z[2], y_base + s_y[2], y_desc, D_ptr, b32, h + 1, start + m0, p0, offs_m,
                 offs_p, mask_m, mask_p, s_x[1], s_x[3], s_z[1], s_z[3], s_y[1], s_y[3], s_D[0], s_D[1], BLOCK_M,
                 BLOCK_P, HAS_D, HAS_Z, SWAP, EXP2, TMA, EXP2_FTZ)


def compute_out(C, B, x, dt, dA_cumsum, states, D, z, seq_idx, *, config, switches, empty, dot_precision):
    """-> y (batch, seqlen, nheads, headdim) in x's dtype, contiguous."""
    batch, seqlen, nheads, headdim = x.shape
    ngroups, dstate = B.shape[2], B.shape[3]
    nchunks, chunk = dt.shape[2], dt.shape[3]
    y = empty((batch, seqlen, nheads, headdim), x.dtype, x.device)
    block_dstate = max(16, next_pow2(dstate))
    D_arg, z_arg, seq, D_strides = operand_args(x, dt, D, z, seq_idx)
    block_m, block_k, block_p = config["block_rows"], config["block_positions"], config["block_headdim"]
    host = switches.tma and switches.tma_descriptors == "host"
    if host:
        st_box = (block_p, block_dstate) if states.stride(-1) == 1 else (block_dstate, block_p)
        hd = descriptors.host({"C": (C, (1, block_m, 1, block_dstate)), "B": (B, (1, block_k, 1, block_dstate)),
                               "x": (x, (1, block_k, 1, block_p)), "y": (y, (1, block_m, 1, block_p)),
                               "states": (descriptors.memory_order(states), (1, 1, 1, *st_box))},
                              switches.launch_path)
    elif switches.tma:
        descriptors.require({"C": C, "B": B, "x": x, "states": descriptors.memory_order(states), "y": y})
    if switches.exp_fold:  # the kernel reads q = dA_cumsum − log(dt) where it read dt (and no dA_cumsum per source)
        dt = folded_exponent(dt, dA_cumsum, switches.exp2, empty, switches.launch_path)
    shared = switches.cb_mode == "shared"
    # never read unless shared
    lower = shared and switches.cb_lower_triangle
    cb = cb_matrix(C, B, chunk, empty, dot_precision, switches.launch_path, lower) if shared else dt
    cb_strides = cb.stride() if shared else (0,) * 5
    hb = config.get("heads_per_tile", 1)
    if (nheads // ngroups) % hb:
        raise ValueError(f"switch heads_per_tile of backend 'triton': {hb} heads per program must divide the "
                         f"{nheads // ngroups} heads of a group")
    grid = (cdiv(headdim, block_p) * (chunk // block_m) * (nheads // hb) * nchunks * batch,)
    launcher.launch(
        compute_out_kernel, grid, C, B, x, dt, dA_cumsum, states, D_arg, z_arg, seq, cb, y,
        *((hd["C"], hd["B"], hd["x"], hd["y"], hd["states"]) if host else (None,) * 5),
        batch, seqlen, nheads, nchunks, headdim, dstate, ngroups, nheads // ngroups,
        C.stride(), B.stride(), x.stride(), dt.stride(), dA_cumsum.stride(), states.stride(), D_strides,
        z_arg.stride(), seq.stride()[:2], y.stride(), cb_strides,
        CHUNK=chunk, BLOCK_M=block_m, BLOCK_K=block_k, BLOCK_P=block_p, BLOCK_DSTATE=block_dstate,
        HAS_D=D is not None, HAS_Z=z is not None, HAS_SEQ=seq_idx is not None,
        SWAP=switches.operand_swap, EXP2=switches.exp2, DOT_PRECISION=dot_precision, SHARED_CB=shared,
        DECAY_FACTOR=switches.decay_factor, TMA=switches.tma, ST_N_CONTIG=states.stride(-1) == 1, HB=hb,
        HEADS_FIRST=switches.heads_first, HOST_DESC=host, EXP2_FTZ=switches.exp2_ftz, EXP_FOLD=switches.exp_fold,
        **({"CB_LOWER": True} if lower else {}), **({"DECAY_SINGLE": True} if switches.decay_single else {}),
        num_warps=config["num_warps"],
        num_stages=config["num_stages"], maxnreg=maxnreg(config), path=switches.launch_path,
    )
    return y


CB_BLOCK = 64  # cb_kernel's tile (or the whole chunk when shorter)


def cb_matrix(C, B, chunk, empty, dot_precision, launch_path, lower: bool = False):
    """C·Bᵀ of every chunk and group, (batch, nchunks, ngroups, chunk, chunk) fp32: every element written, or with
    `lower` (switch cb_lower_triangle) the CB_BLOCK tiles on or below the diagonal only (compute_out then loads the
    causal elements only, all inside them)."""
    batch, seqlen, ngroups, dstate = B.shape
    nchunks = cdiv(seqlen, chunk)
    cb = empty((batch, nchunks, ngroups, chunk, chunk), torch.float32, B.device)
    block = min(CB_BLOCK, chunk)
    tiles = chunk // block
    grid = ((tiles * (tiles + 1) // 2 if lower else tiles * tiles) * ngroups * nchunks * batch,)
    launcher.launch(cb_kernel, grid, C, B, cb, seqlen, nchunks, ngroups, *C.stride(), *B.stride(), *cb.stride(),
                    dstate, CHUNK=chunk, BLOCK=block, BLOCK_DSTATE=max(16, next_pow2(dstate)),
                    DOT_PRECISION=dot_precision, **({"LOWER": True} if lower else {}), num_warps=4, path=launch_path)
    return cb


FOLD_BLOCK = 1024  # fold_kernel's elements per program


def folded_exponent(dt, dA_cumsum, exp2, empty, launch_path):
    """Switch exp_fold: q = dA_cumsum − log(dt) in the exp's base (fold_kernel), (batch, nheads, nchunks, chunk)
    fp32 contiguous, read by compute_out_kernel in dt's place."""
    dt, dA_cumsum = dt.float().contiguous(), dA_cumsum.float().contiguous()
    q = empty(tuple(dt.shape), torch.float32, dt.device)
    n = dt.numel()
    launcher.launch(fold_kernel, (cdiv(n, FOLD_BLOCK),), dt, dA_cumsum, q, n, EXP2=exp2, BLOCK=FOLD_BLOCK,
                    num_warps=4, path=launch_path)
    return q
