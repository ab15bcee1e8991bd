"""Stages 2 and 3 in one Triton kernel (switch `fuse_state_out`): every chunk's programs do their intra-chunk work
in parallel, and only the hand-off of the state from chunk to chunk is ordered, by flags. Two arrangements of the
programs (switch `fused_program`):

- 'row_tile': one program per (chunk, batch, head, row tile, headdim tile), as compute_out's grid. Each computes,
  for its rows, the chunk's own tokens' term (compute_out.intra_chunk), then waits until the state entering its
  chunk, S_c, is published, adds exp(dA_m)·C_m·S_c (compute_out.state_term, reading S_c from the states tensor)
  and writes y (compute_out.epilogue). The row-tile-0 program of each (chunk, batch, head, headdim tile) is also
  the chunk's *carrier*: before its rows' work it computes the chunk-local state over the whole chunk
  (fwd_pass_state.local_state, all of dstate), waits for S_c, forms S_{c+1} = exp(dA_last)·[same sequence]·S_c +
  local (fp32, as state_passing does), writes it to the fp32 hand-off slot (the `final` output: after the last
  chunk it holds the final state) and, in state_dtype, to the states tensor (the contract's output, which the row
  tiles of chunk c+1 read), and publishes it. Chunk 0's carrier publishes S_0 (the initial state, or zero) first.
- 'chunk': one program per (chunk, batch, head, headdim tile), every one a carrier: the chunk-local state, the
  hand-off as above, then each row tile of the chunk in turn (its own tokens' term, the entering state's term read
  back from the states tensor, D, z, the store). No program does more than another (the row-tile-0 programs above
  do the carrier's work on top of their rows); the chunk's x and B tiles, read for the local state, are read again
  by the same program for its rows, from L2. The arrangement of the fused kernel of the PyTorch blog post
  "Accelerating Mamba2 with Kernel Fusion" (analysis/claims.yaml, pytorch_fused_triton_ssd), which also computes
  chunk_cumsum and C·Bᵀ in the same launch; here chunk_cumsum stays a launch of its own, and C·Bᵀ is computed in
  the program per head or, with cb_mode='shared', once per group by compute_out's C·Bᵀ kernel, one launch before.

Hand-off: flags[b, h, headdim tile, c] = 1 once S_c is in the states tensor and in the slot. Publishing is a CTA
barrier (every thread's stores issued) and one atomic exchange with release semantics; waiting is a spin on an
atomic add of 0 with acquire semantics, then a CTA barrier; the data behind a flag is read with `.cg` loads
(L2, not a possibly stale L1 line) and never through TMA (the async proxy would need a proxy fence). Triton issues
the scalar atomics from one thread and broadcasts their value through shared memory; the acquire add of 0 becomes
an acquire load. `python -m instruments.triton.aot` checks this shape in every fused build's sm_90 PTX (`aot.handoff`).

Deadlock freedom. A program does not take its coordinates from its program id but from a *ticket*, an atomic
increment of a counter it takes as its first instruction; tickets enumerate (chunk, batch, head, row tile, headdim
tile) with the chunk outermost and row tile 0 first (no row tile with 'chunk'). A program that holds ticket t is
running, so every ticket below t belongs to a program that is running or done (CTAs that have started are not
descheduled for others). Every wait points at a smaller ticket: the flag of chunk c > 0 is set by chunk c−1's
carrier, and the flag of chunk 0 by chunk 0's carrier, whose row tile 0 comes first in its (chunk, batch, head)
group (with 'chunk', the program itself). By induction on tickets the program with the smallest unfinished ticket
waits on nothing that is not already published, so it finishes; hence every program finishes, whatever order the
hardware starts CTAs in and however many fit on the GPU at once. Under TRITON_INTERPRET=1 programs run one after
another in grid order, tickets come out in that order, and every flag a program waits for is already set when it
looks.

The counter and flags are zeroed per call (one int32 tensor, 1 + batch·nheads·headdim tiles·(nchunks + 1)).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from impls.triton import descriptors, launcher
from impls.triton.chunk_cumsum import _exp
from impls.triton.compute_out import STRIDE_RANKS as COMPUTE_OUT_STRIDE_RANKS
from impls.triton.compute_out import (
    c_rows,
    cb_matrix,
    epilogue,
    intra_chunk,
    operand_args,
    program_bases,
    row_terms,
    state_term,
    tile_coords,
)
from impls.triton.fwd_pass_state import _state_buffer, local_state, rows_desc
from impls.triton.grid import cdiv, next_pow2
from impls.triton.occupancy import maxnreg


@triton.jit
def _tile_offsets(offs_p, offs_n, s_p, s_n, SWAP: tl.constexpr):
    """Element offsets of a (headdim x dstate) tile in the carried orientation: (dstate, headdim) with SWAP, as
    local_state returns it."""
    if SWAP:
        return offs_n[:, None] * s_n + offs_p[None, :] * s_p
    else:
        return offs_p[:, None] * s_p + offs_n[None, :] * s_n


@triton.jit
def _tile_mask(mask_p, mask_n, SWAP: tl.constexpr):
    if SWAP:
        return mask_n[:, None] & mask_p[None, :]
    else:
        return mask_p[:, None] & mask_n[None, :]


@triton.jit
def _publish(flag_ptr):
    """Every thread's stores before this point are visible to a program that acquires the flag."""
    tl.debug_barrier()
    tl.atomic_xchg(flag_ptr, 1, sem="release")


