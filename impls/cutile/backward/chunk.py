"""Backward stage in cuTile: the per-head chunk kernel. One tile program per (source tile, head, batch·chunk) owns
the gradients of its BS source positions s (impls/README.md, "The chunked backward", step 3): dx_s, the part of ddt_s
that does not go through Λ, dΛ_s's own terms, dz_s and its tile's share of dD; walking the row tiles l ≥ s of the
chunk it forms G = C_l B_sᵀ, dM = dŷ_l x_sᵀ and M = G ∘ L ∘ dt_s (three MMAs per row tile, with dx_s += Mᵀ dŷ_l) and
writes the row sums of T = dM ∘ M, which its rows' owners do not see, as one partial per source tile. A source tile
past the end of a short last chunk writes only its (zero) dD partial: no load lies wholly outside an array. G depends
on the group only: switch bwd_cb='shared' forms it once per (batch, chunk, group) with the forward's cb_kernel
(impls/cutile/compute_out.py, the tiles on or below the diagonal) and every head's programs load their (rows ×
sources) tile of it, keeping its causal elements, instead of the MMA (two MMAs per row tile). dΛ_s's entering-state
term needs C_s and the chunk's state: switch bwd_entry_term 'state_pass' or 'dcb' leaves it to the reverse state pass
or the dcb kernel, which hold the state already, and the program reads neither."""

from __future__ import annotations

import math

import cuda.tile as ct
import torch

from impls.cutile.backward.common import (
    Hints,
    chunk_length,
    dy_tiles,
    gated_dy,
    kernel_call,
    or_stand_in,
    per_position,
    rows,
    state_storage,
    state_tile,
)
from impls.cutile.common import KernelCall, next_pow2
from impls.cutile.fwd_pass_state import seq_ends

ZERO = ct.PaddingMode.ZERO


def _positions(start, BL):
    return start + ct.arange(BL, dtype=ct.int32)


def _skip_grads(D, x_s, dyh_s, h, BP, D_MODE, k):
    """(D ⊙ dŷ_s, the tile's dD partial Σ_s dŷ_s ⊙ x_s (BP,)), D per head or per channel (D_MODE 1, 2)."""
    if D_MODE == 1:
        d = ct.load(D, (h,), (1,), allow_tma=k.tma()).astype(ct.float32).reshape((1, 1))
    else:
        d = ct.load(D, (h, 0), (1, BP), padding_mode=ZERO, allow_tma=k.tma()).astype(ct.float32)
    return d * dyh_s, ct.sum(dyh_s * x_s.astype(ct.float32), axis=0)


def _gate_grad(dy, z, yhat, b, sb, h, BS, BP, k):
    """dz = dy ⊙ ŷ ⊙ σ(z)(1 + z(1 − σ(z))) for y = ŷ ⊙ silu(z), fp32 (BS, BP)."""
    zz = rows(z, b, sb, h, 0, BS, BP, k).astype(ct.float32)
    sig = 1.0 / (1.0 + k.exp(-zz * k.base()))
    g = rows(dy, b, sb, h, 0, BS, BP, k).astype(ct.float32) * rows(yhat, b, sb, h, 0, BS, BP, k).astype(ct.float32)
    return g * sig * (1.0 + zz * (1.0 - sig))


