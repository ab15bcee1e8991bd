"""The reference on sampled chunks: ground truth for problems whose full float64 (or fp32) reference does not fit.

At 2^20 tokens × 80 heads the float64 reference would need ~0.3 TB. This one holds only what it checks:
- dt and dA_cumsum everywhere (float64: 0.7 GB each at that size);
- the state entering each sampled chunk and the final state, from the reference stages run in float32 on slices
  of `group` chunks, the state carried from group to group (chunk_local_states, then pass_states) — computed
  from the raw inputs, so they are independent of the backend being checked;
- y on the sampled chunks: the reference compute_out in float64 on each chunk's slice, from that entering state.
Every output it holds is compared with the same slice of the backend's full output (`pick`).

Packed sequences (seq_idx, cu_seqlens) are not handled: asking for them raises.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from impls.reference.chunk_cumsum import chunk_cumsum
from impls.reference.compute_out import compute_out
from impls.reference.fwd_pass_state import chunk_local_states, pass_states

INT32_LIMIT = 1 << 31


@dataclass
class SampledReference:
    chunks: tuple[int, ...]
    chunk_size: int
    seqlen: int
    dt: torch.Tensor  # (batch, nheads, nchunks, chunk), float64, every chunk
    dA_cumsum: torch.Tensor
    states: torch.Tensor  # (batch, len(chunks), nheads, headdim, dstate): entering the sampled chunks
    final_states: torch.Tensor
    y: torch.Tensor  # (batch, tokens of the sampled chunks, nheads, headdim), float64
    varlen_states: None = None

    def token_slices(self) -> list[slice]:
        return [slice(c * self.chunk_size, min(self.seqlen, (c + 1) * self.chunk_size)) for c in self.chunks]

    def pick(self, name: str, actual: torch.Tensor) -> torch.Tensor:
        """The part of a backend's full output `name` that this reference holds."""
        if name == "states":
            return actual[:, list(self.chunks)]
        if name == "y":
            return torch.cat([actual[:, sl] for sl in self.token_slices()], dim=1)
        return actual


def crossing_chunks(elements_per_token: int, batch: int, seqlen: int, chunk: int) -> set[int]:
    """The chunk (and the one before it) whose tokens hold element offset 2^31 of a (batch, seqlen, ...) tensor
    with `elements_per_token` elements per token: where an int32 offset would wrap. Empty if it never does."""
    first = math.ceil(INT32_LIMIT / elements_per_token)
    if first >= batch * seqlen:
        return set()
    c = (first % seqlen) // chunk
    return {max(0, c - 1), c}


def sampled_chunks(batch: int, seqlen: int, nheads: int, headdim: int, dstate: int, chunk: int) -> tuple[int, ...]:
    """First two, middle, last two, and those where x's / y's or the states' element offsets cross 2^31."""
    nchunks = math.ceil(seqlen / chunk)
    picked = {0, 1, nchunks // 2, nchunks - 2, nchunks - 1}
    picked |= crossing_chunks(nheads * headdim, batch, seqlen, chunk)
    picked |= crossing_chunks(nheads * headdim * dstate, batch, nchunks, 1)  # states: (b, c, h, p, n)
    return tuple(sorted(c for c in picked if 0 <= c < nchunks))


def sampled_reference(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                      seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, math.inf),
                      chunks=None, group: int = 128, **_ignored) -> SampledReference:
    """Builds the SampledReference of a forward call's arguments (see the module docstring)."""
    if seq_idx is not None or cu_seqlens is not None:
        raise ValueError("seq_idx/cu_seqlens: the sampled reference does not handle packed sequences; "
                         "use bench.reference=float64 or fp32-chunked")
    batch, seqlen, nheads, headdim = x.shape
    dstate = B.shape[-1]
    if chunks is None:
        chunks = sampled_chunks(batch, seqlen, nheads, headdim, dstate, chunk_size)
    chunks = tuple(sorted(set(int(c) for c in chunks)))
    f64 = torch.float64
    ref_dt, ref_dA = chunk_cumsum(dt.to(f64), A.to(f64), chunk_size, None if dt_bias is None else dt_bias.to(f64),
                                  dt_softplus, dt_limit)
    nchunks = ref_dt.shape[2]
    if any(c < 0 or c >= nchunks for c in chunks):
        raise ValueError(f"chunks: expected indices in [0, {nchunks}), got {chunks}")
    entering, final = _float32_states(B, x, ref_dt.float(), ref_dA.float(), initial_states, set(chunks), group)
    ys = []
    for c in chunks:
        t = slice(c * chunk_size, min(seqlen, (c + 1) * chunk_size))
        sl = slice(c, c + 1)
        ys.append(compute_out(C[:, t].to(f64), B[:, t].to(f64), x[:, t].to(f64), ref_dt[:, :, sl], ref_dA[:, :, sl],
                              entering[c][:, None].to(f64), None if D is None else D.to(f64),
                              None if z is None else z[:, t].to(f64)))
    return SampledReference(chunks=chunks, chunk_size=chunk_size, seqlen=seqlen, dt=ref_dt, dA_cumsum=ref_dA,
                            states=torch.stack([entering[c] for c in chunks], dim=1), final_states=final,
                            y=torch.cat(ys, dim=1))


def _float32_states(B, x, dt, dA, initial_states, sampled: set[int], group: int):
    """({chunk: state entering it} for the sampled chunks, final state), float32, `group` chunks at a time."""
    batch, seqlen, nheads, headdim = x.shape
    chunk, nchunks = dt.shape[3], dt.shape[2]
    state = torch.zeros(batch, nheads, headdim, B.shape[-1], device=x.device, dtype=torch.float32)
    if initial_states is not None:
        state = state + initial_states.float()
    entering = {}
    for c0 in range(0, nchunks, group):
        c1 = min(nchunks, c0 + group)
        t = slice(c0 * chunk, min(c1 * chunk, seqlen))
        local = chunk_local_states(B[:, t].float(), x[:, t].float(), dt[:, :, c0:c1], dA[:, :, c0:c1])
        states, state = pass_states(local, dA[:, :, c0:c1, -1], state)
        entering.update({c: states[:, c - c0].clone() for c in range(c0, c1) if c in sampled})
    return entering, state
