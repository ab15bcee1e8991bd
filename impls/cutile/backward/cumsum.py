"""Backward stage in cuTile: chunk_cumsum's backward. One tile program per (batch·chunk, block of heads) gathers dΛ over
the chunk as a (heads, chunk) tile (the chunk kernel's own terms and its row-sum partials, the state pass's dΛ_last
partials and, with switch bwd_entry_term away from 'chunk', the entering-state term's partials), takes its reverse
cumsum (da), and goes back through dt's processing: ddt = (ddt's other part + A·da) through the clamp and softplus, with
per-chunk partials of dA = Σ dt·da and of ddt_bias (impls/README.md, "The chunked backward", step 5). Positions past
the end of a short last chunk are masked here, so the chunk kernel need not write them."""

from __future__ import annotations

import math

import cuda.tile as ct
import torch

from impls.cutile.backward.common import Hints, chunk_length, kernel_call, or_stand_in
from impls.cutile.chunk_cumsum import SOFTPLUS_THRESHOLD, _softplus, block_heads
from impls.cutile.common import KernelCall, next_pow2

ZERO = ct.PaddingMode.ZERO


def _heads_by_position(t, b, hb, c, BH, CHUNK, k):
    """The (BH, CHUNK) tile of heads hb·BH … of chunk c of a (batch, heads, nchunks, chunk) fp32 tensor."""
    return ct.load(t, (b, hb, c, 0), (1, BH, 1, CHUNK), padding_mode=ZERO, allow_tma=k.tma()).reshape((BH, CHUNK))


