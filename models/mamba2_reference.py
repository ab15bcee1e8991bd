"""The float64 ground truth of the Mamba-2 block (models/mamba2.py), and how a layer's output is judged against it.

Every step in float64 from the layer's own parameters: the projections as matrix products, the causal conv as
explicit windows of the left-padded input (masked per sequence), the SSD as the sequential recurrence
(impls/reference/sequential.py, the definition), the gated RMSNorm written out. Independent of the chunked SSD code
and of the layer's F.conv1d path. Slow by design (the SSD steps token by token): small sizes only. Differentiable,
so it also checks the gradients of the layer on the reference backend.
"""

from __future__ import annotations

import torch

from impls.reference.sequential import ssd_sequential
from impls.tolerance import blockwise_err, output_blocks, rel_err, tolerance
from models.mamba2 import Mamba2, Mamba2Output


def mamba2_float64(layer: Mamba2, u: torch.Tensor, seq_idx=None, cu_seqlens=None, initial_states=None,
                   conv_initial_states=None) -> Mamba2Output:
    """The block's output and final states in float64, for the same arguments as `layer(...)`."""
    parts = mamba2_float64_parts(layer, u, seq_idx, cu_seqlens, initial_states, conv_initial_states)
    return Mamba2Output(parts["out"], parts["final_states"], parts["varlen_states"], parts["conv_final_states"])


def mamba2_float64_parts(layer: Mamba2, u: torch.Tensor, seq_idx=None, cu_seqlens=None, initial_states=None,
                         conv_initial_states=None) -> dict[str, torch.Tensor | None]:
    """`mamba2_float64` with what the block hands on inside, in float64: z (batch, seqlen, d_inner); x, dt, B, C as
    the SSD takes them; the SSD's output `ssd_y` (batch, seqlen, nheads, headdim); out and the final states."""
    c, f64 = layer.config, torch.float64
    batch, seqlen, _ = u.shape
    proj = _linear(u.to(f64), layer.in_proj)
    z = proj[..., : c.d_inner]
    xBC = proj[..., c.d_inner: c.d_inner + c.conv_dim]
    dt = proj[..., c.d_inner + c.conv_dim:]
    positions = seq_idx if seq_idx is not None else _positions(cu_seqlens, seqlen)
    xBC, conv_final = _conv_silu(xBC, layer, conv_initial_states, positions)
    x = xBC[..., : c.d_inner].reshape(batch, seqlen, c.nheads, c.headdim)
    B = xBC[..., c.d_inner: c.d_inner + c.ngroups * c.d_state].reshape(batch, seqlen, c.ngroups, c.d_state)
    C = xBC[..., c.d_inner + c.ngroups * c.d_state:].reshape(batch, seqlen, c.ngroups, c.d_state)
    D = layer.D.to(f64)
    ssd = ssd_sequential(x, dt, -torch.exp(layer.A_log.to(f64)), B, C,
                         D=D.reshape(c.nheads, c.headdim) if c.D_per_channel else D, dt_bias=layer.dt_bias.to(f64),
                         initial_states=initial_states, seq_idx=seq_idx, cu_seqlens=cu_seqlens, dt_softplus=True,
                         dt_limit=c.dt_limit)
    y, gate = ssd.y.reshape(batch, seqlen, c.d_inner), z * torch.sigmoid(z)
    normed = _rms_norm(y, layer) * gate if c.norm_before_gate else _rms_norm(y * gate, layer)
    return {"z": z, "x": x, "dt": dt, "B": B, "C": C, "ssd_y": ssd.y, "out": _linear(normed, layer.out_proj),
            "final_states": ssd.final_states, "varlen_states": ssd.varlen_states, "conv_final_states": conv_final}


def _linear(v, linear: torch.nn.Linear):
    out = v @ linear.weight.to(torch.float64).T
    return out if linear.bias is None else out + linear.bias.to(torch.float64)


