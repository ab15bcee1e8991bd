"""What our two chunked backwards (impls/triton/backward/, impls/cutile/backward/) share on the host: what the forward
keeps for them (`Saved`), the states entering every chunk recomputed (switch bwd_recompute_states), the per-sequence
states' gradient taken back through the forward's PyTorch varlen_states by autograd (`varlen_extra`), the fixed-order
float64 sums of the kernels' partials (`partial_sums`), the per-group gradients' buffers and sums under switch
bwd_group_split (`group_output`, `sum_partials`), whether the state pass splits its MMA's operand (`state_split`)
and a gradient's cast to its input's dtype. The math:
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


def group_output(like: torch.Tensor, split: int, atomics: bool, empty) -> torch.Tensor:
    """Where the per-group kernels (dcb, db) write dC or dB (`like`: C or B, (batch, seqlen, ngroups, dstate)):
    switch bwd_group_split 1, the gradient itself in `like`'s dtype; k > 1, the k fp32 partials of each group
    (batch, seqlen, ngroups·k, dstate), partial p of group g at g·k + p; with bwd_atomics, one zeroed fp32 buffer the
    k programs add into. `empty(shape, dtype, device)` allocates (the backend's, poisoned under the gradient gate)."""
    batch, seqlen, ngroups, dstate = like.shape
    if split == 1:
        return empty(tuple(like.shape), like.dtype, like.device)
    if atomics:
        return torch.zeros((batch, seqlen, ngroups, dstate), dtype=torch.float32, device=like.device)
    return empty((batch, seqlen, ngroups * split, dstate), torch.float32, like.device)


def sum_partials(parts: torch.Tensor, ngroups: int, extra: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """`group_output`'s buffer as the gradient in `dtype`: the k partials of each group summed by one torch.sum over
    the split axis in fp32 (a reduction without atomics: the same bits on every call on one device), then `extra`
    (the per-sequence states' term of dB, fp32) added, then cast. One partial per group (bwd_group_split 1, or
    summed by atomics) is taken as it is."""
    k = parts.shape[2] // ngroups
    if k == 1 and extra is None:
        return parts if parts.dtype == dtype else parts.to(dtype)
    total = parts.unflatten(2, (ngroups, k)).sum(dim=3, dtype=torch.float32) if k > 1 else parts.float()
    if extra is not None:
        total = total + extra
    return total.to(dtype)


def source_widths(chunk: int, block: int) -> int:
    """How many source widths (block, 2·block, … chunk) the dcb kernel's 'chunk' arrangement holds a head walk for
    (both languages): row tile i reads the smallest that holds its sources 0 … (i + 1)·block − 1 (the level whose
    row tiles are 2^(level-1) … 2^level − 1, tile 0 at level 0), so none forms the products of the sources after its
    rows."""
    return (chunk // block).bit_length()


def cast(grad: torch.Tensor | None, like: torch.Tensor | None) -> torch.Tensor | None:
    """A gradient in its input's dtype (None where either is absent)."""
    return None if grad is None or like is None else grad.to(like.dtype)


def state_split(switches, dtype: torch.dtype) -> bool:
    """Whether the state pass splits its MMA's weighted dŷ (switch bwd_state_split): for 16-bit inputs only, fp32's
    operand being the fp32 value itself."""
    return bool(switches.bwd_state_split) and dtype != torch.float32


def written_elements(stage: str, outputs, seqlen: int, padding_read: bool):
    """`outputs` of backward stage `stage` (its kernel's buffers, as both backends' stage calls return them) with the
    elements its kernel leaves unwritten by design set to zero: what the tuning search's check of finite outputs
    (impls/tuning.py `nonfinite_output`, via `Tunable.output`) may read. The chunk kernel writes T's row-sum partial
    of source tile t at rows at or after the tile's start only, and inside the sequence; the dcb kernel writes
    d(C·Bᵀ) on and below the diagonal only. The consumers read those elements alone, so the rest of each buffer
    holds whatever the allocator left there (NaN under `impls.tolerance.poisoned_allocations`, and often after it on
    a GPU). The chunk kernel's ddt and dΛ terms past the end of a short last chunk: `padding_read` where the cumsum
    kernel reads them (our Triton's writes zeros there and its reverse cumsum runs over the whole chunk), so they are
    checked; cuTile's chunk kernel leaves them and its cumsum masks them. The entering-state terms that the state pass
    or the dcb kernel writes under switch bwd_entry_term (their last output, None otherwise) are read inside the
    sequence only. Every other output is read whole."""
    if stage in ("bwd_state_pass", "bwd_dcb") and outputs[-1] is not None:  # (…, chunk) per (batch, head, chunk, tile)
        terms = outputs[-1]
        inside = _inside_sequence(terms.shape[2], terms.shape[4], seqlen, terms.device)
        outputs = (*outputs[:-1], terms.where(inside[:, None], 0.0))
    if stage == "bwd_chunk":
        dx, dz, ddt, dl, row, dD = outputs
        nchunks, tiles, chunk = row.shape[2], row.shape[3], row.shape[4]
        inside = _inside_sequence(nchunks, chunk, seqlen, row.device)  # (nchunks, chunk)
        position = torch.arange(chunk, device=row.device)
        after = position[None, :] >= (chunk // tiles) * torch.arange(tiles, device=row.device)[:, None]
        if not padding_read:
            ddt, dl = ddt.where(inside, 0.0), dl.where(inside, 0.0)
        return dx, dz, ddt, dl, row.where(inside[:, None] & after, 0.0), dD
    if stage == "bwd_dcb":
        dC, dG, terms = outputs
        nchunks, chunk = dG.shape[1], dG.shape[3]
        inside = _inside_sequence(nchunks, chunk, seqlen, dG.device)
        causal = torch.ones(chunk, chunk, dtype=torch.bool, device=dG.device).tril()  # (row l, source s)
        return dC, dG.where((causal & inside[:, :, None] & inside[:, None, :])[:, None], 0.0), terms
    return outputs


def _inside_sequence(nchunks: int, chunk: int, seqlen: int, device) -> torch.Tensor:
    """(nchunks, chunk) bool: the chunked positions that lie inside the sequence (the last chunk may be short)."""
    return (torch.arange(nchunks * chunk, device=device) < seqlen).view(nchunks, chunk)