def bwd_cumsum_kernel(raw, bias, A, dt, dl, ddt1, row, lasts, dlv, ddtv, ddt, dA_part, bias_part, enter, seqlen, lo,
                      hi, CHUNK: ct.Constant[int], BH: ct.Constant[int], ROW_TILE: ct.Constant[int],
                      LAST_TILES: ct.Constant[int], HAS_BIAS: ct.Constant[bool], SOFTPLUS: ct.Constant[bool],
                      HAS_LIMIT: ct.Constant[bool], HAS_V: ct.Constant[bool], EXP2: ct.Constant[bool],
                      TMA: ct.Constant[bool], FTZ: ct.Constant[bool], ENTER_TILES: ct.Constant[int]):
    """ddt (b, seqlen, h) in raw dt's dtype; dA_part, bias_part (b, h, nchunks) fp32. row holds CHUNK / ROW_TILE
    partials per position (the chunk kernel's source tiles), lasts LAST_TILES (a power of two at least the state
    pass's tiles, padded with zeros); enter ENTER_TILES partials per position (the state pass's tiles, or 1 from the
    dcb kernel; 0: none, the chunk kernel's dl holds that term)."""
    k = Hints(TMA, 0, EXP2, False, FTZ)
    bc, hb = ct.bid(0), ct.bid(1)
    nchunks = dt.shape[2]
    b, c = bc // nchunks, bc % nchunks
    pos = ct.arange(CHUNK, dtype=ct.int32).reshape((1, CHUNK))
    valid = pos < chunk_length(seqlen, c, CHUNK)
    # dΛ: the chunk kernel's own terms and row-sum partials (rows at or after each source tile's start), unwritten
    # past the chunk's end
    dlt = ct.where(valid, _heads_by_position(dl, b, hb, c, BH, CHUNK, k), 0.0)
    for t in range(CHUNK // ROW_TILE):
        part = ct.load(row, (b, hb, c, t, 0), (1, BH, 1, 1, CHUNK), padding_mode=ZERO, allow_tma=k.tma())
        dlt = dlt + ct.where(valid & (pos >= t * ROW_TILE), part.reshape((BH, CHUNK)), 0.0)
    for t in range(ENTER_TILES):  # switch bwd_entry_term away from 'chunk': the entering state's term
        part = ct.load(enter, (b, hb, c, t, 0), (1, BH, 1, 1, CHUNK), padding_mode=ZERO, allow_tma=k.tma())
        dlt = dlt + ct.where(valid, part.reshape((BH, CHUNK)), 0.0)
    # dΛ_last's carried part d_c ⟨R, S_c⟩, one partial per state tile of the state pass (its local part came with
    # the row partials)
    last = ct.load(lasts, (b, hb, c, 0), (1, BH, 1, LAST_TILES), padding_mode=ZERO, allow_tma=k.tma())
    dlt = dlt + ct.where(pos == CHUNK - 1, ct.sum(last.reshape((BH, LAST_TILES)), axis=1).reshape((BH, 1)), 0.0)
    ddt_t = ct.where(valid, _heads_by_position(ddt1, b, hb, c, BH, CHUNK, k), 0.0)
    if HAS_V:  # the per-sequence states' gradient (cu_seqlens), from autograd
        dlt = dlt + _heads_by_position(dlv, b, hb, c, BH, CHUNK, k)
        ddt_t = ddt_t + _heads_by_position(ddtv, b, hb, c, BH, CHUNK, k)
    da = ct.cumsum(dlt, axis=1, reverse=True)  # Λ_l = Σ_{s ≤ l} dt_s A: da_s = Σ_{l ≥ s} dΛ_l
    a = ct.load(A, (hb,), (BH,), padding_mode=ZERO, allow_tma=k.tma()).astype(ct.float32).reshape((BH, 1))
    ddt_t = ddt_t + a * da
    dt_t = _heads_by_position(dt, b, hb, c, BH, CHUNK, k)
    ct.store(dA_part, (b, hb, c), ct.sum(dt_t * da, axis=1).reshape((1, BH, 1)))
    # dt's processing, backwards: dt = clamp(softplus(v)), v = dt_raw + dt_bias
    v = ct.load(raw, (b, c, hb), (1, CHUNK, BH), padding_mode=ZERO, allow_tma=k.tma()).reshape((CHUNK, BH))
    v = ct.transpose(v.astype(ct.float32))
    if HAS_BIAS:
        v = v + ct.load(bias, (hb,), (BH,), padding_mode=ZERO, allow_tma=k.tma()).astype(ct.float32).reshape((BH, 1))
    pre = v
    gate = ct.full((BH, CHUNK), 1.0, ct.float32)
    if SOFTPLUS:
        pre = _softplus(v, EXP2)
        gate = ct.where(v <= SOFTPLUS_THRESHOLD, 1.0 / (1.0 + k.exp(-v * k.base())), 1.0)
    if HAS_LIMIT:  # torch.clamp's gradient: through where the value lies within the bounds, bounds included
        gate = ct.where((pre >= lo) & (pre <= hi), gate, 0.0)
    ddt_t = ct.where(valid, ddt_t * gate, 0.0)
    ct.store(ddt, (b, c, hb), ct.transpose(ddt_t).astype(ddt.dtype).reshape((1, CHUNK, BH)), allow_tma=k.tma())
    ct.store(bias_part, (b, hb, c), ct.sum(ddt_t, axis=1).reshape((1, BH, 1)))


def make_call(arrays, dims, chunk_size: int, flags: dict, dt_limit, row_tile: int, last_tiles: int, sw,
              config, enter_tiles: int = 0) -> KernelCall:
    """arrays = (raw dt, dt_bias, A, dt, dl, ddt1, row, lasts, dlv, ddtv, ddt, dA_part, bias_part, enter): tensors,
    or ArraySpec for AOT compiles; flags: bias, softplus, v (the per-sequence states' extra terms); enter_tiles: the
    entering-state term's partials per position (0 without them)."""
    batch, seqlen, nheads = dims
    nchunks = math.ceil(seqlen / chunk_size)
    bh = block_heads(nheads, config)
    has_limit = tuple(dt_limit) != (0.0, math.inf)
    # an infinite upper limit is passed as the largest fp32 (the kernel takes fp32 scalars), as stage 1 does
    lo, hi = (float(dt_limit[0]), float(min(dt_limit[1], 3.0e38))) if has_limit else (0.0, 0.0)
    args = (*arrays, seqlen, lo, hi, chunk_size, bh, row_tile, next_pow2(last_tiles), bool(flags["bias"]),
            bool(flags["softplus"]), has_limit, bool(flags["v"]), sw.exp2, sw.tma, sw.bwd_exp2_ftz, int(enter_tiles))
    grid = (batch * nchunks, math.ceil(nheads / bh), 1)
    return kernel_call(bwd_cumsum_kernel, grid, args, config, sw.opt_level)


def cumsum_grads(dt_raw, A, dt_bias, dt_softplus, dt_limit, dt, dl, ddt1, row, row_tile: int, lasts, extra_dl,
                 extra_ddt, enter=None, *, sw, config, submit=None):
    """-> (ddt in dt_raw's dtype (batch, seqlen, nheads), dA partials, ddt_bias partials (both fp32 (batch,
    nheads, nchunks))). `enter`: the entering-state term's partials from the state pass or the dcb kernel (switch
    bwd_entry_term 'state_pass', 'dcb') or None."""
    from impls.cutile import common

    batch, seqlen, nheads = dt_raw.shape
    nchunks, chunk = dt.shape[2], dt.shape[3]
    dev, f32 = dt_raw.device, torch.float32
    ddt = torch.empty(dt_raw.shape, dtype=dt_raw.dtype, device=dev)
    dA_part = torch.empty((batch, nheads, nchunks), dtype=f32, device=dev)
    bias_part = torch.empty((batch, nheads, nchunks), dtype=f32, device=dev)
    arrays = (dt_raw, or_stand_in(dt_bias, dev, f32, 1), A, dt, dl, ddt1, row, lasts,
              or_stand_in(extra_dl, dev, f32, 4), or_stand_in(extra_ddt, dev, f32, 4), ddt, dA_part, bias_part,
              or_stand_in(enter, dev, f32, 5))
    flags = {"bias": dt_bias is not None, "softplus": dt_softplus, "v": extra_dl is not None}
    call = make_call(arrays, (batch, seqlen, nheads), chunk, flags, dt_limit, row_tile, lasts.shape[3], sw, config,
                     0 if enter is None else enter.shape[3])
    (submit or common.launch)(call)
    return ddt, dA_part, bias_part
