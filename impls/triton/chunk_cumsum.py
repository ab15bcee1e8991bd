"""Stage 1, Triton: dt pre-processing (bias, softplus, clamp) and the cumulative decay dA inside each chunk.

One program per (chunk, batch, block of heads) holds a (heads x chunk) tile; the cumulative sum runs along the
chunk axis with tl.cumsum. Outputs are fp32 (batch, nheads, nchunks, chunk), contiguous; positions past seqlen
carry dt = 0 (so dA_cumsum stays flat there), as the contract says.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from impls.triton import launcher
from impls.triton.grid import cdiv

# Constants are spelled out inside the kernels (log2 e = 1.4426950408889634, ln 2 = 0.6931471805599453, the
# softplus threshold 20, above which softplus(v) == v in fp32 -- the reference's cut).


@triton.jit
def ex2(v, FTZ: tl.constexpr):
    """2^v of fp32 v: tl.exp2, which Triton lowers to ex2.approx.ftz.f32 (subnormal inputs and results flushed to
    zero), or with FTZ off (switch exp2_ftz) ex2.approx.f32 through inline PTX, which keeps subnormals; the
    interpreter runs no PTX (the backend refuses FTZ off there)."""
    if FTZ:
        return tl.exp2(v)
    else:
        return tl.inline_asm_elementwise("ex2.approx.f32 $0, $1;", "=r,r", [v], dtype=tl.float32, is_pure=True,
                                         pack=1)


@triton.jit
def _exp(v, EXP2: tl.constexpr, FTZ: tl.constexpr = True):
    if EXP2:
        return ex2(v * 1.4426950408889634, FTZ)
    else:
        return tl.exp(v)


@triton.jit
def _log(v, EXP2: tl.constexpr):
    if EXP2:
        return tl.log2(v) * 0.6931471805599453
    else:
        return tl.log(v)


@triton.jit
def _softplus(v, EXP2: tl.constexpr):
    # The one softplus form of both languages (impls/README.md, "softplus"): with e = exp(v), log(1 + e) as the
    # series e·(1 − e/2 + e²/3 − … − e⁷/8) for e < 1/8 (truncation ≤ e⁸/9 ≈ 7e-9 relative), else log(1 + e);
    # v itself above 20. A plain log(1 + e) loses ~1e-4 relative at the e ~ 1e-3 that typical dt produce.
    e = _exp(v, EXP2)
    s = tl.minimum(e, 0.125)  # the series' argument, kept small where the other branch is taken
    series = 1.0 + s * (-0.5 + s * (1.0 / 3 + s * (-0.25 + s * (0.2 + s * (-1.0 / 6 + s * (1.0 / 7 - s * 0.125))))))
    soft = tl.where(e < 0.125, s * series, _log(1.0 + e, EXP2))
    return tl.where(v <= 20.0, soft, v)


@triton.jit
def chunk_cumsum_kernel(
    dt_ptr, A_ptr, bias_ptr, dt_out_ptr, dA_ptr,
    seqlen, nheads, dt_min, dt_max,
    s_dt_b, s_dt_l, s_dt_h, s_A, s_bias,
    s_o_b, s_o_h, s_o_c,
    CHUNK: tl.constexpr, BLOCK_H: tl.constexpr,
    HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, HAS_LIMIT: tl.constexpr, EXP2: tl.constexpr,
):
    c = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    offs_h = tl.program_id(2) * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_l = tl.arange(0, CHUNK)
    start = c * CHUNK
    mask_h = offs_h < nheads
    valid = (start + offs_l) < seqlen
    dt_base = dt_ptr + b * s_dt_b + start.to(tl.int64) * s_dt_l
    dt = tl.load(dt_base + offs_h[:, None] * s_dt_h + offs_l[None, :] * s_dt_l,
                 mask=mask_h[:, None] & valid[None, :], other=0.0).to(tl.float32)
    if HAS_BIAS:
        dt += tl.load(bias_ptr + offs_h * s_bias, mask=mask_h, other=0.0).to(tl.float32)[:, None]
    if SOFTPLUS:
        dt = _softplus(dt, EXP2)
    if HAS_LIMIT:
        # a NaN dt stays NaN (as torch.clamp keeps it): on the GPU max/min return the operand that is not NaN
        dt = tl.where(dt == dt, tl.minimum(tl.maximum(dt, dt_min), dt_max), dt)
    dt = tl.where(mask_h[:, None] & valid[None, :], dt, 0.0)  # padding carries dt = 0 whatever bias/softplus give
    A = tl.load(A_ptr + offs_h * s_A, mask=mask_h, other=0.0).to(tl.float32)
    dA_cumsum = tl.cumsum(dt * A[:, None], axis=1)
    out = b * s_o_b + offs_h[:, None].to(tl.int64) * s_o_h + c.to(tl.int64) * s_o_c + offs_l[None, :]
    tl.store(dt_out_ptr + out, dt, mask=mask_h[:, None])
    tl.store(dA_ptr + out, dA_cumsum, mask=mask_h[:, None])


def chunk_cumsum(dt, A, chunk_size, dt_bias, dt_softplus, dt_limit, *, config, switches, empty):
    """-> (dt processed, dA_cumsum), each fp32 (batch, nheads, nchunks, chunk_size). `empty` allocates outputs."""
    batch, seqlen, nheads = dt.shape
    nchunks = math.ceil(seqlen / chunk_size)
    dt_out = empty((batch, nheads, nchunks, chunk_size), torch.float32, dt.device)
    dA_cumsum = empty((batch, nheads, nchunks, chunk_size), torch.float32, dt.device)
    has_limit = tuple(dt_limit) != (0.0, math.inf)
    bias = dt_bias if dt_bias is not None else A  # never read without HAS_BIAS; any pointer will do
    grid = (nchunks, batch, cdiv(nheads, config["block_heads"]))
    launcher.launch(
        chunk_cumsum_kernel, grid, dt, A, bias, dt_out, dA_cumsum,
        seqlen, nheads, float(dt_limit[0]), float(dt_limit[1]),
        dt.stride(0), dt.stride(1), dt.stride(2), A.stride(0), bias.stride(0),
        dt_out.stride(0), dt_out.stride(1), dt_out.stride(2),
        CHUNK=chunk_size, BLOCK_H=config["block_heads"],
        HAS_BIAS=dt_bias is not None, SOFTPLUS=bool(dt_softplus), HAS_LIMIT=has_limit, EXP2=switches.exp2,
        num_warps=config["num_warps"], path=switches.launch_path,
    )
    return dt_out, dA_cumsum
