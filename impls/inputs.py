"""Random inputs for a Problem, from documented distributions (never zeros), seeded.

Distributions (after Mamba-2's initialisation, state-spaces/mamba `Mamba2.__init__`):
- step sizes dt_step ~ log-uniform[1e-3, 1e-1]; with dt_bias: dt_bias = softplus⁻¹(dt_step) and the raw dt
  (the projection output) ~ 0.5·N(0, 1); without dt_bias or softplus, dt = dt_step directly (positive);
- A = -exp(U[log 1, log 16]) per head (A_init_range (1, 16));
- x, B, C, z ~ N(0, 1); D ~ 1 + 0.1·N(0, 1); initial states ~ 0.5·N(0, 1);
- packed sequences: per batch row, nseqs-1 distinct cut points uniform in (0, seqlen), drawn row by row; seq_idx
  numbers a row's sequences from 0 in even rows and from 1 in odd rows (so the initial state, which belongs to
  sequence 0 only, is dropped there: impls/README.md); with cu_seqlens (batch 1) from 0, as cu_seqlens defines.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from impls.problem import Problem

DISTRIBUTION = "mamba2-init-v2"  # recorded with every result; change the name when the distributions change


@dataclass
class Inputs:
    x: torch.Tensor
    dt: torch.Tensor
    A: torch.Tensor
    B: torch.Tensor
    C: torch.Tensor
    chunk_size: int
    D: torch.Tensor | None = None
    z: torch.Tensor | None = None
    dt_bias: torch.Tensor | None = None
    initial_states: torch.Tensor | None = None
    seq_idx: torch.Tensor | None = None
    cu_seqlens: torch.Tensor | None = None
    dt_softplus: bool = False
    dt_limit: tuple[float, float] = (0.0, math.inf)
    state_dtype: torch.dtype | None = None

    def forward_kwargs(self) -> dict:
        """Arguments of `impls.ssd_forward` (and of the sequential reference, minus state_dtype)."""
        return dict(x=self.x, dt=self.dt, A=self.A, B=self.B, C=self.C, chunk_size=self.chunk_size, D=self.D,
                    z=self.z, dt_bias=self.dt_bias, initial_states=self.initial_states, seq_idx=self.seq_idx,
                    cu_seqlens=self.cu_seqlens, dt_softplus=self.dt_softplus, dt_limit=self.dt_limit,
                    state_dtype=self.state_dtype)

    def to(self, dtype: torch.dtype | None = None, device=None) -> Inputs:
        """A copy with the float tensors cast to `dtype` (A, dt_bias, D keep fp32 unless dtype is float64)."""
        def cast(t, keep_fp32=False):
            if t is None or not t.is_floating_point():
                return None if t is None else t.to(device=device)
            want = dtype if (dtype == torch.float64 or not keep_fp32) else torch.float32
            return t.to(device=device, dtype=want or t.dtype)

        return Inputs(cast(self.x), cast(self.dt), cast(self.A, True), cast(self.B), cast(self.C), self.chunk_size,
                      cast(self.D, True), cast(self.z), cast(self.dt_bias, True), cast(self.initial_states, True),
                      cast(self.seq_idx), cast(self.cu_seqlens), self.dt_softplus, self.dt_limit, self.state_dtype)


DEVICE_DRAW_ELEMENTS = 1 << 30  # above this many elements of x the harness draws on the device (see make_inputs)


def make_inputs(problem: Problem, device="cpu", seed: int = 0, dtype: torch.dtype | None = None,
                draw_device=None) -> Inputs:
    """Draws the inputs of `problem` on `device` in `dtype` (default: the problem's dtype).

    The random numbers come from a generator on `draw_device` (default: the CPU, so that a seed gives the same
    inputs on every machine). Drawing 5.4e9 elements of x on the CPU takes minutes; drawing them on the GPU
    (draw_device=device) takes a second, from the same distributions but another random stream."""
    s = problem.shape
    dtype = dtype or problem.torch_dtype
    draw = torch.device(draw_device or "cpu")
    gen = torch.Generator(device=draw).manual_seed(seed)

    def normal(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, device=draw) * scale).to(device=device, dtype=dtype)

    def uniform(*shape):
        return torch.rand(*shape, generator=gen, dtype=torch.float64, device=draw)

    log_lo, log_hi = math.log(1e-3), math.log(1e-1)
    step = torch.exp(log_lo + (log_hi - log_lo) * uniform(s.nheads))  # per head
    fp = torch.float64 if dtype == torch.float64 else torch.float32
    dt_bias = None
    if problem.dt_softplus:
        raw = normal(s.batch, s.seqlen, s.nheads, scale=0.5)
        inv_softplus = step + torch.log(-torch.expm1(-step))
        if problem.has_dt_bias:
            dt_bias = inv_softplus.to(device=device, dtype=fp)
        else:
            raw = raw + inv_softplus.to(device=device, dtype=dtype)
        dt = raw
    else:
        jitter = torch.exp(0.5 * torch.randn(s.batch, s.seqlen, s.nheads, generator=gen, dtype=torch.float64,
                                             device=draw))
        dt = (step * jitter).to(device=device, dtype=dtype)
        if problem.has_dt_bias:
            dt_bias = (step * 0.1).to(device=device, dtype=fp)
    A = (-torch.exp(math.log(16.0) * uniform(s.nheads))).to(device=device, dtype=fp)
    inputs = Inputs(
        x=normal(s.batch, s.seqlen, s.nheads, s.headdim),
        dt=dt,
        A=A,
        B=normal(s.batch, s.seqlen, s.ngroups, s.dstate),
        C=normal(s.batch, s.seqlen, s.ngroups, s.dstate),
        chunk_size=s.chunk_size,
        dt_bias=dt_bias,
        dt_softplus=problem.dt_softplus,
        dt_limit=problem.dt_limit,
        state_dtype=problem.torch_state_dtype if problem.state_dtype else None,
    )
    if problem.has_D:
        shape = (s.nheads, s.headdim) if problem.D_per_channel else (s.nheads,)
        inputs.D = (1.0 + 0.1 * torch.randn(*shape, generator=gen, device=draw)).to(device=device, dtype=fp)
    if problem.has_z:
        inputs.z = normal(s.batch, s.seqlen, s.nheads, s.headdim)
    if problem.has_initial_states:
        rows = problem.nseqs if problem.initial_states_per_sequence else s.batch
        draw_states = torch.randn(rows, s.nheads, s.headdim, s.dstate, generator=gen, device=draw)
        inputs.initial_states = (0.5 * draw_states).to(device=device, dtype=fp)
    if problem.has_seq_idx:
        nseqs = max(problem.nseqs, 2) if not problem.varlen else problem.nseqs
        rows = [_sequence_bounds(s.seqlen, nseqs, gen, draw) for _ in range(s.batch)]
        # without cu_seqlens, odd rows number their sequences from 1: the initial state is then dropped there
        first = [0 if problem.varlen else r % 2 for r in range(s.batch)]
        inputs.seq_idx = torch.stack([
            torch.searchsorted(bounds[1:], torch.arange(s.seqlen), right=True) + start
            for bounds, start in zip(rows, first)
        ]).to(device=device, dtype=torch.int32)
        if problem.varlen:
            inputs.cu_seqlens = rows[0].to(device=device, dtype=torch.int32)
    return inputs


def _sequence_bounds(seqlen: int, nseqs: int, gen: torch.Generator, draw) -> torch.Tensor:
    """0, nseqs-1 distinct sorted cut points uniform in (0, seqlen), seqlen (CPU, int64)."""
    cuts = torch.randperm(seqlen - 1, generator=gen, device=draw)[: nseqs - 1].sort().values.cpu() + 1
    return torch.cat([torch.zeros(1, dtype=torch.long), cuts, torch.tensor([seqlen])])
