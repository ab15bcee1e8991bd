"""Backward stage in cuTile: the reverse state pass. One tile program per (batch·head, headdim block, dstate block)
walks the chunks from last to first carrying the state gradient R = dS_{c+1} as an fp32 tile (impls/README.md, "The
chunked backward", step 2), as the forward's serial stage 2 carries S forwards: per chunk it stores R (the chunk
kernels read it), the tile's part of dΛ_last's carried term d_c ⟨R, S_c⟩ (the local state's part comes from the
chunk kernel), then R ← d_c R + (γ e^Λ dŷ)ᵀ C over the whole chunk in one MMA (the forward's carry with dŷ for x and
C for B; with switch bwd_state_split two MMAs, the weighted dŷ split into its rounding to x's dtype and the rounding of
the rest); the initial states' gradient is R after chunk 0. With switch bwd_entry_term='state_pass' it also forms, per
chunk, dΛ's entering-state term (γ e^Λ dŷ) · (C S_cᵀ) over its (headdim, dstate) block from the C and S_c it holds
(one more MMA per 64 positions), which the chunk kernel then leaves out."""

from __future__ import annotations

import math

import cuda.tile as ct
import torch

from impls.chunked_backward import state_split
from impls.cutile.backward.common import (
    Hints,
    gated_dy,
    kernel_call,
    or_stand_in,
    per_position,
    rows,
    state_storage,
    state_tile,
    unit_last,
)
from impls.cutile.common import KernelCall, next_pow2
from impls.cutile.fwd_pass_state import seq_ends

ZERO = ct.PaddingMode.ZERO
ENTER_ROWS = 64  # the row block of the entering-state term (switch bwd_entry_term='state_pass'), at most the chunk


def _state_in(t, b, h, pb, nb, BP, BN, k):
    """The (BP, BN) tile of a (batch, heads, headdim, dstate) fp32 tensor (final states, their gradient)."""
    st = ct.load(t, (b, h, pb, nb), (1, 1, BP, BN), padding_mode=ZERO, allow_tma=k.tma())
    return st.reshape((BP, BN)).astype(ct.float32)


