"""Stage 2, Triton: each chunk's own state (one tiled MMA per chunk), then the states carried across chunks.

Two kernels (switch state_pass="chunk_parallel", the default):
- `chunk_state_kernel`: one program per (headdim tile, dstate tile, head, chunk, batch) accumulates
  sum_t exp(dA_cs[last] − dA_cs[t])·dt_t·x_t B_tᵀ over the chunk in steps of BLOCK_K positions with tl.dot,
  counting only the tokens of the sequence active at the chunk's last token. It writes an fp32 scratch tensor
  (so the carry below does not compound the rounding of a narrow state dtype).
- `state_passing_kernel`: one program per (block of state elements, head, batch) walks the chunks in order:
  S_0 = initial (or 0), S_{c+1} = exp(dA_cs[c, last])·[same sequence]·S_c + local_c, writing S_c (the state
  entering chunk c) in state_dtype and S_C (the final state) in fp32.

Switches: `transposed_layout` stores the scratch and the entering states (b, c, h, dstate, headdim) and returns
the logical (b, c, h, headdim, dstate) as a transposed view; `operand_swap` computes the chunk state as
Bᵀ·(dt-weighted x) (dstate on the MMA's M) instead of (dt-weighted x)ᵀ·B; `exp2` computes the decays with exp2;
`tma` reads x and B and writes the scratch through tensor descriptors (impls/triton/descriptors.py), made in the
kernel or, with `tma_descriptors='host'`, once on the host and passed in (x_hd, B_hd, out_hd; None otherwise).
The chunk sum itself is `local_state`, which the fused kernel (impls/triton/fused.py) calls too.
Switch `state_pass='serial'` replaces both by `serial_state_kernel`: one program per (headdim tile, dstate tile,
head, batch) walks the chunks, `local_state` per chunk in registers, no scratch (chunk_state's launch fields); with
`tma` x and B come through descriptors (in the kernel, or x_hd and B_hd from the host), the states go by pointer.
The kernels address every tensor through its strides, so any layout of the inputs (and of states) works.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from impls.triton import descriptors, launcher
from impls.triton.chunk_cumsum import _exp
from impls.triton.grid import cdiv
from impls.triton.occupancy import maxnreg


@triton.jit
def local_state(x_base, B_base, x_desc, B_desc, dt_base, dA_base, seq_base, b, h, g, start, chunk_len, p0, n0,
                offs_p, offs_n, mask_p, mask_n, s_x_l, s_x_p, s_B_l, s_B_n, s_dt_l, s_dA_l, s_seq_l,
                CHUNK: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                HAS_SEQ: tl.constexpr, SWAP: tl.constexpr, EXP2: tl.constexpr, DOT_PRECISION: tl.constexpr,
                TMA: tl.constexpr, EXP2_FTZ: tl.constexpr = True):
    """sum_t exp(dA_cs[last] - dA_cs[t])·dt_t·x_t B_tᵀ over one chunk (same-sequence tokens only), fp32:
    (BLOCK_N, BLOCK_P) with SWAP, else (BLOCK_P, BLOCK_N). With TMA, x and B tiles come through the tensor
    descriptors x_desc (batch, seqlen, nheads, headdim) and B_desc (batch, seqlen, ngroups, dstate), whose
    out-of-bounds zero fill replaces the masks; otherwise through the pointers x_base / B_base."""
    dA_last = tl.load(dA_base + (CHUNK - 1) * s_dA_l).to(tl.float32)
    if HAS_SEQ:
        seq_last = tl.load(seq_base + (chunk_len - 1) * s_seq_l)
    dtype = x_base.dtype.element_ty
    if SWAP:
        acc = tl.zeros((BLOCK_N, BLOCK_P), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
    for k0 in tl.range(0, chunk_len, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < chunk_len
        dA_k = tl.load(dA_base + offs_k * s_dA_l, mask=mask_k, other=0.0).to(tl.float32)
        dt_k = tl.load(dt_base + offs_k * s_dt_l, mask=mask_k, other=0.0).to(tl.float32)
        weight = _exp(dA_last - dA_k, EXP2, EXP2_FTZ) * dt_k  # dA_cs is non-increasing: the exponent is <= 0
        keep = mask_k
        if HAS_SEQ:
            seq_k = tl.load(seq_base + offs_k * s_seq_l, mask=mask_k, other=0)
            keep = keep & (seq_k == seq_last)
        weight = tl.where(keep, weight, 0.0)
        if TMA:
            xk = x_desc.load([b, start + k0, h, p0]).reshape(BLOCK_K, BLOCK_P)
            xk = (xk.to(tl.float32) * weight[:, None]).to(dtype)
            Bk = B_desc.load([b, start + k0, g, n0]).reshape(BLOCK_K, BLOCK_N).to(dtype)
            if SWAP:
                acc = tl.dot(tl.trans(Bk), xk, acc, input_precision=DOT_PRECISION)
            else:
                acc = tl.dot(tl.trans(xk), Bk, acc, input_precision=DOT_PRECISION)
        elif SWAP:
            Bt = tl.load(B_base + offs_n[:, None] * s_B_n + offs_k[None, :] * s_B_l,
                         mask=mask_n[:, None] & mask_k[None, :], other=0.0).to(dtype)
            xk = tl.load(x_base + offs_k[:, None] * s_x_l + offs_p[None, :] * s_x_p,
                         mask=mask_k[:, None] & mask_p[None, :], other=0.0)
            xk = (xk.to(tl.float32) * weight[:, None]).to(dtype)
            acc = tl.dot(Bt, xk, acc, input_precision=DOT_PRECISION)
        else:
            xt = tl.load(x_base + offs_p[:, None] * s_x_p + offs_k[None, :] * s_x_l,
                         mask=mask_p[:, None] & mask_k[None, :], other=0.0)
            xt = (xt.to(tl.float32) * weight[None, :]).to(dtype)
            Bk = tl.load(B_base + offs_k[:, None] * s_B_l + offs_n[None, :] * s_B_n,
                         mask=mask_k[:, None] & mask_n[None, :], other=0.0).to(dtype)
            acc = tl.dot(xt, Bk, acc, input_precision=DOT_PRECISION)
    return acc


@triton.jit
def rows_desc(ptr, batch, seqlen, width, depth, s_b, s_l, s_w, BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr):
    """A tensor descriptor over a (batch, seqlen, width, depth) tensor whose last dimension is contiguous, loading
    (1, BLOCK_L, 1, BLOCK_D) boxes: BLOCK_L positions of one head (or group) and BLOCK_D of its columns."""
    return tl.make_tensor_descriptor(ptr, shape=[batch, seqlen, width, depth], strides=[s_b, s_l, s_w, 1],
                                     block_shape=[1, BLOCK_L, 1, BLOCK_D])


@triton.jit
def states_desc(st_ptr, batch, nchunks, nheads, headdim, dstate, s_st_b, s_st_c, s_st_h, s_st_p, s_st_n,
                BLOCK_P: tl.constexpr, BLOCK_DSTATE: tl.constexpr, ST_N_CONTIG: tl.constexpr):
    """A descriptor over the states (batch, nchunks, nheads, headdim, dstate) in their memory order."""
    if ST_N_CONTIG:
        desc = tl.make_tensor_descriptor(st_ptr, shape=[batch, nchunks, nheads, headdim, dstate],
                                         strides=[s_st_b, s_st_c, s_st_h, s_st_p, 1],
                                         block_shape=[1, 1, 1, BLOCK_P, BLOCK_DSTATE])
    else:
        desc = tl.make_tensor_descriptor(st_ptr, shape=[batch, nchunks, nheads, dstate, headdim],
                                         strides=[s_st_b, s_st_c, s_st_h, s_st_n, 1],
                                         block_shape=[1, 1, 1, BLOCK_DSTATE, BLOCK_P])
    return desc


@triton.jit
def operand_descs(x_ptr, B_ptr, x_hd, B_hd, batch, seqlen, nheads, ngroups, headdim, dstate, s_x_b, s_x_l, s_x_h,
                  s_B_b, s_B_l, s_B_g, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  HOST_DESC: tl.constexpr):
    """local_state's x and B descriptors with TMA: x_hd and B_hd when made once on the host
    (tma_descriptors='host', the same boxes), else made here by rows_desc."""
    if HOST_DESC:
        x_desc = x_hd
        B_desc = B_hd
    else:
        x_desc = rows_desc(x_ptr, batch, seqlen, nheads, headdim, s_x_b, s_x_l, s_x_h, BLOCK_K, BLOCK_P)
        B_desc = rows_desc(B_ptr, batch, seqlen, ngroups, dstate, s_B_b, s_B_l, s_B_g, BLOCK_K, BLOCK_N)
    return x_desc, B_desc


@triton.jit
def program_coords(pid, tiles, nheads, nchunks, HB: tl.constexpr):
    """A flat program id (axis 0 has no 65535 limit) -> (tile, head, chunk, batch in 32 bits for descriptor
    offsets, batch in 64 bits): the tile fastest, then the block of HB heads (head = its first), chunk, batch."""
    tile = pid % tiles
    h = ((pid // tiles) % (nheads // HB)) * HB
    bc = pid // (tiles * (nheads // HB))
    c = bc % nchunks
    b32 = bc // nchunks
    return tile, h, c, b32, b32.to(tl.int64)


@triton.jit
def tile_coords(tile, tiles_n, headdim, dstate, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    """(p0, n0, offs_p, offs_n, mask_p, mask_n) of state tile number `tile` (dstate tiles fastest)."""
    p0 = (tile // tiles_n) * BLOCK_P
    n0 = (tile % tiles_n) * BLOCK_N
    offs_p = p0 + tl.arange(0, BLOCK_P)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    return p0, n0, offs_p, offs_n, offs_p < headdim, offs_n < dstate


@triton.jit
def chunk_state_kernel(
    x_ptr, B_ptr, dt_ptr, dA_ptr, seq_ptr, out_ptr,
    x_hd, B_hd, out_hd,
    batch, seqlen, nheads, nchunks, headdim, dstate, ngroups, heads_per_group,
    s_x_b, s_x_l, s_x_h, s_x_p,
    s_B_b, s_B_l, s_B_g, s_B_n,
    s_dt_b, s_dt_h, s_dt_c, s_dt_l,
    s_dA_b, s_dA_h, s_dA_c, s_dA_l,
    s_seq_b, s_seq_l,
    s_o_b, s_o_c, s_o_h, s_o_p, s_o_n,
    CHUNK: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_SEQ: tl.constexpr, SWAP: tl.constexpr, EXP2: tl.constexpr, DOT_PRECISION: tl.constexpr,
    TMA: tl.constexpr, OUT_N_CONTIG: tl.constexpr, HOST_DESC: tl.constexpr, EXP2_FTZ: tl.constexpr = True,
):
    # flat grid (axis 0 has no 65535 limit): tile fastest, then head, then chunk, then batch
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(dstate, BLOCK_N)
    tiles = tl.cdiv(headdim, BLOCK_P) * tiles_n
    tile, h, c, b32, b = program_coords(pid, tiles, nheads, nchunks, 1)
    g = h // heads_per_group
    p0, n0, offs_p, offs_n, mask_p, mask_n = tile_coords(tile, tiles_n, headdim, dstate, BLOCK_P, BLOCK_N)
    start = c * CHUNK
    chunk_len = tl.minimum(CHUNK, seqlen - start)
    # 64-bit base offsets: batch·stride and position·stride pass 2^31 at a million tokens
    x_base = x_ptr + b * s_x_b + start.to(tl.int64) * s_x_l + h.to(tl.int64) * s_x_h
    B_base = B_ptr + b * s_B_b + start.to(tl.int64) * s_B_l + g.to(tl.int64) * s_B_g
    dt_base = dt_ptr + b * s_dt_b + h.to(tl.int64) * s_dt_h + c.to(tl.int64) * s_dt_c
    dA_base = dA_ptr + b * s_dA_b + h.to(tl.int64) * s_dA_h + c.to(tl.int64) * s_dA_c
    seq_base = seq_ptr + b * s_seq_b + start.to(tl.int64) * s_seq_l
    if TMA:
        x_desc, B_desc = operand_descs(x_ptr, B_ptr, x_hd, B_hd, batch, seqlen, nheads, ngroups, headdim, dstate,
                                       s_x_b, s_x_l, s_x_h, s_B_b, s_B_l, s_B_g, BLOCK_P, BLOCK_N, BLOCK_K, HOST_DESC)
    else:
        x_desc = None
        B_desc = None
    acc = local_state(x_base, B_base, x_desc, B_desc, dt_base, dA_base, seq_base, b32, h, g, start, chunk_len, p0,
                      n0,
                      offs_p, offs_n, mask_p, mask_n, s_x_l, s_x_p, s_B_l, s_B_n, s_dt_l, s_dA_l, s_seq_l,
                      CHUNK, BLOCK_P, BLOCK_N, BLOCK_K, HAS_SEQ, SWAP, EXP2, DOT_PRECISION, TMA, EXP2_FTZ)
    if TMA:
        # the fp32 scratch through a descriptor in its memory order: (…, headdim, dstate) or (…, dstate, headdim)
        if HOST_DESC:
            out_desc = out_hd
        else:
            out_desc = states_desc(out_ptr, batch, nchunks, nheads, headdim, dstate, s_o_b, s_o_c, s_o_h, s_o_p,
                                   s_o_n, BLOCK_P, BLOCK_N, OUT_N_CONTIG)
        if OUT_N_CONTIG:
            if SWAP:
                acc = tl.trans(acc)
            out_desc.store([b32, c, h, p0, n0], acc.reshape(1, 1, 1, BLOCK_P, BLOCK_N))
        else:
            if not SWAP:
                acc = tl.trans(acc)
            out_desc.store([b32, c, h, n0, p0], acc.reshape(1, 1, 1, BLOCK_N, BLOCK_P))
    else:
        out_base = out_ptr + b * s_o_b + c.to(tl.int64) * s_o_c + h.to(tl.int64) * s_o_h
        if SWAP:
            tl.store(out_base + offs_n[:, None] * s_o_n + offs_p[None, :] * s_o_p, acc,
                     mask=mask_n[:, None] & mask_p[None, :])
        else:
            tl.store(out_base + offs_p[:, None] * s_o_p + offs_n[None, :] * s_o_n, acc,
                     mask=mask_p[:, None] & mask_n[None, :])


@triton.jit
def chunk_decay(dA_last_ptr, seq_base, c, seqlen, s_seq_l, CHUNK: tl.constexpr, HAS_SEQ: tl.constexpr,
                EXP2: tl.constexpr, EXP2_FTZ: tl.constexpr = True):
    """exp(dA_cs[c, last]) (dA_last_ptr points at it), the factor of the state carried into chunk c + 1. With
    HAS_SEQ the carry survives only if the sequence at this chunk's last token is the one at the previous chunk's
    last token (sequence 0 before the first chunk); positions·stride fit 32 bits (seqlen does)."""
    decay = _exp(tl.load(dA_last_ptr).to(tl.float32), EXP2, EXP2_FTZ)
    if HAS_SEQ:
        last = tl.minimum((c + 1) * CHUNK, seqlen) - 1
        current = tl.load(seq_base + last * s_seq_l)
        previous = tl.load(seq_base + (c * CHUNK - 1) * s_seq_l, mask=c > 0, other=0)
        decay = tl.where(current == previous, decay, 0.0)
    return decay


@triton.jit
def state_passing_kernel(
    local_ptr, out_ptr, final_ptr, init_ptr, dA_ptr, seq_ptr,
    seqlen, nchunks, headdim, dstate,
    s_l_b, s_l_c, s_l_h, s_l_p, s_l_n,
    s_o_b, s_o_c, s_o_h, s_o_p, s_o_n,
    s_f_b, s_f_h, s_f_p, s_f_n,
    s_i_b, s_i_h, s_i_p, s_i_n,
    s_dA_b, s_dA_h, s_dA_c, s_dA_l,
    s_seq_b, s_seq_l,
    CHUNK: tl.constexpr, BLOCK_S: tl.constexpr, DSTATE_MAJOR: tl.constexpr,
    HAS_INIT: tl.constexpr, HAS_SEQ: tl.constexpr, EXP2: tl.constexpr, EXP2_FTZ: tl.constexpr = True,
):
    offs = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    mask = offs < headdim * dstate
    # walk the elements in the order they lie in memory, so that loads and stores are contiguous
    if DSTATE_MAJOR:
        p = offs % headdim
        n = offs // headdim
    else:
        p = offs // dstate
        n = offs % dstate
    local_ptrs = local_ptr + b * s_l_b + h * s_l_h + p * s_l_p + n * s_l_n
    out_ptrs = out_ptr + b * s_o_b + h * s_o_h + p * s_o_p + n * s_o_n
    if HAS_INIT:
        state = tl.load(init_ptr + b * s_i_b + h * s_i_h + p * s_i_p + n * s_i_n, mask=mask, other=0.0)
        state = state.to(tl.float32)
    else:
        state = tl.zeros((BLOCK_S,), dtype=tl.float32)
    # every per-chunk pointer advances by its stride (pointer arithmetic is 64-bit; chunk·stride may not fit 32)
    dA_last_ptr = dA_ptr + b * s_dA_b + h * s_dA_h + (CHUNK - 1) * s_dA_l
    seq_base = seq_ptr + b * s_seq_b
    for c in range(0, nchunks):
        tl.store(out_ptrs, state.to(out_ptr.dtype.element_ty), mask=mask)
        decay = chunk_decay(dA_last_ptr, seq_base, c, seqlen, s_seq_l, CHUNK, HAS_SEQ, EXP2, EXP2_FTZ)
        state = decay * state + tl.load(local_ptrs, mask=mask, other=0.0)
        local_ptrs += s_l_c
        out_ptrs += s_o_c
        dA_last_ptr += s_dA_c
    tl.store(final_ptr + b * s_f_b + h * s_f_h + p * s_f_p + n * s_f_n, state, mask=mask)


@triton.jit
def state_tile(offs_p, offs_n, mask_p, mask_n, s_p, s_n, SWAP: tl.constexpr):
    """(element offsets, mask) of a state tile in local_state's orientation: (BLOCK_N, BLOCK_P) with SWAP."""
    if SWAP:
        return offs_n[:, None] * s_n + offs_p[None, :] * s_p, mask_n[:, None] & mask_p[None, :]
    else:
        return offs_p[:, None] * s_p + offs_n[None, :] * s_n, mask_p[:, None] & mask_n[None, :]


