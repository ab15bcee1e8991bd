"""Backward stage: chunk_cumsum's backward. One program per (chunk, batch, block of heads) gathers dΛ over the chunk
(the chunk kernel's own terms and its row-sum partials, the state pass's dΛ_last partials and, with switch
bwd_entry_term away from 'chunk', the entering-state term's partials), takes its reverse cumsum (da), and goes back
through dt's processing: ddt = (ddt's other part + A·da) through the clamp and softplus, with per-chunk partials of
dA = Σ dt·da and of ddt_bias (impls/README.md, "The chunked backward", step 5)."""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from impls.triton import launcher
from impls.triton.chunk_cumsum import _softplus
from impls.triton.grid import cdiv


@triton.jit
def bwd_cumsum_kernel(
    raw_ptr, bias_ptr, A_ptr, dt_ptr, dl_ptr, ddt1_ptr, row_ptr, last_ptr, dlv_ptr, ddtv_ptr,
    ddt_ptr, dA_part_ptr, bias_part_ptr, enter_ptr,
    seqlen, nheads, row_tiles, last_tiles, enter_tiles, dt_min, dt_max,
    s_raw_b, s_raw_l, s_raw_h, s_bias, s_A,
    s_dt_b, s_dt_h, s_dt_c, s_dt_l,
    s_q_b, s_q_h, s_q_c,
    s_r_b, s_r_h, s_r_c, s_r_t,
    s_la_b, s_la_h, s_la_c,
    s_dlv_b, s_dlv_h, s_dlv_c, s_dlv_l,
    s_dtv_b, s_dtv_h, s_dtv_c, s_dtv_l,
    s_o_b, s_o_l, s_o_h,
    s_p_b, s_p_h,
    s_en_b, s_en_h, s_en_c, s_en_t,
    CHUNK: tl.constexpr, BLOCK_H: tl.constexpr, ROW_TILE: tl.constexpr,
    HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, HAS_LIMIT: tl.constexpr, HAS_V: tl.constexpr,
    EXP2: tl.constexpr,
):
    c = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    offs_h = tl.program_id(2) * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_l = tl.arange(0, CHUNK)
    c64 = c.to(tl.int64)
    start = c * CHUNK
    chunk_len = tl.minimum(CHUNK, seqlen - start)
    mask_h = offs_h < nheads
    valid = offs_l < chunk_len
    h64 = offs_h.to(tl.int64)
    mask_hl = mask_h[:, None] & valid[None, :]
    q = b * s_q_b + h64[:, None] * s_q_h + c64 * s_q_c + offs_l[None, :]
    dl = tl.load(dl_ptr + q, mask=mask_h[:, None], other=0.0)
    ddt = tl.load(ddt1_ptr + q, mask=mask_h[:, None], other=0.0)
    # the row sums of T, one partial per source tile of the chunk kernel (rows at or after the tile's start)
    row_c = row_ptr + b * s_r_b + h64[:, None] * s_r_h + c64 * s_r_c + offs_l[None, :]
    for t in range(0, row_tiles):
        dl += tl.load(row_c + t * s_r_t, mask=mask_hl & (offs_l[None, :] >= t * ROW_TILE), other=0.0)
    # switch bwd_entry_term away from 'chunk': the entering state's term, per state tile or from dcb (0 tiles without)
    enter_c = enter_ptr + b * s_en_b + h64[:, None] * s_en_h + c64 * s_en_c + offs_l[None, :]
    for k in range(0, enter_tiles):
        dl += tl.load(enter_c + k * s_en_t, mask=mask_hl, other=0.0)
    # dΛ_last's carried part d_c ⟨R, S_c⟩, one partial per state tile of the state pass (its local part came with
    # the row partials)
    last = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for k in range(0, last_tiles):
        last += tl.load(last_ptr + b * s_la_b + h64 * s_la_h + c64 * s_la_c + k, mask=mask_h, other=0.0)
    dl += tl.where(offs_l[None, :] == CHUNK - 1, last[:, None], 0.0)
    if HAS_V:  # the per-sequence states' gradient (cu_seqlens), from autograd
        dl += tl.load(dlv_ptr + b * s_dlv_b + h64[:, None] * s_dlv_h + c64 * s_dlv_c + offs_l[None, :] * s_dlv_l,
                      mask=mask_h[:, None], other=0.0)
        ddt += tl.load(ddtv_ptr + b * s_dtv_b + h64[:, None] * s_dtv_h + c64 * s_dtv_c + offs_l[None, :] * s_dtv_l,
                       mask=mask_h[:, None], other=0.0)
    da = tl.cumsum(dl, axis=1, reverse=True)  # Λ_l = Σ_{s <= l} dt_s A: da_s = Σ_{l >= s} dΛ_l
    A = tl.load(A_ptr + offs_h * s_A, mask=mask_h, other=0.0).to(tl.float32)
    ddt = ddt + A[:, None] * da
    dt = tl.load(dt_ptr + b * s_dt_b + h64[:, None] * s_dt_h + c64 * s_dt_c + offs_l[None, :] * s_dt_l,
                 mask=mask_hl, other=0.0)
    part = b * s_p_b + h64 * s_p_h + c64
    tl.store(dA_part_ptr + part, tl.sum(dt * da, axis=1), mask=mask_h)
    # dt's processing, backwards: dt = clamp(softplus(v)), v = dt_raw + dt_bias
    raw = b * s_raw_b + (start + offs_l[None, :]).to(tl.int64) * s_raw_l + h64[:, None] * s_raw_h
    v = tl.load(raw_ptr + raw, mask=mask_hl, other=0.0).to(tl.float32)
    if HAS_BIAS:
        v += tl.load(bias_ptr + offs_h * s_bias, mask=mask_h, other=0.0).to(tl.float32)[:, None]
    pre = v
    gate = tl.full((BLOCK_H, CHUNK), 1.0, tl.float32)
    if SOFTPLUS:
        pre = _softplus(v, EXP2)
        gate = tl.where(v <= 20.0, tl.sigmoid(v), 1.0)
    if HAS_LIMIT:  # torch.clamp's gradient: through where the value lies within the bounds, bounds included
        gate = tl.where((pre >= dt_min) & (pre <= dt_max), gate, 0.0)
    ddt = tl.where(mask_hl, ddt * gate, 0.0)
    tl.store(ddt_ptr + b * s_o_b + (start + offs_l[None, :]).to(tl.int64) * s_o_l + h64[:, None] * s_o_h,
             ddt.to(ddt_ptr.dtype.element_ty), mask=mask_hl)
    tl.store(bias_part_ptr + part, tl.sum(ddt, axis=1), mask=mask_h)