@triton.jit
def _wait(flag_ptr):
    while tl.atomic_add(flag_ptr, 0, sem="acquire") == 0:
        pass
    tl.debug_barrier()


@triton.jit
def _carry(local, st_base, slot_base, init_base, dA_base, seq_ptr, flags, b, c, seqlen, offs_p, offs_n, mask_p,
           mask_n, s_st_c, s_st_p, s_st_n, s_f_p, s_f_n, s_i_p, s_i_n, s_dA_l, s_seq_b, s_seq_l, nchunks,
           CHUNK: tl.constexpr, HAS_INIT: tl.constexpr, HAS_SEQ: tl.constexpr, SWAP: tl.constexpr,
           EXP2: tl.constexpr):
    """The carrier's hand-off for chunk c: S_{c+1} = exp(dA_last)·[same sequence]·S_c + local, published.

    The decay does not depend on S_c: it is formed before the wait, off the chunk-to-chunk chain (its loads read
    inputs of earlier launches). What stays on the chain after the acquire: S_c's load, and the compiler's two
    layout conversions around the sum (the loaded S_c into the MMA layout of `local`, the sum back into the stores'
    layout; a select that would anchor `local` in the stores' layout first did not move them)."""
    mask = _tile_mask(mask_p, mask_n, SWAP)
    st_offs = _tile_offsets(offs_p, offs_n, s_st_p, s_st_n, SWAP)
    slot_ptrs = slot_base + _tile_offsets(offs_p, offs_n, s_f_p, s_f_n, SWAP)
    st_dtype = st_base.dtype.element_ty
    decay = _exp(tl.load(dA_base + (CHUNK - 1) * s_dA_l).to(tl.float32), EXP2)
    if HAS_SEQ:
        # the carry survives only if the sequence at this chunk's last token is the one at the previous chunk's
        # last token (sequence 0 before the first chunk), as state_passing_kernel decides it
        seq_base = seq_ptr + b * s_seq_b
        last = tl.minimum((c + 1) * CHUNK, seqlen) - 1
        current = tl.load(seq_base + last * s_seq_l)
        previous = tl.load(seq_base + (c * CHUNK - 1) * s_seq_l, mask=c > 0, other=0)
        decay = tl.where(current == previous, decay, 0.0)
    if c == 0:
        if HAS_INIT:
            state = tl.load(init_base + _tile_offsets(offs_p, offs_n, s_i_p, s_i_n, SWAP), mask=mask,
                            other=0.0).to(tl.float32)
        else:
            state = tl.zeros(local.shape, dtype=tl.float32)
        tl.store(st_base + st_offs, state.to(st_dtype), mask=mask)
        _publish(flags)
    else:
        _wait(flags + c)
        state = tl.load(slot_ptrs, mask=mask, other=0.0, cache_modifier=".cg")
    state = decay * state + local
    tl.store(slot_ptrs, state, mask=mask)
    if c + 1 < nchunks:
        tl.store(st_base + s_st_c + st_offs, state.to(st_dtype), mask=mask)
    _publish(flags + c + 1)