def bwd_chunk_kernel(x, B, C, dt, dA, seq, states, ds, dy, z, yhat, D, xv, dx, dz, ddt, dl, row, dD,
                     seqlen, heads_per_group,
                     CHUNK: ct.Constant[int], BS: ct.Constant[int], BL: ct.Constant[int], BP: ct.Constant[int],
                     BN: ct.Constant[int], HAS_SEQ: ct.Constant[bool], HAS_Z: ct.Constant[bool],
                     D_MODE: ct.Constant[int], HAS_XV: ct.Constant[bool], TRANS: ct.Constant[bool],
                     TF32: ct.Constant[bool], EXP2: ct.Constant[bool], TMA: ct.Constant[bool],
                     LAT: ct.Constant[int], SHARED_CB: ct.Constant[bool], cbm, FTZ: ct.Constant[bool],
                     DECAY_FACTOR: ct.Constant[bool], ENTER_TERM: ct.Constant[bool]):
    """dx, dz (x's and z's dtype); ddt, dl (b, h, nchunks, chunk) fp32 at the tile's positions; row (b, h, nchunks,
    source tiles, chunk) fp32 at rows l ≥ the tile's first row tile; dD (b, nchunks, source tiles, h, BP) fp32.
    D_MODE: 0 no D, 1 per head, 2 per channel. SHARED_CB (switch bwd_cb='shared'): G read from cbm, the groups' C·Bᵀ
    (b, nchunks, ngroups, chunk, chunk) fp32 written on and below the diagonal (last: the default build's other
    parameters keep their places). DECAY_FACTOR (switch bwd_decay_factor): the decays of the row tiles below the
    diagonal as an outer product of per-row and per-source factors. ENTER_TERM: dΛ_s's entering-state term formed here
    (C_s and the state S_c read); off (switch bwd_entry_term 'state_pass' or 'dcb') that kernel forms it."""
    k = Hints(TMA, LAT, EXP2, TF32, FTZ)
    # one flat grid axis (batch·nchunks passes the 65535 of the others at 2^20 tokens): source tile fastest, then
    # head, chunk, batch, so that the programs in flight share their chunk's B and C tiles
    pid = ct.bid(0)
    tiles, nheads, nchunks = CHUNK // BS, dy.shape[2], dA.shape[2]
    t, h = pid % tiles, (pid // tiles) % nheads
    c, b = (pid // (tiles * nheads)) % nchunks, pid // (tiles * nheads * nchunks)
    g = h // heads_per_group
    chunk_len = chunk_length(seqlen, c, CHUNK)
    s0 = t * BS
    if s0 < chunk_len:
        _source_tile(x, B, C, dt, dA, seq, states, ds, dy, z, yhat, D, xv, dx, dz, ddt, dl, row, dD, seqlen, b, c, h,
                     g, t, chunk_len, CHUNK, BS, BL, BP, BN, HAS_SEQ, HAS_Z, D_MODE, HAS_XV, TRANS, k, SHARED_CB, cbm,
                     DECAY_FACTOR, ENTER_TERM)
    elif D_MODE > 0:  # the host sums every tile's partial
        ct.store(dD, (b, c, t, h, 0), ct.zeros((1, 1, 1, 1, BP), ct.float32))


def _source_tile(x, B, C, dt, dA, seq, states, ds, dy, z, yhat, D, xv, dx, dz, ddt, dl, row, dD, seqlen, b, c, h, g,
                 t, chunk_len, CHUNK, BS, BL, BP, BN, HAS_SEQ, HAS_Z, D_MODE, HAS_XV, TRANS, k, SHARED_CB, cbm,
                 DECAY_FACTOR, ENTER_TERM):
    sb = c * (CHUNK // BS) + t  # the tile's rows, in BS-row blocks of (batch, seqlen, …) tensors
    offs_s = _positions(t * BS, BS)
    mask_s = offs_s < chunk_len
    dA_s = per_position(dA, b, h, c, t, BS, k) * k.base()
    dA_last = ct.gather(dA, (b, h, c, CHUNK - 1)) * k.base()
    dt_s = per_position(dt, b, h, c, t, BS, k)
    x_s = rows(x, b, sb, h, 0, BS, BP, k)
    B_s = rows(B, b, sb, g, 0, BS, BN, k)
    dyh_s = gated_dy(dy, z, b, sb, h, 0, BS, BP, HAS_Z, k)
    own = mask_s  # the tokens the chunk's local state counts: those of the sequence at its last token
    enter = mask_s  # the tokens that read the entering state: those of the sequence active before the chunk
    seq_s = offs_s
    if HAS_SEQ:
        seq_s = ct.load(seq, (b, sb), (1, BS), padding_mode=ZERO, allow_tma=k.tma()).reshape((BS,))
        s_last, s_prev = seq_ends(seq, seqlen, b, c, CHUNK)
        own = own & (seq_s == s_last)
        enter = enter & (seq_s == s_prev)

    # the chunk's local state S^loc = Σ_s w_s x_s B_sᵀ, whose gradient R the reverse state pass stored
    R = ct.load(ds, (b, c, h, 0, 0), (1, 1, 1, BP, BN), padding_mode=ZERO, allow_tma=k.tma(), latency=k.lat())
    V = k.mma(B_s, ct.transpose(R.reshape((BP, BN))), ct.zeros((BS, BP), ct.float32))  # R B_s per source
    to_last = ct.where(own, k.exp(dA_last - dA_s), 0.0)
    w = to_last * dt_s
    dxa = w.reshape((BS, 1)) * V
    dw = ct.sum(x_s.astype(ct.float32) * V, axis=1)
    ddt_s = to_last * dw
    dl_s = -w * dw
    local = ct.sum(w * dw, axis=0)  # its sum goes to Λ_last (a row partial below): the pair cancels exactly
    if ENTER_TERM:  # the entering state's term of y_s: dΛ_s += e^{Λ_s} dŷ_s · (S_c C_s) (else another kernel's)
        C_s = rows(C, b, sb, g, 0, BS, BN, k)
        S = state_tile(states, b, c, h, 0, 0, BP, BN, TRANS, k).astype(C.dtype)
        CS = k.mma(C_s, ct.transpose(S), ct.zeros((BS, BP), ct.float32))
        dl_s = dl_s + ct.where(enter, k.exp(dA_s), 0.0) * ct.sum(dyh_s * CS, axis=1)
    if HAS_Z:
        ct.store(dz, (b, sb, h, 0), _gate_grad(dy, z, yhat, b, sb, h, BS, BP, k).astype(dz.dtype)
                 .reshape((1, BS, 1, BP)), allow_tma=k.tma())
    if D_MODE > 0:
        skip, part = _skip_grads(D, x_s, dyh_s, h, BP, D_MODE, k)
        dxa = dxa + skip
        ct.store(dD, (b, c, t, h, 0), part.reshape((1, 1, 1, 1, BP)))

    # the intra-chunk scores, row tiles l ≥ s
    # U_s = Σ_l dM_ls G_ls L_ls (T's column sums Σ_l T_ls are dt_s U_s, M = GL ∘ dt_s), kept as the (rows × sources)
    # tile of its terms and summed over the rows once after the walk: a sum across the warps (shared memory and a
    # barrier) per row tile fewer
    U_terms = ct.zeros((BL, BS), ct.float32)
    if DECAY_FACTOR:  # switch bwd_decay_factor: below the diagonal L = e^{Λ_l − Λ_s} factored at the tile's last source
        # p: e_src_s = e^{Λ_p − Λ_s} once per program, e^{Λ_l − Λ_p} once per row of each row tile
        dA_pivot = ct.gather(dA, (b, h, c, t * BS + BS - 1)) * k.base()
        e_src = k.exp(dA_pivot - dA_s)
    for j in range((t * BS) // BL, (chunk_len + BL - 1) // BL):
        lb = c * (CHUNK // BL) + j
        offs_l = _positions(j * BL, BL)
        if not SHARED_CB:
            C_l = rows(C, b, lb, g, 0, BL, BN, k)
        dyh_l = dy_tiles(dy, z, b, lb, h, 0, BL, BP, HAS_Z, x.dtype, k)[0]
        dA_l = per_position(dA, b, h, c, j, BL, k) * k.base()
        diff = dA_l.reshape((BL, 1)) - dA_s.reshape((1, BS))
        if SHARED_CB:  # the tiles on and below the diagonal are written
            G = ct.load(cbm, (b, c, g, j, t), (1, 1, 1, BL, BS), allow_tma=k.tma(), latency=k.lat()).reshape((BL, BS))
        else:
            G = k.mma(C_l, ct.transpose(B_s), ct.zeros((BL, BS), ct.float32))
        # below the diagonal, inside the chunk and of one sequence, every pair is causal: no mask to form
        inside = (j * BL >= (t + 1) * BS) & ((j + 1) * BL <= chunk_len) & ((t + 1) * BS <= chunk_len)
        if HAS_SEQ or not inside:
            keep = ((offs_l.reshape((BL, 1)) >= offs_s.reshape((1, BS))) & (offs_l < chunk_len).reshape((BL, 1))
                    & mask_s.reshape((1, BS)))
            if HAS_SEQ:
                seq_l = ct.load(seq, (b, lb), (1, BL), padding_mode=ZERO, allow_tma=k.tma()).reshape((BL, 1))
                keep = keep & (seq_l == seq_s.reshape((1, BS)))
            L = k.exp(ct.where(keep, diff, -math.inf))
            if SHARED_CB:  # its causal elements only
                G = ct.where(keep, G, 0.0)
        elif DECAY_FACTOR:  # L_ls = e_row_l · e_src_s, both factors ≤ 1: an exponential per row, not per pair
            L = k.exp(dA_l - dA_pivot).reshape((BL, 1)) * e_src.reshape((1, BS))
        else:
            L = k.exp(diff)
        dM = k.mma(dyh_l, ct.transpose(x_s), ct.zeros((BL, BS), ct.float32))
        GL = G * L
        M = GL * dt_s.reshape((1, BS))
        dxa = k.mma(ct.transpose(M.astype(x.dtype)), dyh_l, dxa)
        U_terms = U_terms + dM * GL
        T = dM * M
        # dΛ_last's local part: + Σ_s w_s x_s·V_s, the same fp32 terms dl_s takes from the sources
        rs = ct.sum(T, axis=1) + ct.where(offs_l == chunk_len - 1, local, 0.0)
        ct.store(row, (b, h, c, t, j), rs.reshape((1, 1, 1, 1, BL)))
    U = ct.sum(U_terms, axis=0)
    ddt_s = ddt_s + U
    dl_s = dl_s - dt_s * U
    if HAS_XV:  # the per-sequence states' gradient (cu_seqlens), from autograd
        dxa = dxa + rows(xv, b, sb, h, 0, BS, BP, k)
    ct.store(dx, (b, sb, h, 0), dxa.astype(dx.dtype).reshape((1, BS, 1, BP)), allow_tma=k.tma())
    ct.store(ddt, (b, h, c, t), ddt_s.reshape((1, 1, 1, BS)))
    ct.store(dl, (b, h, c, t), dl_s.reshape((1, 1, 1, BS)))


def blocks(chunk: int, headdim: int, dstate: int, config: dict) -> tuple[int, int, int, int]:
    """(source tile, row tile, headdim, dstate): the whole headdim and dstate in one tile."""
    bs = min(config.get("block_sources") or 64, chunk)
    bl = min(config.get("block_rows") or 64, chunk)
    return bs, bl, next_pow2(headdim), next_pow2(dstate)


def make_call(arrays, dims, chunk_size: int, flags: dict, d_mode: int, transposed: bool, tf32: bool, sw,
              config) -> KernelCall:
    """arrays = (x, B, C, dt, dA, seq, states storage, ds, dy, z, yhat, D, xv, dx, dz, ddt, dl, row, dD, cb): tensors,
    or ArraySpec for AOT compiles (cb: the groups' C·Bᵀ with switch bwd_cb='shared', else a 5-d stand-in); flags:
    seq, z, xv; d_mode 0 (no D), 1 (per head), 2 (per channel)."""
    batch, seqlen, nheads, headdim, ngroups, dstate = dims
    bs, bl, bp, bn = blocks(chunk_size, headdim, dstate, config)
    *arrays, cb = arrays
    args = (*arrays, seqlen, nheads // ngroups, chunk_size, bs, bl, bp, bn, bool(flags["seq"]), bool(flags["z"]),
            int(d_mode), bool(flags["xv"]), bool(transposed), bool(tf32), sw.exp2, sw.tma,
            4 if sw.latency_hints else 0, sw.bwd_cb == "shared", cb, sw.bwd_exp2_ftz, sw.bwd_decay_factor,
            sw.bwd_entry_term == "chunk")
    grid = ((chunk_size // bs) * nheads * math.ceil(seqlen / chunk_size) * batch, 1, 1)
    return kernel_call(bwd_chunk_kernel, grid, args, config, sw.opt_level)


def chunk_grads(x, B, C, dt, dA_cumsum, seq_idx, states, ds, dy, z, yhat, D, extra_dx, cb, *, sw, config,
                tf32: bool, submit=None):
    """-> (dx in x's dtype, dz in z's dtype or None, ddt's part outside Λ, dΛ's own terms (both fp32 (batch,
    nheads, nchunks, chunk), written inside the sequence only), T's row-sum partials (batch, nheads, nchunks, source
    tiles, chunk) fp32, dD partials (batch, nchunks, source tiles, nheads, headdim) fp32 or None). `cb`: None (G
    formed per head, switch bwd_cb='inline'), or the groups' C·Bᵀ from `shared_cb` (bwd_cb='shared')."""
    if (cb is not None) != (sw.bwd_cb == "shared"):
        raise ValueError(f"switch bwd_cb={sw.bwd_cb!r} of backend 'cutile': bwd_chunk takes the groups' C·Bᵀ "
                         "(shared_cb's buffer) with 'shared' and none with 'inline'")
    from impls.cutile import common

    batch, seqlen, nheads, headdim = x.shape
    ngroups, dstate = B.shape[2], B.shape[3]
    nchunks, chunk = dt.shape[2], dt.shape[3]
    bs = blocks(chunk, headdim, dstate, config)[0]
    tiles, dev, f32 = chunk // bs, x.device, torch.float32
    storage, transposed = state_storage(states)
    dx = torch.empty(x.shape, dtype=x.dtype, device=dev)
    dz = torch.empty(z.shape, dtype=z.dtype, device=dev) if z is not None else None
    ddt = torch.empty((batch, nheads, nchunks, chunk), dtype=f32, device=dev)
    dl = torch.empty((batch, nheads, nchunks, chunk), dtype=f32, device=dev)
    row = torch.empty((batch, nheads, nchunks, tiles, chunk), dtype=f32, device=dev)
    dD = torch.empty((batch, nchunks, tiles, nheads, headdim), dtype=f32, device=dev) if D is not None else None
    d_mode = 0 if D is None else D.dim()
    arrays = (x, B, C, dt, dA_cumsum, or_stand_in(seq_idx, dev, torch.int32, 2), storage, ds, dy,
              or_stand_in(z, dev, dy.dtype, 4), or_stand_in(yhat, dev, dy.dtype, 4), or_stand_in(D, dev, f32, 1),
              or_stand_in(extra_dx, dev, f32, 4), dx, or_stand_in(dz, dev, dy.dtype, 4), ddt, dl, row,
              or_stand_in(dD, dev, f32, 5), or_stand_in(cb, dev, f32, 5))
    flags = {"seq": seq_idx is not None, "z": z is not None, "xv": extra_dx is not None}
    call = make_call(arrays, (batch, seqlen, nheads, headdim, ngroups, dstate), chunk, flags, d_mode, transposed, tf32,
                     sw, config)
    (submit or common.launch)(call)
    return dx, dz, ddt, dl, row, dD


CB_TILE = 64  # cb_kernel's (rows, sources) tile for the backward's shared C·Bᵀ (at most the chunk)


def shared_cb(C, B, chunk: int, *, sw, tf32: bool) -> torch.Tensor | None:
    """Switch bwd_cb='shared': C·Bᵀ once per (batch, chunk, group), (batch, nchunks, ngroups, chunk, chunk) fp32
    contiguous, by the forward's cb_kernel over the tiles on or below the diagonal (whatever switch
    cb_lower_triangle says: the chunk kernel keeps source <= row only, all inside them), launched here; None with
    bwd_cb='inline'."""
    from impls.cutile import common
    from impls.cutile.compute_out import cb_launch

    if sw.bwd_cb != "shared":
        return None
    cb, call = cb_launch(C, B, chunk, tf32, sw, {"block_rows": min(CB_TILE, chunk)}, lower=True)
    common.launch(call)
    return cb