def cumsum_grads(dt_raw, A, dt_bias, dt_softplus, dt_limit, dt, dl, ddt1, row, row_tile, lasts, extra_dl,
                 extra_ddt, enter=None, *, config, switches, empty):
    """-> (ddt in dt_raw's dtype (batch, seqlen, nheads), dA partials, ddt_bias partials (both fp32 (batch,
    nheads, nchunks))). `enter`: the entering-state term's partials from the state pass or the dcb kernel (switch
    bwd_entry_term 'state_pass', 'dcb') or None."""
    batch, seqlen, nheads = dt_raw.shape
    nchunks, chunk = dt.shape[2], dt.shape[3]
    ddt = empty((batch, seqlen, nheads), dt_raw.dtype, dt_raw.device)
    dA_part = empty((batch, nheads, nchunks), torch.float32, dt_raw.device)
    bias_part = empty((batch, nheads, nchunks), torch.float32, dt_raw.device)
    bias = dt_bias if dt_bias is not None else A  # never read without HAS_BIAS
    dlv = extra_dl if extra_dl is not None else dt  # never read without HAS_V
    dtv = extra_ddt if extra_ddt is not None else dt
    has_limit = tuple(dt_limit) != (0.0, math.inf)
    en = enter if enter is not None else row  # never read with no tiles
    block_h = config["block_heads"]
    launcher.launch(
        bwd_cumsum_kernel, (nchunks, batch, cdiv(nheads, block_h)), dt_raw, bias, A, dt, dl, ddt1, row, lasts, dlv,
        dtv, ddt, dA_part, bias_part, en,
        seqlen, nheads, row.shape[3], lasts.shape[3], 0 if enter is None else enter.shape[3], float(dt_limit[0]),
        float(dt_limit[1]),
        *dt_raw.stride(), bias.stride(0), A.stride(0), *dt.stride(), *dl.stride()[:3], *row.stride()[:4],
        *lasts.stride()[:3], *dlv.stride(), *dtv.stride(), *ddt.stride(), *dA_part.stride()[:2],
        *en.stride()[:4],
        CHUNK=chunk, BLOCK_H=block_h, ROW_TILE=row_tile, HAS_BIAS=dt_bias is not None, SOFTPLUS=bool(dt_softplus),
        HAS_LIMIT=has_limit, HAS_V=extra_dl is not None, EXP2=switches.exp2,
        num_warps=config["num_warps"], path=switches.launch_path,
    )
    return ddt, dA_part, bias_part