@triton.jit
def _rows(B_base, x_base, dt_base, dA_base, C_base, cb_base, seq_base, st_base, z_base, y_base, B_desc, C_desc, x_desc,
          y_desc, D_ptr, flag, b32, g, h, c, start, m0, p0, chunk_len, offs_n, offs_p, mask_n, mask_p, s_C_l, s_C_n,
          s_B_l, s_B_n, s_x_l, s_x_p, s_dA_l, s_dt_l, s_seq_l, s_cb_m, s_cb_k, s_st_p, s_st_n, s_z_l, s_z_p, s_y_l,
          s_y_p, s_D_h, s_D_p, dtype, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_P: tl.constexpr,
          BLOCK_DSTATE: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_SEQ: tl.constexpr,
          SWAP: tl.constexpr, EXP2: tl.constexpr, DOT_PRECISION: tl.constexpr, SHARED_CB: tl.constexpr,
          DECAY_FACTOR: tl.constexpr, TMA: tl.constexpr, PUBLISHED: tl.constexpr):
    """The row tile at m0 of chunk c, one head, one headdim tile: exp(dA_m)·C_m·S_c (S_c read from the states tensor
    through L2, never TMA), the chunk's own tokens' term (C·Bᵀ inline, or with SHARED_CB read from the C·Bᵀ
    matrix), D, z, the store. PUBLISHED (the 'chunk' programs, after their hand-off): S_c is there, and its term
    comes first, in compute_out's order (with SHARED_CB, C's rows are then dead before the source loop); else the
    own tokens' term comes first and the program waits on `flag` for S_c between the two."""
    offs_m = m0 + tl.arange(0, BLOCK_M)
    mask_m = offs_m < chunk_len
    dA_m, state_scale, seq_m = row_terms(dA_base, seq_base, c, offs_m, mask_m, s_dA_l, s_seq_l, EXP2, HAS_SEQ)
    CmT = c_rows(C_base, C_desc, b32, g, start + m0, offs_m, offs_n, mask_m, mask_n, s_C_l, s_C_n, dtype, BLOCK_M,
                 BLOCK_DSTATE, SWAP, TMA)
    if SWAP:
        acc = tl.zeros((BLOCK_P, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_P), dtype=tl.float32)
    if PUBLISHED:
        acc += state_term(st_base, None, CmT, state_scale, b32, c, h, p0, offs_n, offs_p, mask_n, mask_p, s_st_p,
                          s_st_n, dtype, BLOCK_P, BLOCK_DSTATE, SWAP, DOT_PRECISION, False, False, ".cg")
    acc, _ = intra_chunk(acc, acc, B_base, x_base, x_base, cb_base, dA_base, dA_base, dt_base, dt_base, seq_base,
                         B_desc, x_desc, CmT, dA_m, dA_m, seq_m, b32, g, h, start, m0, p0, chunk_len, offs_m, offs_n,
                         offs_p, mask_m, mask_n, mask_p, s_B_l, s_B_n, s_x_l, s_x_p, s_dA_l, s_dt_l, s_seq_l, s_cb_m,
                         s_cb_k, dtype, BLOCK_M, BLOCK_K, BLOCK_P, BLOCK_DSTATE, HAS_SEQ, SWAP, EXP2, DOT_PRECISION,
                         SHARED_CB, DECAY_FACTOR, TMA, 1)
    if not PUBLISHED:
        _wait(flag)
        acc += state_term(st_base, None, CmT, state_scale, b32, c, h, p0, offs_n, offs_p, mask_n, mask_p, s_st_p,
                          s_st_n, dtype, BLOCK_P, BLOCK_DSTATE, SWAP, DOT_PRECISION, False, False, ".cg")
    epilogue(acc, x_base, z_base, y_base, y_desc, D_ptr, b32, h, start + m0, p0, offs_m, offs_p, mask_m, mask_p,
             s_x_l, s_x_p, s_z_l, s_z_p, s_y_l, s_y_p, s_D_h, s_D_p, BLOCK_M, BLOCK_P, HAS_D, HAS_Z, SWAP, EXP2, TMA)