@triton.jit
def serial_state_kernel(
    x_ptr, B_ptr, dt_ptr, dA_ptr, seq_ptr, init_ptr, out_ptr, final_ptr,
    x_hd, B_hd,
    batch, seqlen, nheads, nchunks, headdim, dstate, ngroups, heads_per_group,
    s_x_b, s_x_l, s_x_h, s_x_p,
    s_B_b, s_B_l, s_B_g, s_B_n,
    s_dt_b, s_dt_h, s_dt_c, s_dt_l,
    s_dA_b, s_dA_h, s_dA_c, s_dA_l,
    s_seq_b, s_seq_l,
    s_i_b, s_i_h, s_i_p, s_i_n,
    s_o_b, s_o_c, s_o_h, s_o_p, s_o_n,
    s_f_b, s_f_h, s_f_p, s_f_n,
    CHUNK: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_INIT: tl.constexpr, HAS_SEQ: tl.constexpr, SWAP: tl.constexpr, EXP2: tl.constexpr,
    DOT_PRECISION: tl.constexpr, TMA: tl.constexpr, HOST_DESC: tl.constexpr, EXP2_FTZ: tl.constexpr = True,
):
    """state_pass='serial': one program per (headdim tile, dstate tile, head, batch) walks the chunks, writing the
    state entering each chunk (state_dtype) and carrying S <- exp(dA_last)·S + local_state in registers; the final
    state (fp32) at the end. The chunk-local states never reach memory. With TMA, x and B through tensor
    descriptors (made here, or with HOST_DESC on the host: x_hd, B_hd); the states through pointers."""
    tiles_n = tl.cdiv(dstate, BLOCK_N)
    # tile fastest, then head, then batch (program_coords with one chunk)
    tile, h, _, b32, b = program_coords(tl.program_id(0), tl.cdiv(headdim, BLOCK_P) * tiles_n, nheads, 1, 1)
    g = h // heads_per_group
    p0, n0, offs_p, offs_n, mask_p, mask_n = tile_coords(tile, tiles_n, headdim, dstate, BLOCK_P, BLOCK_N)
    if TMA:
        x_desc, B_desc = operand_descs(x_ptr, B_ptr, x_hd, B_hd, batch, seqlen, nheads, ngroups, headdim, dstate,
                                       s_x_b, s_x_l, s_x_h, s_B_b, s_B_l, s_B_g, BLOCK_P, BLOCK_N, BLOCK_K, HOST_DESC)
    else:
        x_desc = None
        B_desc = None
    out_offs, mask = state_tile(offs_p, offs_n, mask_p, mask_n, s_o_p, s_o_n, SWAP)
    out_ptrs = out_ptr + b * s_o_b + h.to(tl.int64) * s_o_h + out_offs
    if HAS_INIT:
        init_offs, _ = state_tile(offs_p, offs_n, mask_p, mask_n, s_i_p, s_i_n, SWAP)
        state = tl.load(init_ptr + b * s_i_b + h.to(tl.int64) * s_i_h + init_offs, mask=mask, other=0.0)
        state = state.to(tl.float32)
    elif SWAP:
        state = tl.zeros((BLOCK_N, BLOCK_P), dtype=tl.float32)
    else:
        state = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
    # per-chunk bases advance by their strides (pointer arithmetic is 64-bit: position·stride passes 2^31 at a
    # million tokens)
    seq_b = seq_ptr + b * s_seq_b
    seq_c = seq_b
    x_base = x_ptr + b * s_x_b + h.to(tl.int64) * s_x_h
    B_base = B_ptr + b * s_B_b + g.to(tl.int64) * s_B_g
    dt_base = dt_ptr + b * s_dt_b + h.to(tl.int64) * s_dt_h
    dA_base = dA_ptr + b * s_dA_b + h.to(tl.int64) * s_dA_h
    for c in range(0, nchunks):
        tl.store(out_ptrs, state.to(out_ptr.dtype.element_ty), mask=mask)
        start = c * CHUNK
        local = local_state(x_base, B_base, x_desc, B_desc, dt_base, dA_base, seq_c, b32, h, g, start,
                            tl.minimum(CHUNK, seqlen - start), p0, n0, offs_p, offs_n, mask_p, mask_n,
                            s_x_l, s_x_p, s_B_l, s_B_n, s_dt_l, s_dA_l, s_seq_l,
                            CHUNK, BLOCK_P, BLOCK_N, BLOCK_K, HAS_SEQ, SWAP, EXP2, DOT_PRECISION, TMA, EXP2_FTZ)
        decay = chunk_decay(dA_base + (CHUNK - 1) * s_dA_l, seq_b, c, seqlen, s_seq_l, CHUNK, HAS_SEQ, EXP2,
                            EXP2_FTZ)
        state = decay * state + local
        out_ptrs += s_o_c
        x_base += CHUNK * s_x_l
        B_base += CHUNK * s_B_l
        dt_base += s_dt_c
        dA_base += s_dA_c
        seq_c += CHUNK * s_seq_l
    final_offs, _ = state_tile(offs_p, offs_n, mask_p, mask_n, s_f_p, s_f_n, SWAP)
    tl.store(final_ptr + b * s_f_b + h.to(tl.int64) * s_f_h + final_offs, state, mask=mask)


