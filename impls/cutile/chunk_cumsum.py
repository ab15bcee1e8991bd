"""Stage 1 in cuTile: dt pre-processing (bias, softplus, clamp) and the cumulative decay inside each chunk.

One tile = one chunk × a block of heads, read straight from dt's (batch, seqlen, nheads) layout; the scan runs
along the chunk axis and the tile is written transposed into the (batch, nheads, nchunks, chunk) outputs. The
block of heads (`block_heads`) sets how many tiles there are: small blocks give the memory system enough tiles in
flight (batch × nchunks × nheads / block_heads of them).
"""

from __future__ import annotations

import math

import cuda.tile as ct
import torch

from impls.cutile.common import LN2, LOG2E, KernelCall, kernel_call, next_pow2

SOFTPLUS_THRESHOLD = 20.0  # as the reference: above it softplus(v) == v


def _softplus(v, EXP2):
    # The one softplus form of both languages (impls/README.md, "softplus"): with e = exp(v), log(1 + e) as the
    # series e·(1 − e/2 + e²/3 − … − e⁷/8) for e < 1/8 (truncation ≤ e⁸/9 ≈ 7e-9 relative), else log(1 + e);
    # v itself above 20. A plain log(1 + e) (or log2(1 + exp2(·))) loses ~1e-4 relative at e ~ 1e-3.
    e = ct.exp2(v * LOG2E) if EXP2 else ct.exp(v)
    s = ct.minimum(e, 0.125)  # the series' argument, kept small where the other branch is taken
    series = 1.0 + s * (-0.5 + s * (1.0 / 3 + s * (-0.25 + s * (0.2 + s * (-1.0 / 6 + s * (1.0 / 7 - s * 0.125))))))
    log_u = ct.log2(1.0 + e) * LN2 if EXP2 else ct.log(1.0 + e)
    soft = ct.where(e < 0.125, s * series, log_u)
    # where() selects, so an overflowing exp on the unused branch does no harm
    return ct.where(v <= SOFTPLUS_THRESHOLD, soft, v)


def chunk_cumsum_kernel(dt, A, dt_bias, dt_out, dA_out, seqlen, lo, hi,
                        CHUNK: ct.Constant[int], BH: ct.Constant[int], HAS_BIAS: ct.Constant[bool],
                        SOFTPLUS: ct.Constant[bool], HAS_LIMIT: ct.Constant[bool], EXP2: ct.Constant[bool],
                        TMA: ct.Constant[bool], LAT: ct.Constant[int], PDL: ct.Constant[bool]):
    if PDL:  # switch pdl: stage 2 may be scheduled now; it waits for this kernel's completion (impls/cutile/common.py)
        ct.grid_dependency_control_launch_dependents()
    bc, hb = ct.bid(0), ct.bid(1)
    nchunks = dt_out.shape[2]
    b, c = bc // nchunks, bc % nchunks
    tma = None if TMA else False
    lat = LAT if LAT > 0 else None
    v = ct.load(dt, (b, c, hb), (1, CHUNK, BH), padding_mode=ct.PaddingMode.ZERO, allow_tma=tma, latency=lat)
    v = v.reshape((CHUNK, BH)).astype(ct.float32)
    if HAS_BIAS:
        bias = ct.load(dt_bias, (hb,), (BH,), padding_mode=ct.PaddingMode.ZERO, allow_tma=tma).astype(ct.float32)
        v = v + bias.reshape((1, BH))
    if SOFTPLUS:
        v = _softplus(v, EXP2)
    if HAS_LIMIT:
        # a NaN dt stays NaN (as torch.clamp keeps it): the hardware's max/min return the operand that is not NaN
        v = ct.where(v == v, ct.minimum(ct.maximum(v, lo), hi), v)
    # positions past seqlen (the padded tail of the last chunk) carry dt = 0, so dA_cumsum stays flat there
    pos = c * CHUNK + ct.arange(CHUNK, dtype=ct.int32)
    v = ct.where(pos.reshape((CHUNK, 1)) < seqlen, v, 0.0)
    a = ct.load(A, (hb,), (BH,), padding_mode=ct.PaddingMode.ZERO, allow_tma=tma).astype(ct.float32)
    cs = ct.cumsum(v * a.reshape((1, BH)), axis=0)
    ct.store(dt_out, (b, hb, c, 0), ct.transpose(v).reshape((1, BH, 1, CHUNK)), allow_tma=tma)
    ct.store(dA_out, (b, hb, c, 0), ct.transpose(cs).reshape((1, BH, 1, CHUNK)), allow_tma=tma)


def block_heads(nheads: int, config: dict) -> int:
    return min(config.get("block_heads") or 16, next_pow2(nheads))


def make_call(arrays, dims, chunk_size: int, has_bias: bool, dt_softplus: bool, dt_limit, sw,
              config: dict) -> KernelCall:
    """arrays = (dt, A, dt_bias, dt_out, dA_out): tensors, or ArraySpec when compiling ahead of time."""
    batch, seqlen, nheads = dims
    nchunks = math.ceil(seqlen / chunk_size)
    bh = block_heads(nheads, config)
    has_limit = tuple(dt_limit) != (0.0, math.inf)
    # an infinite upper limit is passed as the largest fp32 (the kernel takes fp32 scalars)
    lo, hi = (float(dt_limit[0]), float(min(dt_limit[1], 3.0e38))) if has_limit else (0.0, 0.0)
    args = (*arrays, seqlen, lo, hi, chunk_size, bh, bool(has_bias), bool(dt_softplus), has_limit,
            sw.exp2, sw.tma, 4 if sw.latency_hints else 0, sw.pdl)
    grid = (batch * nchunks, math.ceil(nheads / bh), 1)
    return kernel_call(chunk_cumsum_kernel, grid, args, config.get("occupancy", 0), sw.opt_level)


def run(dt, A, chunk_size, dt_bias, dt_softplus, dt_limit, sw, config):
    from impls.cutile.common import dummy, launch

    batch, seqlen, nheads = dt.shape
    nchunks = math.ceil(seqlen / chunk_size)
    dt_out = torch.empty(batch, nheads, nchunks, chunk_size, device=dt.device, dtype=torch.float32)
    dA_out = torch.empty_like(dt_out)
    bias = dt_bias if dt_bias is not None else dummy(dt.device)
    launch(make_call((dt, A, bias, dt_out, dA_out), (batch, seqlen, nheads), chunk_size, dt_bias is not None,
                     dt_softplus, dt_limit, sw, config))
    return dt_out, dA_out