@triton.jit
def _chunk_local_and_carry(x_base, B_base, x_desc, B_desc, dt_base, dA_base, seq_base, st_base, slot_ptr, init_ptr,
                           seq_ptr, flags, b, b32, c, h, g, start, chunk_len, seqlen, nchunks, p0, offs_p, offs_n,
                           mask_p, mask_n, s_x_l, s_x_p, s_B_l, s_B_n, s_dt_l, s_dA_l, s_seq_l, s_st_c, s_st_p,
                           s_st_n, s_f_b, s_f_h, s_f_p, s_f_n, s_i_b, s_i_h, s_i_p, s_i_n, s_seq_b,
                           CHUNK: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_P: tl.constexpr,
                           BLOCK_DSTATE: tl.constexpr, HAS_INIT: tl.constexpr, HAS_SEQ: tl.constexpr,
                           SWAP: tl.constexpr, EXP2: tl.constexpr, DOT_PRECISION: tl.constexpr, TMA: tl.constexpr):
    """The chunk's carrier work: its local state over the whole chunk (no dependency), then the hand-off."""
    local = local_state(x_base, B_base, x_desc, B_desc, dt_base, dA_base, seq_base, b32, h, g, start, chunk_len,
                        p0, 0, offs_p, offs_n, mask_p, mask_n, s_x_l, s_x_p, s_B_l, s_B_n, s_dt_l, s_dA_l,
                        s_seq_l, CHUNK, BLOCK_P, BLOCK_DSTATE, BLOCK_K, HAS_SEQ, SWAP, EXP2, DOT_PRECISION, TMA)
    _carry(local, st_base, slot_ptr + b * s_f_b + h.to(tl.int64) * s_f_h,
           init_ptr + b * s_i_b + h.to(tl.int64) * s_i_h, dA_base, seq_ptr, flags, b, c, seqlen, offs_p, offs_n,
           mask_p, mask_n, s_st_c, s_st_p, s_st_n, s_f_p, s_f_n, s_i_p, s_i_n, s_dA_l, s_seq_b, s_seq_l, nchunks,
           CHUNK, HAS_INIT, HAS_SEQ, SWAP, EXP2)


# fused_kernel's stride arguments, one tuple per tensor in its dimension order, and their count: compute_out's
# (compute_out.STRIDE_RANKS), and the initial states s_i and the final states s_f, (batch, head, headdim, dstate)
STRIDE_RANKS = {**COMPUTE_OUT_STRIDE_RANKS, "s_i": 4, "s_f": 4}


