"""Backward stage: the reverse state pass. One program per (headdim tile, dstate tile, head, batch) walks the chunks
from last to first carrying the state gradient R = dS_{c+1} in registers (impls/README.md, "The chunked backward",
step 2): it stores R per chunk (the gradient of the state chunk c leaves, which the chunk kernels read), the tile's
part of dΛ_last's carried term d_c ⟨R, S_c⟩ (the local state's part comes from the chunk kernel), then
R ← d_c R + Σ_l γ_l e^{Λ_l} dŷ_l C_lᵀ (one tl.dot per BLOCK_K positions; with switch bwd_state_split two, the
weighted dŷ split into its rounding to x's dtype and the rounding of the rest); the initial states' gradient is R
after chunk 0. With switch bwd_entry_term='state_pass' it also writes dΛ's entering-state term γ_s e^{Λ_s} dŷ_s ·
(S_c C_s) over its (headdim, dstate) block, per position (one more tl.dot per BLOCK_K positions, from the C and S_c it
holds), which the chunk kernel then leaves out."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from impls.chunked_backward import state_split
from impls.triton import launcher
from impls.triton.backward.common import decay, gated_dy, log_decay, log_decay_at, rows, sequence_ends
from impls.triton.grid import cdiv


@triton.jit
def _state_tile(ptr, offs_p, offs_n, mask_p, mask_n, s_p, s_n):
    """A (headdim, dstate) tile of one state in fp32, masked to zero."""
    return tl.load(ptr + offs_p[:, None] * s_p + offs_n[None, :] * s_n, mask=mask_p[:, None] & mask_n[None, :],
                   other=0.0).to(tl.float32)


@triton.jit
def bwd_state_pass_kernel(
    C_ptr, dA_ptr, seq_ptr, st_ptr, fin_ptr, dfin_ptr, dy_ptr, z_ptr, ext_ptr,
    ds_ptr, last_ptr, dinit_ptr, enter_ptr,
    seqlen, nheads, nchunks, headdim, dstate, heads_per_group,
    s_C_b, s_C_l, s_C_g, s_C_n,
    s_dA_b, s_dA_h, s_dA_c, s_dA_l,
    s_seq_b, s_seq_l,
    s_st_b, s_st_c, s_st_h, s_st_p, s_st_n,
    s_f_b, s_f_h, s_f_p, s_f_n,
    s_df_b, s_df_h, s_df_p, s_df_n,
    s_dy_b, s_dy_l, s_dy_h, s_dy_p,
    s_z_b, s_z_l, s_z_h, s_z_p,
    s_e_b, s_e_c, s_e_h, s_e_p, s_e_n,
    s_ds_b, s_ds_c, s_ds_h, s_ds_p, s_ds_n,
    s_la_b, s_la_h, s_la_c,
    s_di_b, s_di_h, s_di_p, s_di_n,
    s_en_b, s_en_h, s_en_c, s_en_t,
    CHUNK: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_DFINAL: tl.constexpr, HAS_SEQ: tl.constexpr, HAS_Z: tl.constexpr, HAS_EXT: tl.constexpr,
    HAS_INIT: tl.constexpr, EXP2: tl.constexpr, DOT_PRECISION: tl.constexpr, SPLIT: tl.constexpr,
    LOOP_STAGES: tl.constexpr, ENTER_TERM: tl.constexpr,
):
    # fin_ptr (the final states) is not read: dΛ_last's carried part reads the entering S_c
    # flat grid: state tile fastest, then head, then batch
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(dstate, BLOCK_N)
    tiles = tl.cdiv(headdim, BLOCK_P) * tiles_n
    tile = pid % tiles
    h = ((pid // tiles) % nheads).to(tl.int64)
    b = (pid // (tiles * nheads)).to(tl.int64)
    g = h // heads_per_group
    offs_p = (tile // tiles_n) * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = (tile % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_p = offs_p < headdim
    mask_n = offs_n < dstate
    dtype = C_ptr.dtype.element_ty
    if HAS_DFINAL:
        R = _state_tile(dfin_ptr + b * s_df_b + h * s_df_h, offs_p, offs_n, mask_p, mask_n, s_df_p, s_df_n)
    else:
        R = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
    seq_b = seq_ptr + b * s_seq_b
    for i in range(0, nchunks):
        c = nchunks - 1 - i
        c64 = c.to(tl.int64)
        start = c * CHUNK
        chunk_len = tl.minimum(CHUNK, seqlen - start)
        ds_c = ds_ptr + b * s_ds_b + c64 * s_ds_c + h * s_ds_h
        tl.store(ds_c + offs_p[:, None] * s_ds_p + offs_n[None, :] * s_ds_n, R.to(ds_ptr.dtype.element_ty),
                 mask=mask_p[:, None] & mask_n[None, :])
        seq_last, seq_before = sequence_ends(seq_b, start, chunk_len, s_seq_l, HAS_SEQ)
        dA_c = dA_ptr + b * s_dA_b + h * s_dA_h + c64 * s_dA_c
        d_c = decay(log_decay_at(dA_c + (CHUNK - 1) * s_dA_l, EXP2), EXP2)
        if HAS_SEQ:
            d_c = tl.where(seq_last == seq_before, d_c, 0.0)
        # dΛ_last's carried part d_c ⟨R, S_c⟩ (S_c the stored state entering the chunk); the local state's part
        # Σ_s w_s x_s·V_s the chunk kernel adds from the very terms it subtracts at the sources (they cancel)
        S_c = _state_tile(st_ptr + b * s_st_b + c64 * s_st_c + h * s_st_h, offs_p, offs_n, mask_p, mask_n, s_st_p,
                          s_st_n)
        carried = d_c * tl.sum(tl.sum(R * S_c, axis=1), axis=0)
        tl.store(last_ptr + b * s_la_b + h * s_la_h + c64 * s_la_c + tile, carried)
        start64 = start.to(tl.int64)
        C_c = C_ptr + b * s_C_b + start64 * s_C_l + g * s_C_g
        dy_c = dy_ptr + b * s_dy_b + start64 * s_dy_l + h * s_dy_h
        z_c = z_ptr + b * s_z_b + start64 * s_z_l + h * s_z_h
        acc = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
        St = tl.trans(S_c.to(dtype))
        enter_c = enter_ptr + b * s_en_b + h * s_en_h + c64 * s_en_c + tile * s_en_t
        # the positions' loop is nested in the chunks': Triton's pipeliner stages its loads only when it asks
        for k0 in tl.range(0, chunk_len, BLOCK_K, num_stages=LOOP_STAGES):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            mask_k = offs_k < chunk_len
            scale = tl.where(mask_k, decay(log_decay(dA_c + offs_k * s_dA_l, mask_k, EXP2), EXP2), 0.0)
            if HAS_SEQ:
                seq_k = tl.load(seq_b + (start64 + offs_k) * s_seq_l, mask=mask_k, other=0)
                scale = tl.where(seq_k == seq_before, scale, 0.0)  # tokens of the sequence the state enters
            dyw = gated_dy(dy_c, z_c, offs_k, offs_p, mask_k, mask_p, s_dy_l, s_dy_p, s_z_l, s_z_p, HAS_Z)
            dyw = dyw * scale[:, None]
            hi = dyw.to(dtype)
            Ck = rows(C_c, offs_k, offs_n, mask_k, mask_n, s_C_l, s_C_n).to(dtype)
            if ENTER_TERM:  # switch bwd_entry_term='state_pass': this tile's part of γ e^Λ dŷ · (S_c C) per position
                CS = tl.dot(Ck, St, input_precision=DOT_PRECISION)  # (positions, headdim block)
                tl.store(enter_c + offs_k, tl.sum(dyw * CS, axis=1), mask=mask_k)
            acc = tl.dot(tl.trans(hi), Ck, acc, input_precision=DOT_PRECISION)
            if SPLIT:  # what hi's rounding left out, as a second operand into the same accumulator
                lo = (dyw - hi.to(tl.float32)).to(dtype)
                acc = tl.dot(tl.trans(lo), Ck, acc, input_precision=DOT_PRECISION)
        R = d_c * R + acc
        if HAS_EXT:
            R += _state_tile(ext_ptr + b * s_e_b + c64 * s_e_c + h * s_e_h, offs_p, offs_n, mask_p, mask_n, s_e_p,
                             s_e_n)
    if HAS_INIT:
        tl.store(dinit_ptr + b * s_di_b + h * s_di_h + offs_p[:, None] * s_di_p + offs_n[None, :] * s_di_n, R,
                 mask=mask_p[:, None] & mask_n[None, :])


def state_pass(C, dA_cumsum, seq_idx, states, final, dfinal, dy, z, extra_states, has_init, *, config, switches,
               empty, dot_precision):
    """-> (R (batch, nchunks, nheads, headdim, dstate) in C's dtype: the gradient of the state each chunk leaves,
    dΛ_last partials (batch, nheads, nchunks, state tiles) fp32, the initial states' gradient fp32 or None, dΛ's
    entering-state term per state tile (batch, nheads, nchunks, state tiles, chunk) fp32 with switch
    bwd_entry_term='state_pass', else None)."""
    batch, seqlen, nheads, headdim = dy.shape
    ngroups, dstate = C.shape[2], C.shape[3]
    nchunks, chunk = dA_cumsum.shape[2], dA_cumsum.shape[3]
    block_p, block_n = config["block_headdim"], config["block_dstate"]
    tiles = cdiv(headdim, block_p) * cdiv(dstate, block_n)
    ds = empty((batch, nchunks, nheads, headdim, dstate), C.dtype, C.device)
    lasts = empty((batch, nheads, nchunks, tiles), torch.float32, C.device)
    dinit = empty((batch, nheads, headdim, dstate), torch.float32, C.device) if has_init else final
    dfin = dfinal if dfinal is not None else final  # never read without HAS_DFINAL
    seq = seq_idx if seq_idx is not None else dA_cumsum  # never read without HAS_SEQ
    zz = z if z is not None else dy
    ext = extra_states if extra_states is not None else states
    entering = switches.bwd_entry_term == "state_pass"
    enter = empty((batch, nheads, nchunks, tiles, chunk), torch.float32, C.device) if entering else None
    en = enter if entering else lasts.unsqueeze(-1)  # never written without ENTER_TERM
    launcher.launch(
        bwd_state_pass_kernel, (tiles * nheads * batch,), C, dA_cumsum, seq, states, final, dfin, dy, zz, ext,
        ds, lasts, dinit, en,
        seqlen, nheads, nchunks, headdim, dstate, nheads // ngroups,
        *C.stride(), *dA_cumsum.stride(), seq.stride(0), seq.stride(1), *states.stride(), *final.stride(),
        *dfin.stride(), *dy.stride(), *zz.stride(), *ext.stride(), *ds.stride(), *lasts.stride()[:3],
        *dinit.stride(), *en.stride()[:4],
        CHUNK=chunk, BLOCK_P=block_p, BLOCK_N=block_n, BLOCK_K=config["block_positions"],
        HAS_DFINAL=dfinal is not None, HAS_SEQ=seq_idx is not None, HAS_Z=z is not None,
        HAS_EXT=extra_states is not None, HAS_INIT=has_init, EXP2=switches.exp2, DOT_PRECISION=dot_precision,
        SPLIT=state_split(switches, C.dtype), LOOP_STAGES=config["num_stages"], num_warps=config["num_warps"],
        num_stages=config["num_stages"], ENTER_TERM=entering,
        path=switches.launch_path,
    )
    return ds, lasts, (dinit if has_init else None), enter