def _state_buffer(batch, nchunks, nheads, headdim, dstate, dtype, device, transposed, empty):
    """(batch, nchunks, nheads, headdim, dstate) logical; (…, dstate, headdim) in memory when transposed."""
    if transposed:
        return empty((batch, nchunks, nheads, dstate, headdim), dtype, device).transpose(-1, -2)
    return empty((batch, nchunks, nheads, headdim, dstate), dtype, device)


def _operand_boxes(x, B, config) -> dict:
    """{name: (tensor, box)} of local_state's x and B descriptors: BLOCK_K positions of one head (group) and a
    headdim (dstate) tile, as rows_desc makes them in the kernel."""
    block_p, block_n, block_k = config["block_headdim"], config["block_dstate"], config["block_positions"]
    return {"x": (x, (1, block_k, 1, block_p)), "B": (B, (1, block_k, 1, block_n))}


def chunk_states(B, x, dt, dA_cumsum, seq_idx, *, config, switches, empty, dot_precision):
    """fp32 (batch, nchunks, nheads, headdim, dstate): the state each chunk builds from zero."""
    batch, seqlen, nheads, headdim = x.shape
    ngroups, dstate = B.shape[2], B.shape[3]
    nchunks, chunk = dt.shape[2], dt.shape[3]
    local = _state_buffer(batch, nchunks, nheads, headdim, dstate, torch.float32, x.device,
                          switches.transposed_layout, empty)
    seq = seq_idx if seq_idx is not None else dt  # never read without HAS_SEQ
    block_p, block_n = config["block_headdim"], config["block_dstate"]
    host = switches.tma and switches.tma_descriptors == "host"
    if host:
        out_box = (block_p, block_n) if local.stride(-1) == 1 else (block_n, block_p)
        hd = descriptors.host({**_operand_boxes(x, B, config),
                               "chunk-local states": (descriptors.memory_order(local), (1, 1, 1, *out_box))},
                              switches.launch_path)
        host_args = (hd["x"], hd["B"], hd["chunk-local states"])
    else:
        host_args = (None,) * 3
    if switches.tma and not host:
        descriptors.require({"x": x, "B": B, "chunk-local states": descriptors.memory_order(local)})
    tiles = cdiv(headdim, config["block_headdim"]) * cdiv(dstate, config["block_dstate"])
    grid = (tiles * nheads * nchunks * batch,)
    launcher.launch(
        chunk_state_kernel, grid, x, B, dt, dA_cumsum, seq, local, *host_args,
        batch, seqlen, nheads, nchunks, headdim, dstate, ngroups, nheads // ngroups,
        *x.stride(), *B.stride(), *dt.stride(), *dA_cumsum.stride(),
        seq.stride(0), seq.stride(1), *local.stride(),
        CHUNK=chunk, BLOCK_P=config["block_headdim"], BLOCK_N=config["block_dstate"], BLOCK_K=config["block_positions"],
        HAS_SEQ=seq_idx is not None, SWAP=switches.operand_swap, EXP2=switches.exp2,
        DOT_PRECISION=dot_precision, TMA=switches.tma, OUT_N_CONTIG=local.stride(-1) == 1, HOST_DESC=host,
        EXP2_FTZ=switches.exp2_ftz, num_warps=config["num_warps"], num_stages=config["num_stages"],
        maxnreg=maxnreg(config), path=switches.launch_path,
    )
    return local


