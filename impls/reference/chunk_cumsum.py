"""Stage 1, reference: dt pre-processing and the cumulative decay inside each chunk."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from impls.reference.common import acc_dtype, chunked

SOFTPLUS_THRESHOLD = 20.0  # above it softplus(v) == v to within fp32 rounding (upstream uses the same cut)


def process_dt(dt, dt_bias=None, dt_softplus=False, dt_limit=(0.0, math.inf), dtype=None, softplus=F.softplus):
    """dt + dt_bias, softplus if asked (`softplus`: torch's, accurate to the last bit), clamped to dt_limit unless it
    is the default (0, inf)."""
    dtype = dtype or acc_dtype(dt)
    dt = dt.to(dtype)
    if dt_bias is not None:
        dt = dt + dt_bias.to(dtype)
    if dt_softplus:
        dt = torch.where(dt <= SOFTPLUS_THRESHOLD, softplus(dt), dt)
    if tuple(dt_limit) != (0.0, math.inf):
        # bounds past the dtype's range (dt_limit = (0, 1e40) on fp32) would overflow clamp's scalars: the largest
        # finite value bounds the same finite dt
        top = torch.finfo(dtype).max
        dt = dt.clamp(min=min(dt_limit[0], top), max=min(dt_limit[1], top))
    return dt


def chunk_cumsum(dt, A, chunk_size, dt_bias=None, dt_softplus=False, dt_limit=(0.0, math.inf), softplus=F.softplus):
    dtype = acc_dtype(dt, A)
    dt = process_dt(dt, dt_bias, dt_softplus, dt_limit, dtype, softplus)
    # (batch, nchunks, chunk, nheads) -> (batch, nheads, nchunks, chunk); padded positions carry dt = 0
    dt = chunked(dt, chunk_size).permute(0, 3, 1, 2).contiguous()
    dA_cumsum = torch.cumsum(dt * A.to(dtype)[None, :, None, None], dim=-1)
    return dt, dA_cumsum
