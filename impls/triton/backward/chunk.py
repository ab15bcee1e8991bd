"""Backward stage: the per-head chunk kernel. One program per (source tile, head, chunk, batch) owns the gradients
of its BLOCK_S source positions s (impls/README.md, "The chunked backward", step 3): dx_s, the part of ddt_s that
does not go through Λ, dΛ_s's own terms, dz_s and its tile's share of dD; walking the row tiles l ≥ s of the chunk
it forms G = C_l B_sᵀ, dM = dŷ_l x_sᵀ and M = G ∘ L ∘ dt_s (three tl.dot per row tile, with dx_s += Mᵀ dŷ_l) and
writes the row sums of T = dM ∘ M, which its rows' owners do not see, as one partial per source tile. G depends on
the group only: switch bwd_cb='shared' forms it once per (batch, chunk, group) with the forward's cb_kernel
(impls/triton/compute_out.py, the tiles on or below the diagonal) and every head's programs load its causal
elements instead of the tl.dot (two tl.dot per row tile)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from impls.triton import launcher
from impls.triton.backward.common import chunk_program, decay, gated_dy, log_decay, log_decay_at, rows, sequence_ends
from impls.triton.clamp import pow2_at_least_16
from impls.triton.compute_out import cb_matrix


@triton.jit
def bwd_chunk_kernel(
    x_ptr, B_ptr, C_ptr, dt_ptr, dA_ptr, seq_ptr, st_ptr, ds_ptr, dy_ptr, z_ptr, yh_ptr, D_ptr, xv_ptr,
    dx_ptr, dz_ptr, ddt_ptr, dl_ptr, row_ptr, dD_ptr, cb_ptr,
    seqlen, nheads, nchunks, headdim, dstate, heads_per_group,
    s_x_b, s_x_l, s_x_h, s_x_p,
    s_B_b, s_B_l, s_B_g, s_B_n,
    s_C_b, s_C_l, s_C_g, s_C_n,
    s_dt_b, s_dt_h, s_dt_c, s_dt_l,
    s_dA_b, s_dA_h, s_dA_c, s_dA_l,
    s_seq_b, s_seq_l,
    s_st_b, s_st_c, s_st_h, s_st_p, s_st_n,
    s_ds_b, s_ds_c, s_ds_h, s_ds_p, s_ds_n,
    s_dy_b, s_dy_l, s_dy_h, s_dy_p,
    s_z_b, s_z_l, s_z_h, s_z_p,
    s_yh_b, s_yh_l, s_yh_h, s_yh_p,
    s_D_h, s_D_p,
    s_xv_b, s_xv_l, s_xv_h, s_xv_p,
    s_dx_b, s_dx_l, s_dx_h, s_dx_p,
    s_q_b, s_q_h, s_q_c,
    s_r_b, s_r_h, s_r_c, s_r_t,
    s_dD_b, s_dD_c, s_dD_t, s_dD_h,
    CHUNK: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr, HAS_SEQ: tl.constexpr, HAS_Z: tl.constexpr, HAS_D: tl.constexpr, HAS_XV: tl.constexpr,
    EXP2: tl.constexpr, DOT_PRECISION: tl.constexpr, SHARED_CB: tl.constexpr, DECAY_FACTOR: tl.constexpr,
    ENTER_TERM: tl.constexpr,
):
    # flat grid: source tile fastest, then head, chunk, batch
    TILES: tl.constexpr = CHUNK // BLOCK_S
    t, h, b, c, start, chunk_len = chunk_program(tl.program_id(0), nheads, nchunks, seqlen, TILES, CHUNK)
    g = h // heads_per_group
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
    # 64-bit bases: position·stride passes 2^31 at a million tokens
    x_c = x_ptr + b * s_x_b + start64 * s_x_l + h * s_x_h
    B_c = B_ptr + b * s_B_b + start64 * s_B_l + g * s_B_g
    C_c = C_ptr + b * s_C_b + start64 * s_C_l + g * s_C_g
    dy_c = dy_ptr + b * s_dy_b + start64 * s_dy_l + h * s_dy_h
    z_c = z_ptr + b * s_z_b + start64 * s_z_l + h * s_z_h
    dt_c = dt_ptr + b * s_dt_b + h * s_dt_h + c64 * s_dt_c
    dA_c = dA_ptr + b * s_dA_b + h * s_dA_h + c64 * s_dA_c
    seq_b = seq_ptr + b * s_seq_b
    seq_last, seq_before = sequence_ends(seq_b, start, chunk_len, s_seq_l, HAS_SEQ)

    dA_s = log_decay(dA_c + offs_s * s_dA_l, mask_s, EXP2)
    dA_last = log_decay_at(dA_c + (CHUNK - 1) * s_dA_l, EXP2)
    dt_s = tl.load(dt_c + offs_s * s_dt_l, mask=mask_s, other=0.0).to(tl.float32)
    x_s = rows(x_c, offs_s, offs_p, mask_s, mask_p, s_x_l, s_x_p).to(dtype)
    B_s = rows(B_c, offs_s, offs_n, mask_s, mask_n, s_B_l, s_B_n).to(dtype)
    dyh_s = gated_dy(dy_c, z_c, offs_s, offs_p, mask_s, mask_p, s_dy_l, s_dy_p, s_z_l, s_z_p, HAS_Z)
    own = mask_s  # the tokens the chunk's local state counts: those of the sequence at its last token
    enter = mask_s  # the tokens that read the entering state: those of the sequence active before the chunk
    seq_s = offs_s
    if HAS_SEQ:
        seq_s = tl.load(seq_b + (start64 + offs_s) * s_seq_l, mask=mask_s, other=0)
        own = own & (seq_s == seq_last)
        enter = enter & (seq_s == seq_before)

    # the chunk's local state S^loc = Σ_s w_s x_s B_sᵀ, whose gradient R the reverse state pass stored
    R = tl.load(ds_ptr + b * s_ds_b + c64 * s_ds_c + h * s_ds_h + offs_p[:, None] * s_ds_p + offs_n[None, :] * s_ds_n,
                mask=mask_p[:, None] & mask_n[None, :], other=0.0).to(dtype)
    V = tl.dot(B_s, tl.trans(R), input_precision=DOT_PRECISION)  # (s, headdim): R B_s per source
    to_last = tl.where(own, decay(dA_last - dA_s, EXP2), 0.0)
    w = to_last * dt_s
    dx = w[:, None] * V
    dw = tl.sum(x_s.to(tl.float32) * V, axis=1)
    ddt = to_last * dw
    dl = -w * dw
    local = tl.sum(w * dw, axis=0)  # its sum goes to Λ_last (a row partial below): the pair cancels exactly
    if ENTER_TERM:  # the entering state's term of y_s: dΛ_s += e^{Λ_s} dŷ_s · (S_c C_s) (else another kernel's)
        C_s = rows(C_c, offs_s, offs_n, mask_s, mask_n, s_C_l, s_C_n).to(dtype)
        S = tl.load(st_ptr + b * s_st_b + c64 * s_st_c + h * s_st_h + offs_p[:, None] * s_st_p
                    + offs_n[None, :] * s_st_n, mask=mask_p[:, None] & mask_n[None, :], other=0.0).to(dtype)
        CS = tl.dot(C_s, tl.trans(S), input_precision=DOT_PRECISION)  # (s, headdim)
        dl += tl.where(enter, decay(dA_s, EXP2), 0.0) * tl.sum(dyh_s * CS, axis=1)
    out = b * s_dx_b + (start64 + offs_s[:, None]) * s_dx_l + h * s_dx_h + offs_p[None, :] * s_dx_p
    mask_sp = mask_s[:, None] & mask_p[None, :]
    if HAS_Z:  # y = ŷ ⊙ silu(z): dz = dy ⊙ ŷ ⊙ σ(z)(1 + z(1 − σ(z)))
        z = rows(z_c, offs_s, offs_p, mask_s, mask_p, s_z_l, s_z_p).to(tl.float32)
        yh = rows(yh_ptr + b * s_yh_b + start64 * s_yh_l + h * s_yh_h, offs_s, offs_p, mask_s, mask_p, s_yh_l,
                  s_yh_p).to(tl.float32)
        dy = rows(dy_c, offs_s, offs_p, mask_s, mask_p, s_dy_l, s_dy_p).to(tl.float32)
        sig = tl.sigmoid(z)
        tl.store(dz_ptr + out, (dy * yh * sig * (1.0 + z * (1.0 - sig))).to(dz_ptr.dtype.element_ty), mask=mask_sp)
    if HAS_D:  # a per-head D is read with a zero headdim stride
        Dv = tl.load(D_ptr + h * s_D_h + offs_p * s_D_p, mask=mask_p, other=0.0).to(tl.float32)
        dx += Dv[None, :] * dyh_s
        tl.store(dD_ptr + b * s_dD_b + c64 * s_dD_c + t * s_dD_t + h * s_dD_h + offs_p,
                 tl.sum(dyh_s * x_s.to(tl.float32), axis=0), mask=mask_p)

    # the intra-chunk scores, row tiles l >= s
    # U_s = Σ_l dM_ls G_ls L_ls (T's column sums Σ_l T_ls are dt_s U_s), kept as the (rows × sources) tile of its
    # terms and summed over the rows once after the walk: a sum across the warps per row tile fewer
    U_terms = tl.zeros((BLOCK_L, BLOCK_S), dtype=tl.float32)
    if DECAY_FACTOR:  # switch bwd_decay_factor: below the diagonal L = e^{Λ_l − Λ_s} factored at the tile's last source
        # p: e_src_s = e^{Λ_p − Λ_s} once per program, e^{Λ_l − Λ_p} once per row of each row tile
        dA_pivot = log_decay_at(dA_c + (s0 + BLOCK_S - 1) * s_dA_l, EXP2)
        e_src = decay(dA_pivot - dA_s, EXP2)
    row_c = row_ptr + b * s_r_b + h * s_r_h + c64 * s_r_c + t * s_r_t
    if SHARED_CB:  # the group's (chunk, chunk) C·Bᵀ, contiguous (batch, nchunks, ngroups, chunk, chunk) fp32
        cb_c = cb_ptr + ((b * nchunks + c64) * (nheads // heads_per_group) + g) * (CHUNK * CHUNK)
    for l0 in range((s0 // BLOCK_L) * BLOCK_L, chunk_len, BLOCK_L):
        offs_l = l0 + tl.arange(0, BLOCK_L)
        mask_l = offs_l < chunk_len
        if not SHARED_CB:
            C_l = rows(C_c, offs_l, offs_n, mask_l, mask_n, s_C_l, s_C_n).to(dtype)
        dyh_l = gated_dy(dy_c, z_c, offs_l, offs_p, mask_l, mask_p, s_dy_l, s_dy_p, s_z_l, s_z_p, HAS_Z).to(dtype)
        dA_l = log_decay(dA_c + offs_l * s_dA_l, mask_l, EXP2)
        diff = dA_l[:, None] - dA_s[None, :]
        if not SHARED_CB:
            G = tl.dot(C_l, tl.trans(B_s), input_precision=DOT_PRECISION)  # (l, s)
        # below the diagonal, inside the chunk and of one sequence, every pair is causal: no mask to form
        inside = (l0 >= s0 + BLOCK_S) & (l0 + BLOCK_L <= chunk_len) & (s0 + BLOCK_S <= chunk_len)
        if HAS_SEQ or not inside:
            keep = (offs_l[:, None] >= offs_s[None, :]) & mask_l[:, None] & mask_s[None, :]
            if HAS_SEQ:
                seq_l = tl.load(seq_b + (start64 + offs_l) * s_seq_l, mask=mask_l, other=0)
                keep = keep & (seq_l[:, None] == seq_s[None, :])
            L = decay(tl.where(keep, diff, float("-inf")), EXP2)
            if SHARED_CB:  # its causal elements only: the tiles above the diagonal are not written
                G = tl.load(cb_c + offs_l[:, None] * CHUNK + offs_s[None, :], mask=keep, other=0.0)  # (l, s)
        else:
            if DECAY_FACTOR:  # L_ls = e_row_l · e_src_s, both factors ≤ 1: an exponential per row, not per pair
                L = decay(dA_l - dA_pivot, EXP2)[:, None] * e_src[None, :]
            else:
                L = decay(diff, EXP2)
            if SHARED_CB:
                G = tl.load(cb_c + offs_l[:, None] * CHUNK + offs_s[None, :])  # (l, s)
        dM = tl.dot(dyh_l, tl.trans(x_s), input_precision=DOT_PRECISION)  # (l, s)
        GL = G * L
        M = GL * dt_s[None, :]
        dx = tl.dot(tl.trans(M.to(dtype)), dyh_l, dx, input_precision=DOT_PRECISION)  # (s, headdim)
        U_terms += dM * GL
        T = dM * M
        # dΛ_last's local part: + Σ_s w_s x_s·V_s, the same fp32 terms dl takes from the sources
        tl.store(row_c + offs_l, tl.sum(T, axis=1) + tl.where(offs_l == chunk_len - 1, local, 0.0), mask=mask_l)
    U = tl.sum(U_terms, axis=0)
    ddt += U
    dl -= dt_s * U
    if HAS_XV:  # the per-sequence states' gradient (cu_seqlens), from autograd
        dx += rows(xv_ptr + b * s_xv_b + start64 * s_xv_l + h * s_xv_h, offs_s, offs_p, mask_s, mask_p, s_xv_l,
                   s_xv_p).to(tl.float32)
    tl.store(dx_ptr + out, dx.to(dx_ptr.dtype.element_ty), mask=mask_sp)
    # every position of the tile, padding too (zero there: the reverse cumsum runs over the whole chunk)
    q = b * s_q_b + h * s_q_h + c64 * s_q_c + offs_s
    tl.store(ddt_ptr + q, ddt)
    tl.store(dl_ptr + q, dl)


def chunk_grads(x, B, C, dt, dA_cumsum, seq_idx, states, ds, dy, z, yhat, D, extra_dx, cb, *, config, switches,
                empty, dot_precision):
    """-> (dx in x's dtype, dz in z's dtype or None, ddt's part outside Λ, dΛ's own terms (both fp32 (batch,
    nheads, nchunks, chunk)), T's row-sum partials (batch, nheads, nchunks, source tiles, chunk) fp32, dD partials
    (batch, nchunks, source tiles, nheads, headdim) fp32 or None). `cb`: None (G formed per head), or the groups'
    C·Bᵀ from `shared_cb` (switch bwd_cb='shared')."""
    batch, seqlen, nheads, headdim = x.shape
    ngroups, dstate = B.shape[2], B.shape[3]
    nchunks, chunk = dt.shape[2], dt.shape[3]
    block_s = config["block_sources"]
    tiles = chunk // block_s
    dx = empty((batch, seqlen, nheads, headdim), x.dtype, x.device)
    dz = empty((batch, seqlen, nheads, headdim), z.dtype, x.device) if z is not None else dx
    ddt = empty((batch, nheads, nchunks, chunk), torch.float32, x.device)
    dl = empty((batch, nheads, nchunks, chunk), torch.float32, x.device)
    row = empty((batch, nheads, nchunks, tiles, chunk), torch.float32, x.device)
    dD = empty((batch, nchunks, tiles, nheads, headdim), torch.float32, x.device) if D is not None else ddt
    seq = seq_idx if seq_idx is not None else dt  # never read without HAS_SEQ
    zz, yh = (z, yhat) if z is not None else (dy, dy)  # never read without HAS_Z
    D_arg = D if D is not None else dt  # never read without HAS_D
    D_strides = (D.stride(0), D.stride(1) if D.dim() == 2 else 0) if D is not None else (0, 0)
    xv = extra_dx if extra_dx is not None else x  # never read without HAS_XV
    launcher.launch(
        bwd_chunk_kernel, (tiles * nheads * nchunks * batch,), x, B, C, dt, dA_cumsum, seq, states, ds, dy, zz, yh,
        D_arg, xv, dx, dz, ddt, dl, row, dD, cb,
        seqlen, nheads, nchunks, headdim, dstate, nheads // ngroups,
        *x.stride(), *B.stride(), *C.stride(), *dt.stride(), *dA_cumsum.stride(), seq.stride(0), seq.stride(1),
        *states.stride(), *ds.stride(), *dy.stride(), *zz.stride(), *yh.stride(), *D_strides, *xv.stride(),
        *dx.stride(), *ddt.stride()[:3], *row.stride()[:4], *dD.stride()[:4],
        CHUNK=chunk, BLOCK_S=block_s, BLOCK_L=config["block_rows"], BLOCK_P=pow2_at_least_16(headdim),
        BLOCK_N=pow2_at_least_16(dstate),
        HAS_SEQ=seq_idx is not None, HAS_Z=z is not None, HAS_D=D is not None, HAS_XV=extra_dx is not None,
        EXP2=switches.exp2, DOT_PRECISION=dot_precision, SHARED_CB=cb is not None,
        DECAY_FACTOR=switches.bwd_decay_factor, ENTER_TERM=switches.bwd_entry_term == "chunk",
        num_warps=config["num_warps"], num_stages=config["num_stages"], path=switches.launch_path,
    )
    return dx, (dz if z is not None else None), ddt, dl, row, (dD if D is not None else None)


def shared_cb(C, B, chunk, *, switches, empty, dot_precision):
    """Switch bwd_cb='shared': C·Bᵀ once per (batch, chunk, group), (batch, nchunks, ngroups, chunk, chunk) fp32
    contiguous, by the forward's cb_kernel over the tiles on or below the diagonal (the chunk kernel loads only
    source <= row, all inside them); None with bwd_cb='inline'."""
    if switches.bwd_cb != "shared":
        return None
    return cb_matrix(C, B, chunk, empty, dot_precision, switches.launch_path, lower=True)