def bwd_state_pass_kernel(C, dA, seq, states, final, dfinal, dy, z, ext, ds, lasts, dinit, enter, seqlen,
                          heads_per_group,
                          CHUNK: ct.Constant[int], BP: ct.Constant[int], BN: ct.Constant[int],
                          HAS_DFINAL: ct.Constant[bool], HAS_SEQ: ct.Constant[bool], HAS_Z: ct.Constant[bool],
                          HAS_EXT: ct.Constant[bool], HAS_INIT: ct.Constant[bool], TRANS: ct.Constant[bool],
                          TF32: ct.Constant[bool], EXP2: ct.Constant[bool], TMA: ct.Constant[bool],
                          LAT: ct.Constant[int], SPLIT: ct.Constant[bool], FTZ: ct.Constant[bool],
                          ENTER_TERM: ct.Constant[bool], ER: ct.Constant[int]):
    """ds[b, c, h] = R_c (x's dtype), lasts[b, h, c, tile] = d_c ⟨R_c, S_c⟩ over the tile, dinit[b, h] = R_{−1};
    with ENTER_TERM (switch bwd_entry_term='state_pass') enter[b, h, c, tile] (chunk,) = the tile's part of dΛ's
    entering-state term γ_s e^{Λ_s} dŷ_s · (S_c C_s) at every position s (fp32; 0 past the sequence's end), formed
    ER rows at a time.
    states is the forward's 5-d storage ((…, dstate, headdim) when TRANS); dfinal (b, h, headdim, dstate) fp32 (final,
    the final states, is no longer read: dΛ_last's carried part reads S_c);
    ext the per-sequence states' gradient of every S_c (b, nchunks, h, headdim, dstate) fp32."""
    k = Hints(TMA, LAT, EXP2, TF32, FTZ)
    bh, pb, nb = ct.bid(0), ct.bid(1), ct.bid(2)
    nheads = dy.shape[2]
    nchunks = dA.shape[2]
    b, h = bh // nheads, bh % nheads
    g = h // heads_per_group
    tile = pb * ct.num_blocks(2) + nb
    if HAS_DFINAL:
        R = _state_in(dfinal, b, h, pb, nb, BP, BN, k)
    else:
        R = ct.zeros((BP, BN), ct.float32)
    for i in range(nchunks):
        c = nchunks - 1 - i
        ct.store(ds, (b, c, h, pb, nb), R.astype(ds.dtype).reshape((1, 1, 1, BP, BN)), allow_tma=k.tma())
        dA_t = per_position(dA, b, h, c, 0, CHUNK, k) * k.base()
        last = ct.extract(dA_t, (CHUNK - 1,), (1,))
        decay = k.exp(last)
        scale = k.exp(dA_t)
        if HAS_SEQ:  # the tokens of the sequence the entering state continues; no carry across a sequence start
            s_t = ct.load(seq, (b, c), (1, CHUNK), padding_mode=ZERO, allow_tma=k.tma()).reshape((CHUNK,))
            s_last, s_prev = seq_ends(seq, seqlen, b, c, CHUNK)
            scale = ct.where(s_t == s_prev, scale, 0.0)
            decay = ct.where(s_last == s_prev, decay, 0.0)
        # dΛ_last's carried part d_c ⟨R, S_c⟩ (S_c the stored state entering the chunk); the local state's part the
        # chunk kernel adds from the very terms it subtracts at the sources (they cancel exactly)
        S_c = state_tile(states, b, c, h, pb, nb, BP, BN, TRANS, k).astype(ct.float32)
        ct.store(lasts, (b, h, c, tile), (ct.sum(R * S_c) * decay).reshape((1, 1, 1, 1)))
        if ENTER_TERM:  # its (headdim, dstate) block of γ_s e^{Λ_s} Σ_p dŷ_sp (C_s S_cᵀ)_sp, by row blocks
            St = ct.transpose(S_c.astype(C.dtype))
            for j in range(CHUNK // ER):
                jb = c * (CHUNK // ER) + j
                CS = k.mma(rows(C, b, jb, g, nb, ER, BN, k), St, ct.zeros((ER, BP), ct.float32))
                w = k.exp(per_position(dA, b, h, c, j, ER, k) * k.base())
                if HAS_SEQ:
                    s_j = ct.load(seq, (b, jb), (1, ER), padding_mode=ZERO, allow_tma=k.tma())
                    w = ct.where(s_j.reshape((ER,)) == s_prev, w, 0.0)
                term = w * ct.sum(gated_dy(dy, z, b, jb, h, pb, ER, BP, HAS_Z, k) * CS, axis=1)
                ct.store(enter, (b, h, c, tile, j), term.reshape((1, 1, 1, 1, ER)))
        dyw = gated_dy(dy, z, b, c, h, pb, CHUNK, BP, HAS_Z, k) * scale.reshape((CHUNK, 1))
        Ct = rows(C, b, c, g, nb, CHUNK, BN, k)
        hi = dyw.astype(C.dtype)
        R = k.mma(ct.transpose(hi), Ct, R * decay.reshape((1, 1)))
        if SPLIT:  # what hi's rounding left out, as a second operand into the same accumulator
            R = k.mma(ct.transpose((dyw - hi.astype(ct.float32)).astype(C.dtype)), Ct, R)
        if HAS_EXT:
            R = R + _ext_tile(ext, b, c, h, pb, nb, BP, BN, k)
    if HAS_INIT:
        ct.store(dinit, (b, h, pb, nb), R.reshape((1, 1, BP, BN)), allow_tma=k.tma())


def _ext_tile(ext, b, c, h, pb, nb, BP, BN, k):
    """The (BP, BN) tile of the per-sequence states' gradient of S_c, (b, nchunks, h, headdim, dstate) fp32."""
    st = ct.load(ext, (b, c, h, pb, nb), (1, 1, 1, BP, BN), padding_mode=ZERO, allow_tma=k.tma())
    return st.reshape((BP, BN))


def blocks(headdim: int, dstate: int, config: dict) -> tuple[int, int]:
    """(headdim, dstate) columns of the carried tile."""
    bp = min(config.get("block_headdim") or 64, next_pow2(headdim))
    bn = min(config.get("block_dstate") or 64, next_pow2(dstate))
    return bp, bn


def tiles(headdim: int, dstate: int, config: dict) -> int:
    bp, bn = blocks(headdim, dstate, config)
    return math.ceil(headdim / bp) * math.ceil(dstate / bn)


def make_call(arrays, dims, chunk_size: int, flags: dict, transposed: bool, tf32: bool, sw, config) -> KernelCall:
    """arrays = (C, dA, seq, states storage, final, dfinal, dy, z, ext, ds, lasts, dinit, enter): tensors, or
    ArraySpec for AOT compiles; flags: dfinal, seq, z, ext, init (which optional inputs are given)."""
    batch, seqlen, nheads, headdim, ngroups, dstate = dims
    bp, bn = blocks(headdim, dstate, config)
    args = (*arrays, seqlen, nheads // ngroups, chunk_size, bp, bn, bool(flags["dfinal"]), bool(flags["seq"]),
            bool(flags["z"]), bool(flags["ext"]), bool(flags["init"]), bool(transposed), bool(tf32), sw.exp2, sw.tma,
            4 if sw.latency_hints else 0, state_split(sw, arrays[0].dtype), sw.bwd_exp2_ftz,
            sw.bwd_entry_term == "state_pass", min(ENTER_ROWS, chunk_size))
    grid = (batch * nheads, math.ceil(headdim / bp), math.ceil(dstate / bn))
    return kernel_call(bwd_state_pass_kernel, grid, args, config, sw.opt_level)


def state_pass(C, dA_cumsum, seq_idx, states, final, dfinal, dy, z, extra_states, has_init, *, sw, config, tf32: bool,
               submit=None):
    """-> (R (batch, nchunks, nheads, headdim, dstate) in C's dtype: the gradient of the state each chunk leaves,
    dΛ_last partials (batch, nheads, nchunks, state tiles) fp32, the initial states' gradient fp32 or None, dΛ's
    entering-state term per state tile (batch, nheads, nchunks, state tiles, chunk) fp32 with switch
    bwd_entry_term='state_pass', else None)."""
    from impls.cutile import common

    batch, seqlen, nheads, headdim = dy.shape
    ngroups, dstate = C.shape[2], C.shape[3]
    nchunks, chunk = dA_cumsum.shape[2], dA_cumsum.shape[3]
    dev, f32 = C.device, torch.float32
    storage, transposed = state_storage(states)
    ds = torch.empty((batch, nchunks, nheads, headdim, dstate), dtype=C.dtype, device=dev)
    lasts = torch.empty((batch, nheads, nchunks, tiles(headdim, dstate, config)), dtype=f32, device=dev)
    dinit = torch.empty((batch, nheads, headdim, dstate), dtype=f32, device=dev) if has_init else None
    enter = (torch.empty((batch, nheads, nchunks, lasts.shape[3], chunk), dtype=f32, device=dev)
             if sw.bwd_entry_term == "state_pass" else None)
    dfin = unit_last(dfinal.to(f32)) if dfinal is not None else None
    arrays = (C, dA_cumsum, or_stand_in(seq_idx, dev, torch.int32, 2), storage, final, or_stand_in(dfin, dev, f32, 4),
              dy, or_stand_in(z, dev, dy.dtype, 4), or_stand_in(extra_states, dev, f32, 5), ds, lasts,
              or_stand_in(dinit, dev, f32, 4), or_stand_in(enter, dev, f32, 5))
    flags = {"dfinal": dfinal is not None, "seq": seq_idx is not None, "z": z is not None,
             "ext": extra_states is not None, "init": has_init}
    call = make_call(arrays, (batch, seqlen, nheads, headdim, ngroups, dstate), chunk, flags, transposed, tf32, sw,
                     config)
    (submit or common.launch)(call)
    return ds, lasts, dinit, enter