def pass_states(local, dA_cumsum, initial_states, seq_idx, seqlen, state_dtype, *, config, switches, empty):
    """-> (states entering every chunk in state_dtype, final states fp32 (batch, nheads, headdim, dstate))."""
    batch, nchunks, nheads, headdim, dstate = local.shape
    chunk = dA_cumsum.shape[3]
    states = _state_buffer(batch, nchunks, nheads, headdim, dstate, state_dtype, local.device,
                           switches.transposed_layout, empty)
    final = empty((batch, nheads, headdim, dstate), torch.float32, local.device)
    init = initial_states if initial_states is not None else final  # never read without HAS_INIT
    seq = seq_idx if seq_idx is not None else dA_cumsum  # never read without HAS_SEQ
    grid = (cdiv(headdim * dstate, config["block_state"]), nheads, batch)
    launcher.launch(
        state_passing_kernel, grid, local, states, final, init, dA_cumsum, seq,
        seqlen, nchunks, headdim, dstate,
        *local.stride(), *states.stride(), *final.stride(), *init.stride(), *dA_cumsum.stride(),
        seq.stride(0), seq.stride(1),
        CHUNK=chunk, BLOCK_S=config["block_state"], DSTATE_MAJOR=switches.transposed_layout,
        HAS_INIT=initial_states is not None, HAS_SEQ=seq_idx is not None, EXP2=switches.exp2,
        EXP2_FTZ=switches.exp2_ftz, num_warps=config["num_warps"], path=switches.launch_path,
    )
    return states, final


