"""The public SSD-forward interface: three stages and their composition, for any registered backend.

Each entry validates its arguments (metadata only, see impls/validate.py), asks the backend whether it can run
the problem, and calls it. The contract — logical shapes, dtypes, what each stage computes — is in
impls/README.md.
"""

from __future__ import annotations

import math

import torch

from impls import validate as check
from impls.problem import Problem, Shape, dtype_name
from impls.registry import Backend, ForwardResult, get_backend, require

INF = math.inf


def _backend(backend, problem: Problem, device) -> Backend:
    impl = get_backend(backend)
    require(impl, problem, device)
    return impl


def uses_decay_factor(impl: Backend) -> bool:
    """Whether the backend's compute_out uses the factored decay (switch decay_factor), which assumes dA_cumsum
    non-increasing inside a chunk."""
    return bool(getattr(impl.switches, "decay_factor", False))


def seq_idx_from_cu_seqlens(cu_seqlens: torch.Tensor, seqlen: int) -> torch.Tensor:
    """(1, seqlen) int32 sequence index of every position, computed on the device without a sync."""
    positions = torch.arange(seqlen, device=cu_seqlens.device)
    return torch.searchsorted(cu_seqlens[1:].contiguous(), positions, right=True).to(torch.int32)[None]


def chunk_cumsum(dt, A, chunk_size: int, dt_bias=None, dt_softplus: bool = False, dt_limit=(0.0, INF), *,
                 backend="reference", check_values: bool = False):
    """dt (batch, seqlen, nheads), A (nheads,) -> (dt processed, dA_cumsum), each (batch, nheads, nchunks,
    chunk_size) fp32."""
    check.tensor("dt", dt, shape=(None, None, None))
    batch, seqlen, nheads = dt.shape
    check.tensor("A", A, shape=(nheads,), device=dt.device)
    check.optional("dt_bias", dt_bias, shape=(nheads,), device=dt.device)
    check.chunk_size(chunk_size)
    check.dt_limit(dt_limit)
    if check_values:
        check.values(dt=dt, A=A, dt_bias=dt_bias)
    problem = Problem(Shape(batch, seqlen, nheads, 0, 0, 0, chunk_size), dtype=dtype_name(dt.dtype),
                      has_dt_bias=dt_bias is not None, dt_softplus=dt_softplus,
                      dt_limit=tuple(float(v) for v in dt_limit), has_D=False)
    impl = _backend(backend, problem, dt.device)
    return impl.chunk_cumsum(dt, A, chunk_size, dt_bias, dt_softplus, tuple(float(v) for v in dt_limit))


def _check_chunked(B, x, dt, dA_cumsum):
    batch, seqlen, nheads, headdim, ngroups, dstate = check.dims(x, B)
    check.tensor("dt", dt, shape=(batch, nheads, None, None), dtypes=(torch.float32, torch.float64),
                 device=x.device)
    nchunks, chunk = dt.shape[2], dt.shape[3]
    check.chunk_size(chunk)
    if nchunks != math.ceil(seqlen / chunk):
        check.fail("dt", f"nchunks = ceil(seqlen/chunk_size) = {math.ceil(seqlen / chunk)} (dimension 2)", nchunks)
    check.chunked("dA_cumsum", dA_cumsum, batch, nheads, nchunks, chunk, x.device)
    return batch, seqlen, nheads, headdim, ngroups, dstate, chunk, nchunks


def fwd_pass_state(B, x, dt, dA_cumsum, initial_states=None, seq_idx=None, state_dtype=None, *,
                   backend="reference", check_values: bool = False):
    """-> (states entering every chunk (batch, nchunks, nheads, headdim, dstate) in state_dtype (default: x's
    dtype), final states (batch, nheads, headdim, dstate) fp32)."""
    batch, seqlen, nheads, headdim, ngroups, dstate, chunk, nchunks = _check_chunked(B, x, dt, dA_cumsum)
    check.optional("initial_states", initial_states, shape=(batch, nheads, headdim, dstate), device=x.device)
    check.seq_idx(seq_idx, batch, seqlen, x.device)
    check.state_dtype(state_dtype)
    if check_values:
        check.values(B=B, x=x, dt=dt, dA_cumsum=dA_cumsum, initial_states=initial_states, seq_idx=seq_idx)
        check.flat_padded_tail(dt, dA_cumsum, seqlen)
    problem = Problem.from_inputs(x, B, chunk, initial_states=initial_states, seq_idx=seq_idx,
                                  state_dtype=state_dtype)
    impl = _backend(backend, problem, x.device)
    return impl.fwd_pass_state(B, x, dt, dA_cumsum, initial_states, seq_idx, state_dtype)


