"""What our two chunked backwards (impls/triton/backward/, impls/cutile/backward/) share on the host: what the forward
keeps for them (`Saved`), the states entering every chunk recomputed (switch bwd_recompute_states), the per-sequence
states' gradient taken back through the forward's PyTorch varlen_states by autograd (`varlen_extra`), the fixed-order
float64 sums of the kernels' partials (`partial_sums`) and a gradient's cast to its input's dtype. The math:
impls/README.md, "The chunked backward"."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Saved:
    """What the forward keeps besides the inputs: stage 1's outputs (fp32, 2 × batch·nheads·seqlen padded to
    whole chunks), the final states (the forward's output) and the states entering every chunk (None with switch
    bwd_recompute_states, or where the forward computed none)."""

    dt: torch.Tensor
    dA_cumsum: torch.Tensor
    final_states: torch.Tensor
    states: torch.Tensor | None


@dataclass(frozen=True)
class Extra:
    """The gradients the per-sequence states (cu_seqlens) send into the chunked quantities, fp32; None without."""

    dx: torch.Tensor | None = None
    dB: torch.Tensor | None = None
    ddt: torch.Tensor | None = None  # the processed dt's
    dA_cumsum: torch.Tensor | None = None
    states: torch.Tensor | None = None


def recompute_states(backend, args: dict, saved: Saved) -> torch.Tensor:
    """The states entering every chunk, from the backend's stage 2 again on the saved stage-1 outputs."""
    states, _ = backend.fwd_pass_state(args["B"], args["x"], saved.dt, saved.dA_cumsum, args["initial_states"],
                                       args["seq_idx"], args["state_dtype"])
    return states


def backward_inputs(backend, args: dict, saved: Saved, y: torch.Tensor, grads: dict):
    """What both backwards read before their kernels: dy (zeros where no gradient flows into y), the states entering
    every chunk (saved, or recomputed), the per-sequence states' terms (`varlen_extra`) and ŷ, y before the gate
    (compute_out without z, for dz; None without z)."""
    dy = grads.get("y")
    dy = torch.zeros_like(y) if dy is None else dy
    states = saved.states if saved.states is not None else recompute_states(backend, args, saved)
    extra = varlen_extra(args, saved, grads.get("varlen_states"), states)
    yhat = None
    if args["z"] is not None:
        yhat = backend.compute_out(args["C"], args["B"], args["x"], saved.dt, saved.dA_cumsum, states, args["D"],
                                   None, args["seq_idx"])
    return dy, states, extra, yhat


def varlen_extra(args: dict, saved: Saved, dvarlen: torch.Tensor | None, states: torch.Tensor) -> Extra:
    """With cu_seqlens and a gradient flowing into the per-sequence states: that gradient taken back to x, B, dt,
    dA_cumsum and the entering states by autograd through the PyTorch varlen_states the forward runs (fp32 leaves:
    nothing rounded on the way)."""
    if args["cu_seqlens"] is None or dvarlen is None:
        return Extra()
    from impls.reference.varlen import varlen_states

    names = ("B", "x", "dt", "dA_cumsum", "states")  # varlen_states' arguments, in order
    leaves = [t.detach().to(torch.float32).requires_grad_() for t in (args["B"], args["x"], saved.dt,
                                                                       saved.dA_cumsum, states)]
    with torch.enable_grad():
        out = varlen_states(*leaves, args["cu_seqlens"])
        found = torch.autograd.grad(out, leaves, dvarlen.to(out.dtype), allow_unused=True)
    return Extra(**{("d" + n if n in ("B", "x", "dt") else n): torch.zeros_like(t) if g is None else g
                    for n, t, g in zip(names, leaves, found)})


def partial_sums(args: dict, dA_part, bias_part, dD_part) -> dict:
    """dA, ddt_bias and dD from their partials (per batch row and chunk, (batch, nheads, nchunks); dD's per chunk and
    source tile too, (batch, nchunks, tiles, nheads, headdim)), summed in float64 in a fixed order: a few numbers per
    head."""
    out = {"A": dA_part.sum(dim=(0, 2), dtype=torch.float64)}
    if args["dt_bias"] is not None:
        out["dt_bias"] = bias_part.sum(dim=(0, 2), dtype=torch.float64)
    if args["D"] is not None:
        dD = dD_part.sum(dim=(0, 1, 2), dtype=torch.float64)
        out["D"] = dD.sum(dim=-1) if args["D"].dim() == 1 else dD
    return out


def cast(grad: torch.Tensor | None, like: torch.Tensor | None) -> torch.Tensor | None:
    """A gradient in its input's dtype (None where either is absent)."""
    return None if grad is None or like is None else grad.to(like.dtype)