def serial_states(B, x, dt, dA_cumsum, initial_states, seq_idx, state_dtype, *, config, switches, empty,
                  dot_precision):
    """state_pass='serial': (states entering every chunk in state_dtype, final states fp32) from one kernel that
    walks the chunks per (batch, head, tile); config: chunk_state's fields (tiles, warps, stages, occupancy)."""
    batch, seqlen, nheads, headdim = x.shape
    ngroups, dstate = B.shape[2], B.shape[3]
    nchunks, chunk = dt.shape[2], dt.shape[3]
    states = _state_buffer(batch, nchunks, nheads, headdim, dstate, state_dtype, x.device,
                           switches.transposed_layout, empty)
    final = empty((batch, nheads, headdim, dstate), torch.float32, x.device)
    init = initial_states if initial_states is not None else final  # never read without HAS_INIT
    seq = seq_idx if seq_idx is not None else dt  # never read without HAS_SEQ
    host = switches.tma and switches.tma_descriptors == "host"
    # x and B through descriptors with tma (made here with 'host'); the states are stored through pointers
    host_args = (tuple(descriptors.host(_operand_boxes(x, B, config), switches.launch_path).values()) if host
                 else (None, None))
    if switches.tma and not host:
        descriptors.require({"x": x, "B": B})
    tiles = cdiv(headdim, config["block_headdim"]) * cdiv(dstate, config["block_dstate"])
    launcher.launch(
        serial_state_kernel, (tiles * nheads * batch,), x, B, dt, dA_cumsum, seq, init, states, final, *host_args,
        batch, seqlen, nheads, nchunks, headdim, dstate, ngroups, nheads // ngroups,
        *x.stride(), *B.stride(), *dt.stride(), *dA_cumsum.stride(), seq.stride(0), seq.stride(1),
        *init.stride(), *states.stride(), *final.stride(),
        CHUNK=chunk, BLOCK_P=config["block_headdim"], BLOCK_N=config["block_dstate"], BLOCK_K=config["block_positions"],
        HAS_INIT=initial_states is not None, HAS_SEQ=seq_idx is not None, SWAP=switches.operand_swap,
        EXP2=switches.exp2, DOT_PRECISION=dot_precision, TMA=switches.tma, HOST_DESC=host,
        EXP2_FTZ=switches.exp2_ftz, num_warps=config["num_warps"], num_stages=config["num_stages"],
        maxnreg=maxnreg(config), path=switches.launch_path,
    )
    return states, final


def fwd_pass_state(B, x, dt, dA_cumsum, initial_states, seq_idx, state_dtype, *, configs, switches, empty,
                   dot_precision):
    if switches.state_pass == "serial":
        return serial_states(B, x, dt, dA_cumsum, initial_states, seq_idx, state_dtype or x.dtype,
                             config=configs["chunk_state"], switches=switches, empty=empty,
                             dot_precision=dot_precision)
    local = chunk_states(B, x, dt, dA_cumsum, seq_idx, config=configs["chunk_state"], switches=switches,
                         empty=empty, dot_precision=dot_precision)
    return pass_states(local, dA_cumsum, initial_states, seq_idx, x.shape[1], state_dtype or x.dtype,
                       config=configs["state_passing"], switches=switches, empty=empty)