def compute_out(C, B, x, dt, dA_cumsum, states, D=None, z=None, seq_idx=None, *, backend="reference",
                check_values: bool = False):
    """-> y (batch, seqlen, nheads, headdim) in x's dtype."""
    batch, seqlen, nheads, headdim, ngroups, dstate, chunk, nchunks = _check_chunked(B, x, dt, dA_cumsum)
    check.tensor("C", C, shape=tuple(B.shape), dtypes=(x.dtype,), device=x.device)
    check.tensor("states", states, shape=(batch, nchunks, nheads, headdim, dstate), device=x.device)
    _check_D_z(D, z, x)
    check.seq_idx(seq_idx, batch, seqlen, x.device)
    if check_values:
        check.values(C=C, B=B, x=x, dt=dt, dA_cumsum=dA_cumsum, states=states, D=D, z=z, seq_idx=seq_idx)
    problem = Problem.from_inputs(x, B, chunk, D=D, z=z, seq_idx=seq_idx)
    impl = _backend(backend, problem, x.device)
    if check_values and uses_decay_factor(impl):
        check.non_increasing_in_chunks(dA_cumsum)
    return impl.compute_out(C, B, x, dt, dA_cumsum, states, D, z, seq_idx)


def _check_D_z(D, z, x):
    nheads, headdim = x.shape[2], x.shape[3]
    if D is not None:
        check.tensor("D", D, device=x.device)
        if tuple(D.shape) not in ((nheads,), (nheads, headdim)):
            check.fail("D", f"shape ({nheads},) or ({nheads}, {headdim})", tuple(D.shape))
    check.optional("z", z, shape=tuple(x.shape), dtypes=(x.dtype,), device=x.device)


def ssd_forward(x, dt, A, B, C, chunk_size: int, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
                cu_seqlens=None, dt_softplus: bool = False, dt_limit=(0.0, INF), state_dtype=None, *,
                backend="reference", check_values: bool = False) -> ForwardResult:
    """The whole forward: y (batch, seqlen, nheads, headdim) and final states (batch, nheads, headdim, dstate),
    plus the final state of every sequence (nseqs, nheads, headdim, dstate) when cu_seqlens is given. Without
    seq_idx, cu_seqlens also defines it."""
    batch, seqlen, nheads, headdim, ngroups, dstate = check.dims(x, B)
    check.tensor("dt", dt, shape=(batch, seqlen, nheads), device=x.device)
    check.tensor("A", A, shape=(nheads,), device=x.device)
    check.tensor("C", C, shape=tuple(B.shape), dtypes=(x.dtype,), device=x.device)
    check.chunk_size(chunk_size)
    check.dt_limit(dt_limit)
    check.optional("dt_bias", dt_bias, shape=(nheads,), device=x.device)
    _check_D_z(D, z, x)
    check.optional("initial_states", initial_states, shape=(batch, nheads, headdim, dstate), device=x.device)
    check.seq_idx(seq_idx, batch, seqlen, x.device)
    check.cu_seqlens(cu_seqlens, batch, x.device)
    check.state_dtype(state_dtype)
    if check_values:
        check.values(x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states,
                     seq_idx=seq_idx, cu_seqlens=cu_seqlens, seqlen=seqlen)
        if seq_idx is not None and cu_seqlens is not None:
            if not torch.equal(seq_idx.long(), seq_idx_from_cu_seqlens(cu_seqlens, seqlen).long()):
                check.fail("seq_idx", "the sequence index that cu_seqlens defines", "a different one")
    if cu_seqlens is not None and seq_idx is None:
        seq_idx = seq_idx_from_cu_seqlens(cu_seqlens, seqlen)
    problem = Problem.from_inputs(x, B, chunk_size, dt_bias=dt_bias, dt_softplus=dt_softplus, dt_limit=dt_limit,
                                  D=D, z=z, initial_states=initial_states, seq_idx=seq_idx, cu_seqlens=cu_seqlens,
                                  state_dtype=state_dtype)
    impl = _backend(backend, problem, x.device)
    if check_values and uses_decay_factor(impl):
        check.decay_factor_inputs(A, dt, dt_bias, dt_softplus, dt_limit)
    return impl.ssd_forward(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
                            dt_softplus, tuple(float(v) for v in dt_limit), state_dtype)