def _positions(cu_seqlens, seqlen: int):
    """(1, seqlen) sequence number of every position of a packed row, from the offsets; None without them."""
    if cu_seqlens is None:
        return None
    bounds = cu_seqlens.tolist()
    seq = torch.zeros(1, seqlen, dtype=torch.long, device=cu_seqlens.device)
    for i, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        seq[:, start:end] = i
    return seq


def _conv_silu(xBC, layer: Mamba2, context, positions):
    """Window t of the left-padded input holds inputs t − d_conv + 1 … t; positions of another sequence than t's
    are zeroed (the padding is sequence 0); then the weighted sum, the bias and SiLU."""
    c, f64 = layer.config, torch.float64
    batch = xBC.shape[0]
    if context is None:
        context = torch.zeros(batch, c.conv_dim, c.d_conv - 1, dtype=f64, device=xBC.device)
    padded = torch.cat([context.to(f64), xBC.transpose(1, 2)], dim=-1)
    windows = padded.unfold(-1, c.d_conv, 1)  # (batch, conv_dim, seqlen, d_conv)
    if positions is not None:
        before = torch.zeros(batch, c.d_conv - 1, dtype=positions.dtype, device=positions.device)
        seq_windows = torch.cat([before, positions], dim=-1).unfold(-1, c.d_conv, 1)  # (batch, seqlen, d_conv)
        windows = windows * (seq_windows == positions[..., None]).to(f64)[:, None]
    conv = torch.einsum("bclk,ck->blc", windows, layer.conv1d.weight.to(f64)[:, 0])
    if layer.conv1d.bias is not None:
        conv = conv + layer.conv1d.bias.to(f64)
    final = None if positions is not None else padded[..., padded.shape[-1] - (c.d_conv - 1):]
    return conv * torch.sigmoid(conv), final


def _rms_norm(v, layer: Mamba2):
    c = layer.config
    groups = v.reshape(*v.shape[:-1], c.ngroups, c.norm_group_size)
    normed = groups / torch.sqrt(groups.pow(2).mean(-1, keepdim=True) + c.norm_eps)
    return normed.reshape(v.shape) * layer.norm_weight.to(torch.float64)


# --- judging a layer's output --------------------------------------------------------------------------------------

def layer_tolerance(layer: Mamba2, dtype: torch.dtype, device) -> float:
    """The tolerance table's entry for the layer's dtype; tf32's where a stage of its SSD backend reports tf32
    matmuls on `device` (Backend.precision), or where torch may run the layer's own fp32 projections or conv in
    tf32 there (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32: the latter on by default)."""
    device, backend = torch.device(device), layer.backend
    tf32 = any(backend.precision(stage, dtype, device) == "tf32" for stage in backend.STAGES)
    tf32 |= device.type == "cuda" and (torch.backends.cuda.matmul.allow_tf32 or torch.backends.cudnn.allow_tf32)
    return tolerance(dtype, tf32)


def layer_errors(got: Mamba2Output, expected: Mamba2Output, chunk_size: int) -> dict[str, float]:
    """Per output the whole-tensor relative error ("out") and the worst block's ("out[blocks]": every
    (batch, chunk) of out; the SSD states' blocks as in impls.tolerance.output_blocks; the conv states per batch
    row); both must be within tolerance. An output present in one and absent in the other is an infinite error."""
    blocks = {"out": (1, chunk_size, None), "final_states": output_blocks("final_states", chunk_size)[0],
              "varlen_states": output_blocks("varlen_states", chunk_size)[0], "conv_final_states": (1, None, None)}
    errors = {}
    for name, block in blocks.items():
        out, ref = getattr(got, name), getattr(expected, name)
        if out is None and ref is None:
            continue
        if out is None or ref is None:
            errors[name] = errors[f"{name}[blocks]"] = float("inf")
            continue
        errors[name], errors[f"{name}[blocks]"] = rel_err(out, ref), blockwise_err(out, ref, block).ratio
    return errors
