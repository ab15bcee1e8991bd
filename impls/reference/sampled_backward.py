"""Float64 gradients of problems whose whole float64 autograd graph does not fit (the 2^20-token problem).

The forward is cut at chunk boundaries into pieces of `group` chunks; each piece is the chunked reference with the
state entering it as its initial state (the pieces compose exactly: dt and dA_cumsum are per chunk, and the state
carries the rest). The backward walks the pieces from the last to the first (impls/README.md, "The backward"):
float64 autograd through one piece at a time, from its outputs' gradients (dy on its tokens, and the gradient of
the state leaving it, which the later pieces handed back), gives its inputs' gradients and the gradient of the
state entering it, handed on to the piece before. Two passes, memory of one piece's graph:

1. forward, no graph: the state entering every piece (float64), from the raw inputs;
2. backward, piece by piece in reverse: each piece's gradients.

What it keeps: dx and dz on the sampled chunks (dx whole would be 43 GB in float64 at 2^20 tokens × 80 heads ×
headdim 64); ddt, dB, dC, dA, dD, ddt_bias and dinitial_states whole. `pick` gives the same part of a backend's
gradient. Packed sequences (seq_idx, cu_seqlens) are not handled: asking for them raises.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from impls.reference.chunk_cumsum import chunk_cumsum
from impls.reference.fwd_pass_state import chunk_local_states, pass_states

F64 = torch.float64
SAMPLED_ONLY = ("dx", "dz")  # per-token gradients of headdim width: kept on the sampled chunks only
PIECE_INPUTS = ("x", "dt", "B", "C", "z")  # sliced by tokens; A, D, dt_bias whole


@dataclass
class SampledGradients:
    chunks: tuple[int, ...]
    chunk_size: int
    seqlen: int
    grads: dict[str, torch.Tensor]  # d<input>: float64; dx, dz on the sampled chunks' tokens, the rest whole
    terms_norm: dict[str, torch.Tensor]  # per head, the L2 norm of a summed gradient's terms (dA: DecayTerms)

    def token_slices(self) -> list[slice]:
        return [slice(c * self.chunk_size, min(self.seqlen, (c + 1) * self.chunk_size)) for c in self.chunks]

    def pick(self, name: str, actual: torch.Tensor) -> torch.Tensor:
        """The part of a backend's gradient `name` that this reference holds."""
        if name in SAMPLED_ONLY:
            return torch.cat([actual[:, sl] for sl in self.token_slices()], dim=1)
        return actual


def sampled_gradients(x, dt, A, B, C, chunk_size, dy, dfinal_states=None, D=None, z=None, dt_bias=None,
                      initial_states=None, seq_idx=None, cu_seqlens=None, dt_softplus=False,
                      dt_limit=(0.0, math.inf), chunks=(), group: int = 16, **_ignored) -> SampledGradients:
    """The float64 gradients of y (incoming `dy`) and the final states (incoming `dfinal_states`, or none) with
    respect to every given input of a forward call (see the module docstring); `chunks`: the chunks whose dx and dz
    are kept."""
    if seq_idx is not None or cu_seqlens is not None:
        raise ValueError("seq_idx/cu_seqlens: the sampled gradients do not handle packed sequences; use the float64 "
                         "reference (bench.reference=float64)")
    if group < 1:
        raise ValueError(f"group: expected at least 1 chunk per piece, got {group}")
    batch, seqlen, nheads, headdim = x.shape
    nchunks = math.ceil(seqlen / chunk_size)
    chunks = tuple(sorted({int(c) for c in chunks}))
    if any(c < 0 or c >= nchunks for c in chunks):
        raise ValueError(f"chunks: expected indices in [0, {nchunks}), got {chunks}")
    whole = {"A": A, "D": D, "dt_bias": dt_bias}
    per_token = {"x": x, "dt": dt, "B": B, "C": C, "z": z}
    fixed = dict(chunk_size=chunk_size, dt_softplus=dt_softplus, dt_limit=dt_limit)
    pieces = [(c0 * chunk_size, min(seqlen, (c0 + group) * chunk_size)) for c0 in range(0, nchunks, group)]
    entering = _entering_states(per_token, whole, initial_states, fixed, pieces)

    grads = _empty_gradients(per_token, whole, initial_states, chunks, chunk_size, seqlen)
    d_state = (torch.zeros_like(entering[0]) if dfinal_states is None
               else dfinal_states.to(device=x.device, dtype=F64))
    terms2 = torch.zeros(nheads, device=x.device, dtype=F64)
    for (t0, t1), state in zip(reversed(pieces), reversed(entering)):
        found, squares = _piece_gradients(per_token, whole, state, fixed, t0, t1, dy, d_state)
        d_state = found.pop("dinitial_states")
        _keep(grads, found, t0, t1, chunks, chunk_size, seqlen)
        terms2 += squares
    if initial_states is not None:
        grads["dinitial_states"] = d_state
    return SampledGradients(chunks, chunk_size, seqlen, grads, {"dA": terms2.sqrt()})


