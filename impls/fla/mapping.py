"""The exact map from the SSD contract to FLA's chunked simple GLA, and back (docs/peers.md derives it).

Simple GLA (one scalar gate per head and token):   S_t = exp(g_t) S_{t-1} + k_tᵀ v_t,   o_t = scale · q_t S_t
with S_t of shape (K, V). The SSD recurrence h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_tᵀ, y_t = h_t C_t is that
with S = hᵀ (K = dstate, V = headdim) and

    q = C,  k = B  (each head reads its group: repeated to nheads),  v = dt·x,  g = dt·A  (natural log, fp32),
    scale = 1 (FLA's default is K^-1/2),  initial_state = h_{-1}ᵀ,  final state = S_Tᵀ,

then y = o + D·x, gated by silu(z). dt is the contract's processed dt (bias, softplus, clamp), which FLA lacks.
Every step here is PyTorch, outside FLA's kernels, so a harness can time `prepare`/`finish` apart.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from impls.reference.chunk_cumsum import process_dt
from impls.reference.common import acc_dtype, skip_and_gate


@dataclass
class GlaArgs:
    """Arguments of fla.ops.simple_gla.chunk_simple_gla, plus what `finish` needs."""

    q: torch.Tensor  # (b, t, h, n) = C per head
    k: torch.Tensor  # (b, t, h, n) = B per head
    v: torch.Tensor  # (b, t, h, p) = dt·x in x's dtype
    g: torch.Tensor  # (b, t, h) = dt·A, fp32 (float64 for float64 inputs)
    initial_state: torch.Tensor | None  # (N, h, n, p), or (N, h, p, n) with state_v_first
    cu_seqlens: torch.Tensor | None  # int64
    state_v_first: bool
    chunk_size: int
    scale: float = 1.0


STEPS = {
    "prepare.dt": "dt + dt_bias, softplus (threshold 20), clamp to dt_limit, fp32 (FLA has no dt processing)",
    "prepare.g": "g = dt·A, fp32 (b, t, h): FLA's log-gate in natural log (it scales by 1/ln 2 itself)",
    "prepare.v": "v = dt·x computed in fp32, rounded once to x's dtype (b, t, h, headdim): one kernel "
                 "reading x, writing v",
    "prepare.qk": "q = C, k = B with groups repeated to heads (h // ngroups each): two copies (b, t, h, dstate) "
                  "when ngroups < nheads; FLA's kernels index q/k with head stride dstate, so views cannot do",
    "prepare.initial_state": "h_{-1} transposed to FLA's (K, V) = (dstate, headdim) layout (a copy) unless "
                             "state_v_first; with cu_seqlens, zeros for every sequence but the first",
    "prepare.cu_seqlens": "cast to int64",
    "finish.D_z": "y = o + D·x (per head or per channel), then y·silu(z): fp32, one rounding to x's dtype "
                  "(FLA has neither); without z one kernel reading o and x, writing y",
    "finish.states": "final state(s) transposed back to (headdim, dstate): a view; with cu_seqlens, the states of "
                     "empty sequences zeroed and the row's final state picked as the last non-empty sequence's "
                     "(a few small kernels on (nseqs, ...) tensors, no host read)",
}


def gla_args(x, dt, A, B, C, chunk_size, dt_bias=None, initial_states=None, cu_seqlens=None, dt_softplus=False,
             dt_limit=(0.0, float("inf")), state_v_first=False) -> GlaArgs:
    nheads = x.shape[2]
    work = acc_dtype(x, dt, A)
    dt_p = process_dt(dt, dt_bias, dt_softplus, dt_limit, work)  # (b, t, h)
    g = (dt_p * A.to(work)).contiguous()
    v = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    torch.mul(x, dt_p[..., None], out=v)  # computed in `work`, rounded once on the store
    q, k = heads_from_groups(C, nheads), heads_from_groups(B, nheads)
    h0 = None
    if initial_states is not None:
        h0 = initial_states.to(acc_dtype(x, initial_states))  # (b, h, p, n)
        h0 = h0 if state_v_first else h0.transpose(-1, -2)  # FLA's default state layout is (K, V) = (n, p)
        # one state per packed sequence: as given, or (one per row) the row's initial state is sequence 0's
        if cu_seqlens is not None and initial_states.shape[0] == x.shape[0]:
            per_seq = h0.new_zeros(cu_seqlens.shape[0] - 1, *h0.shape[1:])
            per_seq[0] = h0[0]
            h0 = per_seq
        h0 = h0.contiguous()
    cu = cu_seqlens.to(torch.int64) if cu_seqlens is not None else None
    return GlaArgs(q, k, v, g, h0, cu, state_v_first, chunk_size)


def heads_from_groups(t, nheads):
    """(b, t, g, n) -> (b, t, nheads, n), head h reading group h // (nheads // g): one contiguous copy (the same
    order as impls.reference.common.per_head's repeat_interleave, as a broadcast copy)."""
    b, L, g, n = t.shape
    # reshape alone would return a stride-0 view when g == 1: FLA would then make (and time) the copy itself
    return t.unsqueeze(3).expand(b, L, g, nheads // g, n).reshape(b, L, nheads, n).contiguous()


def finish(o, ht, x, D=None, z=None, state_v_first=False, cu_seqlens=None, own_initial_states=False):
    """-> (y in x's dtype, final states (b, h, p, n) fp32, per-sequence states (nseqs, h, p, n) or None, the
    latter with cu_seqlens)."""
    y = o
    if z is not None:
        y = skip_and_gate(o.to(acc_dtype(x)), x, D, z).to(x.dtype)
    elif D is not None:
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        Dv = D.to(acc_dtype(x, D))
        torch.addcmul(o, x, Dv[:, None] if Dv.dim() == 1 else Dv, out=y)  # in fp32, rounded once on the store
    states = ht if state_v_first else ht.transpose(-1, -2)  # (N, h, p, n)
    if cu_seqlens is not None:
        return (y, *packed_final_states(states, cu_seqlens, own_initial_states))
    return y, states, None


def packed_final_states(states, cu_seqlens, own_initial_states=False):
    """FLA's per-sequence final states -> the contract's (row's final state (1, h, p, n), per-sequence states).
    An empty sequence's state is zero (FLA hands back its initial state: sequence 0's h_{-1}), or its own initial
    state where each sequence has one (as FLA hands it back); the row's final state is that of its last non-empty
    sequence."""
    nonempty = (cu_seqlens[1:] > cu_seqlens[:-1]).to(states.dtype)
    per_seq = states if own_initial_states else states * nonempty[:, None, None, None]
    last = torch.searchsorted(cu_seqlens, cu_seqlens[-1:]) - 1  # first offset equal to seqlen, minus one
    return per_seq.index_select(0, last), per_seq