@triton.jit
def fused_kernel(
    C_ptr, B_ptr, x_ptr, dt_ptr, dA_ptr, init_ptr, D_ptr, z_ptr, seq_ptr, st_ptr, slot_ptr, y_ptr, sync_ptr, cb_ptr,
    C_hd, B_hd, x_hd, y_hd,
    batch, seqlen, nheads, nchunks, headdim, dstate, ngroups, heads_per_group,
    s_C, s_B, s_x, s_dt, s_dA, s_i, s_st, s_f, s_D, s_z, s_seq, s_y, s_cb,
    CHUNK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_P: tl.constexpr,
    BLOCK_DSTATE: tl.constexpr,
    HAS_INIT: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_SEQ: tl.constexpr,
    SWAP: tl.constexpr, EXP2: tl.constexpr, DOT_PRECISION: tl.constexpr, DECAY_FACTOR: tl.constexpr,
    TMA: tl.constexpr, HOST_DESC: tl.constexpr, WHOLE_CHUNK: tl.constexpr, SHARED_CB: tl.constexpr,
):
    # the ticket, not the program id, names the work: chunk outermost, then batch, head, (row tile,) headdim tile
    ticket = tl.atomic_add(sync_ptr, 1)
    tiles_p = tl.cdiv(headdim, BLOCK_P)
    if WHOLE_CHUNK:  # fused_program='chunk': one program walks every row tile of its chunk
        tiles = tiles_p
    else:
        tiles = tiles_p * (CHUNK // BLOCK_M)
    tile = ticket % tiles
    h = (ticket // tiles) % nheads
    b32 = (ticket // (tiles * nheads)) % batch  # descriptor offsets are 32-bit
    c = ticket // (tiles * nheads * batch)
    b = b32.to(tl.int64)
    g = h // heads_per_group
    pb = tile % tiles_p
    p0 = pb * BLOCK_P
    m0 = (tile // tiles_p) * BLOCK_M  # 0 with WHOLE_CHUNK
    offs_p, _, offs_n, start, chunk_len, mask_p, _, mask_n = tile_coords(
        m0, p0, c, seqlen, headdim, dstate, CHUNK, BLOCK_M, BLOCK_P, BLOCK_DSTATE)
    C_base, B_base, x_base, dt_base, dA_base, st_base, cb_base, seq_base, z_base, y_base = program_bases(
        C_ptr, B_ptr, x_ptr, dt_ptr, dA_ptr, st_ptr, cb_ptr, seq_ptr, z_ptr, y_ptr, b, start, g, h, c,
        s_C, s_B, s_x, s_dt, s_dA, s_st, s_cb, s_seq, s_z, s_y)
    flags = sync_ptr + 1 + ((b * nheads + h) * tiles_p + pb) * (nchunks + 1)
    dtype = x_ptr.dtype.element_ty
    if HOST_DESC:  # made once on the host (tma_descriptors='host'), same boxes as below
        C_desc = C_hd
        B_desc = B_hd
        x_desc = x_hd
        y_desc = y_hd
    elif TMA:
        C_desc = rows_desc(C_ptr, batch, seqlen, ngroups, dstate, s_C[0], s_C[1], s_C[2], BLOCK_M, BLOCK_DSTATE)
        B_desc = rows_desc(B_ptr, batch, seqlen, ngroups, dstate, s_B[0], s_B[1], s_B[2], BLOCK_K, BLOCK_DSTATE)
        x_desc = rows_desc(x_ptr, batch, seqlen, nheads, headdim, s_x[0], s_x[1], s_x[2], BLOCK_K, BLOCK_P)
        y_desc = rows_desc(y_ptr, batch, seqlen, nheads, headdim, s_y[0], s_y[1], s_y[2], BLOCK_M, BLOCK_P)
    else:
        C_desc = None
        B_desc = None
        x_desc = None
        y_desc = None

    if m0 == 0:  # the chunk's carrier: its local state first (no dependency), then the hand-off
        _chunk_local_and_carry(
            x_base, B_base, x_desc, B_desc, dt_base, dA_base, seq_base, st_base, slot_ptr, init_ptr, seq_ptr, flags,
            b, b32, c, h, g, start, chunk_len, seqlen, nchunks, p0, offs_p, offs_n, mask_p, mask_n, s_x[1], s_x[3],
            s_B[1], s_B[3], s_dt[3], s_dA[3], s_seq[1], s_st[1], s_st[3], s_st[4], s_f[0], s_f[1], s_f[2], s_f[3],
            s_i[0], s_i[1], s_i[2], s_i[3], s_seq[0], CHUNK, BLOCK_K, BLOCK_P, BLOCK_DSTATE, HAS_INIT, HAS_SEQ, SWAP,
            EXP2, DOT_PRECISION, TMA)
    if WHOLE_CHUNK:
        # S_c is published (the carry above waited for it): each row tile in turn, start to end of the chunk
        for m in range(0, chunk_len, BLOCK_M):
            _rows(B_base, x_base, dt_base, dA_base, C_base, cb_base, seq_base, st_base, z_base, y_base, B_desc, C_desc,
                  x_desc, y_desc, D_ptr, flags + c, b32, g, h, c, start, m, p0, chunk_len, offs_n, offs_p, mask_n,
                  mask_p, s_C[1], s_C[3], s_B[1], s_B[3], s_x[1], s_x[3], s_dA[3], s_dt[3], s_seq[1], s_cb[3],
                  s_cb[4], s_st[3], s_st[4], s_z[1], s_z[3], s_y[1], s_y[3], s_D[0], s_D[1], dtype, BLOCK_M, BLOCK_K,
                  BLOCK_P, BLOCK_DSTATE, HAS_D, HAS_Z, HAS_SEQ, SWAP, EXP2, DOT_PRECISION, SHARED_CB, DECAY_FACTOR,
                  TMA, True)
    else:
        # the row tile's own tokens first, then the wait for S_c (published by the chunk's carrier, or by chunk 0's)
        _rows(B_base, x_base, dt_base, dA_base, C_base, cb_base, seq_base, st_base, z_base, y_base, B_desc, C_desc,
              x_desc, y_desc, D_ptr, flags + c, b32, g, h, c, start, m0, p0, chunk_len, offs_n, offs_p, mask_n,
              mask_p, s_C[1], s_C[3], s_B[1], s_B[3], s_x[1], s_x[3], s_dA[3], s_dt[3], s_seq[1], s_cb[3], s_cb[4],
              s_st[3], s_st[4], s_z[1], s_z[3], s_y[1], s_y[3], s_D[0], s_D[1], dtype, BLOCK_M, BLOCK_K, BLOCK_P,
              BLOCK_DSTATE, HAS_D, HAS_Z, HAS_SEQ, SWAP, EXP2, DOT_PRECISION, SHARED_CB, DECAY_FACTOR, TMA, False)


def fused_state_out(C, B, x, dt, dA_cumsum, initial_states, D, z, seq_idx, state_dtype, *, config, switches, empty,
                    dot_precision):
    """-> (y like x, states (batch, nchunks, nheads, headdim, dstate) in state_dtype, final states fp32)."""
    batch, seqlen, nheads, headdim = x.shape
    ngroups, dstate = B.shape[2], B.shape[3]
    nchunks, chunk = dt.shape[2], dt.shape[3]
    y = empty((batch, seqlen, nheads, headdim), x.dtype, x.device)
    states = _state_buffer(batch, nchunks, nheads, headdim, dstate, state_dtype, x.device,
                           switches.transposed_layout, empty)
    final = empty((batch, nheads, headdim, dstate), torch.float32, x.device)
    block_m, block_k, block_p = config["block_rows"], config["block_positions"], config["block_headdim"]
    block_dstate = max(16, next_pow2(dstate))
    host = switches.tma and switches.tma_descriptors == "host"
    if host:
        hd = descriptors.host({"C": (C, (1, block_m, 1, block_dstate)), "B": (B, (1, block_k, 1, block_dstate)),
                               "x": (x, (1, block_k, 1, block_p)), "y": (y, (1, block_m, 1, block_p))},
                              switches.launch_path)
    elif switches.tma:
        descriptors.require({"C": C, "B": B, "x": x, "y": y})
    D_arg, z_arg, seq, D_strides = operand_args(x, dt, D, z, seq_idx)
    init = initial_states if initial_states is not None else final  # never read without HAS_INIT
    tiles_p = cdiv(headdim, block_p)
    whole_chunk = switches.fused_program == "chunk"
    tiles = tiles_p if whole_chunk else tiles_p * (chunk // block_m)
    # the ticket counter and the per-chunk flags, zeroed (through `empty`, as every buffer of the stage)
    sync = empty((1 + batch * nheads * tiles_p * (nchunks + 1),), torch.int32, x.device).zero_()
    shared = switches.cb_mode == "shared"  # with fused_program='chunk' only (the backend refuses it otherwise)
    # never read unless shared
    cb = cb_matrix(C, B, chunk, empty, dot_precision, switches.launch_path) if shared else dt
    launcher.launch(
        fused_kernel, (tiles * nheads * batch * nchunks,),
        C, B, x, dt, dA_cumsum, init, D_arg, z_arg, seq, states, final, y, sync, cb,
        *((hd["C"], hd["B"], hd["x"], hd["y"]) if host else (None,) * 4),
        batch, seqlen, nheads, nchunks, headdim, dstate, ngroups, nheads // ngroups,
        C.stride(), B.stride(), x.stride(), dt.stride(), dA_cumsum.stride(), init.stride(), states.stride(),
        final.stride(), D_strides, z_arg.stride(), seq.stride()[:2], y.stride(), cb.stride() if shared else (0,) * 5,
        CHUNK=chunk, BLOCK_M=block_m, BLOCK_K=block_k, BLOCK_P=block_p, BLOCK_DSTATE=block_dstate,
        HAS_INIT=initial_states is not None, HAS_D=D is not None, HAS_Z=z is not None, HAS_SEQ=seq_idx is not None,
        SWAP=switches.operand_swap, EXP2=switches.exp2, DOT_PRECISION=dot_precision,
        DECAY_FACTOR=switches.decay_factor, TMA=switches.tma, HOST_DESC=host, WHOLE_CHUNK=whole_chunk, SHARED_CB=shared,
        num_warps=config["num_warps"], num_stages=config["num_stages"], maxnreg=maxnreg(config),
        path=switches.launch_path,
    )
    return y, states, final