def _entering_states(per_token: dict, whole: dict, initial_states, fixed: dict, pieces) -> list[torch.Tensor]:
    """The float64 state entering each piece, from the raw inputs (the first: the initial states, or zeros)."""
    x, B = per_token["x"], per_token["B"]
    batch, _, nheads, headdim = x.shape
    state = torch.zeros(batch, nheads, headdim, B.shape[-1], device=x.device, dtype=F64)
    if initial_states is not None:
        state = state + initial_states.to(F64)
    out = []
    with torch.no_grad():
        for t0, t1 in pieces:
            out.append(state)
            dt, dA = chunk_cumsum(per_token["dt"][:, t0:t1].to(F64), whole["A"].to(F64), fixed["chunk_size"],
                                  None if whole["dt_bias"] is None else whole["dt_bias"].to(F64),
                                  fixed["dt_softplus"], fixed["dt_limit"])
            local = chunk_local_states(B[:, t0:t1].to(F64), x[:, t0:t1].to(F64), dt, dA)
            _, state = pass_states(local, dA[:, :, :, -1], state)
    return out


def _piece_gradients(per_token: dict, whole: dict, state, fixed: dict, t0: int, t1: int, dy,
                     d_state) -> tuple[dict, torch.Tensor]:
    """Float64 autograd through the chunked reference on tokens [t0, t1) entering with `state`: ({d<input>: grad},
    dinitial_states being the gradient of the entering state; per head, the sum of the piece's squared dA terms)."""
    from impls.reference.backend import ReferenceBackend
    from impls.reference.decay_terms import DecayTerms

    leaves = {name: t[:, t0:t1].to(F64).requires_grad_() for name, t in per_token.items() if t is not None}
    leaves.update({name: t.to(F64).requires_grad_() for name, t in whole.items() if t is not None})
    leaves["initial_states"] = state.clone().requires_grad_()
    reference = ReferenceBackend()
    decay = DecayTerms(reference)
    with torch.enable_grad():
        out = reference.ssd_forward(
            **{**dict.fromkeys(("D", "z", "dt_bias")), **leaves}, seq_idx=None, cu_seqlens=None,
            state_dtype=F64, **fixed)
        found = torch.autograd.grad([out.y, out.final_states], list(leaves.values()),
                                    [dy[:, t0:t1].to(F64), d_state], allow_unused=True)
    return {f"d{name}": g for name, g in zip(leaves, found)}, decay.per_head_squares()


def _empty_gradients(per_token: dict, whole: dict, initial_states, chunks, chunk_size: int, seqlen: int) -> dict:
    """Zeroed float64 holders: dx, dz over the sampled chunks' tokens, the other per-token gradients whole, the
    whole-tensor inputs' gradients as accumulators."""
    kept = sum(min(seqlen, (c + 1) * chunk_size) - c * chunk_size for c in chunks)
    grads = {}
    for name, t in per_token.items():
        if t is None:
            continue
        shape = (t.shape[0], kept, *t.shape[2:]) if f"d{name}" in SAMPLED_ONLY else t.shape
        grads[f"d{name}"] = torch.zeros(shape, device=t.device, dtype=F64)
    for name, t in whole.items():
        if t is not None:
            grads[f"d{name}"] = torch.zeros(t.shape, device=t.device, dtype=F64)
    return grads


def _keep(grads: dict, found: dict, t0: int, t1: int, chunks, chunk_size: int, seqlen: int) -> None:
    """Adds one piece's gradients into `grads`: the whole-tensor inputs' summed, the per-token ones placed."""
    offset = 0
    for c in chunks:  # the sampled chunks' positions in the kept dx, dz
        c0, c1 = c * chunk_size, min(seqlen, (c + 1) * chunk_size)
        if t0 <= c0 < t1:
            for name in SAMPLED_ONLY:
                if name in grads:
                    grads[name][:, offset:offset + c1 - c0] = found[name][:, c0 - t0:c1 - t0]
        offset += c1 - c0
    for name, g in found.items():
        if name in SAMPLED_ONLY or g is None:
            continue
        if grads[name].shape == g.shape:  # A, D, dt_bias: summed over the pieces
            grads[name] += g
        else:
            grads[name][:, t0:t1] = g
