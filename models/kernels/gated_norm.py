"""The layer's gated RMSNorm as Triton kernels (forward, backward) and their autograd Function.

Per row (a token) and group of G = d_inner / ngroups channels, with g = silu(z):

    norm_before_gate False (Mamba-2):  v = y · g,  out = v · r · w          r = (mean_G(v²) + eps)^(−1/2)
    norm_before_gate True:             v = y,      out = v · r · w · g

y, z (rows, d_inner) with any row stride (the layer's z is a view of in_proj's output), w (d_inner,). Forward: one
program per (row, group), the group's channels in one block, in fp32 (float64 for float64), one rounding to the
output (z's dtype); r kept per (row, group) for the backward. Backward, with n = v · r and dn = dout · w (· g when
norm_before_gate): dv = r · (dn − n · mean_G(dn · n)); then dy, dz by the chain rule through g (silu' (z) =
σ(z)(1 + z(1 − σ(z)))); dweight = Σ_rows dout · n (· g) accumulated per program over its rows and summed over the
programs in a fixed order (deterministic).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from models.kernels.common import acc_dtype, sum_partials, work_dtype


@triton.jit
def _row(ptr, row, offs, mask, s_r, s_c, ACC: tl.constexpr):
    return tl.load(ptr + tl.cast(row, tl.int64) * s_r + offs * s_c, mask=mask, other=0.0).to(ACC)


@triton.jit
def norm_fwd_kernel(
    y_ptr, z_ptr, w_ptr, out_ptr, rstd_ptr,
    group_size, eps,
    s_y_r, s_y_c, s_z_r, s_z_c, s_o_r, s_o_c,
    BLOCK_N: tl.constexpr, NORM_BEFORE_GATE: tl.constexpr, ACC: tl.constexpr,
):
    row = tl.program_id(0)
    group = tl.program_id(1)
    offs = group * group_size + tl.arange(0, BLOCK_N)
    mask = tl.arange(0, BLOCK_N) < group_size
    y = _row(y_ptr, row, offs, mask, s_y_r, s_y_c, ACC)
    z = _row(z_ptr, row, offs, mask, s_z_r, s_z_c, ACC)
    gate = z / (1.0 + tl.exp(-z))
    v = y
    if not NORM_BEFORE_GATE:
        v = y * gate
    rstd = 1.0 / tl.sqrt(tl.sum(v * v, axis=0) / group_size + eps)
    out = v * rstd * tl.load(w_ptr + offs, mask=mask, other=0.0).to(ACC)
    if NORM_BEFORE_GATE:
        out = out * gate
    tl.store(out_ptr + tl.cast(row, tl.int64) * s_o_r + offs * s_o_c, out.to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(rstd_ptr + row * tl.num_programs(1) + group, rstd)


@triton.jit
def norm_bwd_kernel(
    y_ptr, z_ptr, w_ptr, rstd_ptr, dout_ptr, dy_ptr, dz_ptr, dw_ptr,
    rows, group_size, rows_per_program,
    s_y_r, s_y_c, s_z_r, s_z_c, s_do_r, s_do_c, s_dy_r, s_dy_c, s_dz_r, s_dz_c,
    BLOCK_N: tl.constexpr, NORM_BEFORE_GATE: tl.constexpr, ACC: tl.constexpr,
):
    pid = tl.program_id(0)
    group = tl.program_id(1)
    ngroups = tl.num_programs(1)
    offs = group * group_size + tl.arange(0, BLOCK_N)
    mask = tl.arange(0, BLOCK_N) < group_size
    dw = tl.zeros((BLOCK_N,), dtype=ACC)
    first = pid * rows_per_program
    for row in range(first, tl.minimum(first + rows_per_program, rows)):
        w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(ACC)  # per row: a cache hit, fewer live registers
        y = _row(y_ptr, row, offs, mask, s_y_r, s_y_c, ACC)
        z = _row(z_ptr, row, offs, mask, s_z_r, s_z_c, ACC)
        dout = _row(dout_ptr, row, offs, mask, s_do_r, s_do_c, ACC)
        rstd = tl.load(rstd_ptr + row * ngroups + group)
        sig = 1.0 / (1.0 + tl.exp(-z))
        gate = z * sig
        dgate = sig * (1.0 + z * (1.0 - sig))  # silu'(z)
        if NORM_BEFORE_GATE:
            n = y * rstd
            dz = dout * n * w * dgate
            dn = dout * gate * w
            dw += dout * gate * n
            dy = rstd * (dn - n * (tl.sum(dn * n, axis=0) / group_size))
        else:
            n = y * gate * rstd
            dn = dout * w
            dw += dout * n
            dv = rstd * (dn - n * (tl.sum(dn * n, axis=0) / group_size))
            dy = dv * gate
            dz = dv * y * dgate
        tl.store(dy_ptr + tl.cast(row, tl.int64) * s_dy_r + offs * s_dy_c, dy.to(dy_ptr.dtype.element_ty), mask=mask)
        tl.store(dz_ptr + tl.cast(row, tl.int64) * s_dz_r + offs * s_dz_c, dz.to(dz_ptr.dtype.element_ty), mask=mask)
    tl.store(dw_ptr + pid * group_size * ngroups + offs, dw, mask=mask)


# --- launches ---------------------------------------------------------------------------------------------------

BWD_PROGRAMS = 1024  # row blocks of the backward (times ngroups programs): the partials' count


def _warps(block_n: int) -> int:
    return 4 if block_n <= 1024 else 8 if block_n <= 4096 else 16


def _rows(t: torch.Tensor) -> torch.Tensor:
    """(..., d_inner) -> (rows, d_inner), a view where the leading dimensions allow one (else a copy)."""
    return t.reshape(-1, t.shape[-1])


def norm_forward(y, z, weight, eps: float, group_size: int, norm_before_gate: bool):
    """-> (out (rows, d_inner) in z's dtype, rstd (rows, ngroups) in fp32 / float64) for y, z (rows, d_inner)."""
    rows, width = y.shape
    ngroups = width // group_size
    block_n = triton.next_power_of_2(group_size)
    out = torch.empty(rows, width, dtype=z.dtype, device=z.device)
    rstd = torch.empty(rows, ngroups, dtype=work_dtype(y.dtype), device=z.device)
    norm_fwd_kernel[(rows, ngroups)](
        y, z, weight, out, rstd, group_size, eps, *y.stride(), *z.stride(), *out.stride(),
        BLOCK_N=block_n, NORM_BEFORE_GATE=norm_before_gate, ACC=acc_dtype(y.dtype), num_warps=_warps(block_n))
    return out, rstd


def norm_backward(y, z, weight, rstd, dout, group_size: int, norm_before_gate: bool, programs: int | None = None):
    """-> (dy in y's dtype, dz in z's dtype, dweight in weight's dtype) of the forward's output gradient `dout`;
    `programs` row blocks (BWD_PROGRAMS by default)."""
    rows, width = y.shape
    ngroups = width // group_size
    block_n = triton.next_power_of_2(group_size)
    rows_per_program = triton.cdiv(rows, min(rows, programs or BWD_PROGRAMS))
    blocks = triton.cdiv(rows, rows_per_program)
    dy = torch.empty(rows, width, dtype=y.dtype, device=y.device)
    dz = torch.empty(rows, width, dtype=z.dtype, device=z.device)
    dw_parts = torch.empty(blocks, width, dtype=work_dtype(y.dtype), device=y.device)
    norm_bwd_kernel[(blocks, ngroups)](
        y, z, weight, rstd, dout, dy, dz, dw_parts, rows, group_size, rows_per_program,
        *y.stride(), *z.stride(), *dout.stride(), *dy.stride(), *dz.stride(),
        BLOCK_N=block_n, NORM_BEFORE_GATE=norm_before_gate, ACC=acc_dtype(y.dtype), num_warps=_warps(block_n))
    return dy, dz, sum_partials(dw_parts, weight.dtype)


class GatedRMSNorm(torch.autograd.Function):
    """norm_forward / norm_backward as one differentiable op on (rows, d_inner) inputs: gradients for y, z, weight."""

    @staticmethod
    def forward(ctx, y, z, weight, eps, group_size, norm_before_gate):
        out, rstd = norm_forward(y, z, weight, eps, group_size, norm_before_gate)
        ctx.save_for_backward(y, z, weight, rstd)
        ctx.group_size, ctx.norm_before_gate = group_size, norm_before_gate
        return out

    @staticmethod
    def backward(ctx, dout):
        y, z, weight, rstd = ctx.saved_tensors
        dy, dz, dweight = norm_backward(y, z, weight, rstd, dout, ctx.group_size, ctx.norm_before_gate)
        return dy, dz, dweight, None, None, None


def gated_rms_norm(y: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float, group_size: int,
                   norm_before_gate: bool) -> torch.Tensor:
    """What models.mamba2.gated_rms_norm computes, on these kernels: y, z (..., d_inner) -> (..., d_inner) in z's
    dtype."""
    out = GatedRMSNorm.apply(_rows(y), _rows(z), weight, eps, group_size, norm_before_gate)
    return out.view(z.shape)
