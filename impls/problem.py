"""What one SSD forward call asks for: its sizes and optional pieces, independent of any backend.

`Problem` is what `Backend.supports()` judges and what the harness records; `Problem.from_inputs` reads it off
the tensors of a call (metadata only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
}


def dtype_name(dtype: torch.dtype) -> str:
    for name, value in DTYPES.items():
        if value == dtype:
            return name
    raise ValueError(f"dtype: expected one of {sorted(DTYPES)}, got {dtype}")


@dataclass(frozen=True)
class Shape:
    """(batch, seqlen, nheads, headdim, ngroups, dstate, chunk_size): the seven numbers that size a problem."""

    batch: int
    seqlen: int
    nheads: int
    headdim: int
    ngroups: int
    dstate: int
    chunk_size: int

    @property
    def nchunks(self) -> int:
        return math.ceil(self.seqlen / self.chunk_size)

    @property
    def tokens(self) -> int:
        return self.batch * self.seqlen

    def as_tuple(self) -> tuple[int, ...]:
        # not dataclasses.astuple, which deep-copies: the tuning keys read it on every stage call
        return (self.batch, self.seqlen, self.nheads, self.headdim, self.ngroups, self.dstate, self.chunk_size)

    def label(self) -> str:
        return "b{}-l{}-h{}-p{}-g{}-n{}-c{}".format(*self.as_tuple())


@dataclass(frozen=True)
class Problem:
    """A shape plus the optional parts of the contract that a call uses."""

    shape: Shape
    dtype: str = "bfloat16"
    has_dt_bias: bool = True
    dt_softplus: bool = True
    dt_limit: tuple[float, float] = (0.0, math.inf)
    has_D: bool = True
    D_per_channel: bool = False  # D of shape (nheads, headdim) instead of (nheads,)
    has_z: bool = False
    has_initial_states: bool = False
    initial_states_per_sequence: bool = False  # initial_states (nseqs, ...): one per packed sequence (cu_seqlens)
    nseqs: int = 1  # >1: packed sequences, marked by seq_idx (and cu_seqlens when varlen)
    varlen: bool = False  # cu_seqlens given: final state of every sequence returned
    state_dtype: str | None = None  # None: the input dtype, as upstream

    def __post_init__(self):
        if self.initial_states_per_sequence and not (self.has_initial_states and self.varlen and self.nseqs >= 2):
            raise ValueError("initial_states_per_sequence: needs has_initial_states, varlen (cu_seqlens) and "
                             f"nseqs >= 2 (got has_initial_states={self.has_initial_states}, varlen={self.varlen}, "
                             f"nseqs={self.nseqs})")

    @property
    def has_seq_idx(self) -> bool:
        return self.nseqs > 1 or self.varlen

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def torch_state_dtype(self) -> torch.dtype:
        return DTYPES[self.state_dtype or self.dtype]

    @classmethod
    def from_inputs(
        cls,
        x: torch.Tensor,
        B: torch.Tensor,
        chunk_size: int,
        *,
        dt_bias=None,
        dt_softplus: bool = False,
        dt_limit=(0.0, math.inf),
        D=None,
        z=None,
        initial_states=None,
        seq_idx=None,
        cu_seqlens=None,
        state_dtype=None,
    ) -> Problem:
        batch, seqlen, nheads, headdim = x.shape
        ngroups, dstate = B.shape[2], B.shape[3]
        nseqs = cu_seqlens.shape[0] - 1 if cu_seqlens is not None else (2 if seq_idx is not None else 1)
        return cls(
            shape=Shape(batch, seqlen, nheads, headdim, ngroups, dstate, chunk_size),
            dtype=dtype_name(x.dtype),
            has_dt_bias=dt_bias is not None,
            dt_softplus=dt_softplus,
            dt_limit=tuple(float(v) for v in dt_limit),
            has_D=D is not None,
            D_per_channel=D is not None and D.dim() == 2,
            has_z=z is not None,
            has_initial_states=initial_states is not None,
            initial_states_per_sequence=per_sequence_initial_states(initial_states, x),
            nseqs=nseqs,
            varlen=cu_seqlens is not None,
            state_dtype=dtype_name(state_dtype) if state_dtype is not None else None,
        )


def per_sequence_initial_states(initial_states, x) -> bool:
    """Whether `initial_states` holds one state per packed sequence ((nseqs, ...) for the one row of x)."""
    return initial_states is not None and initial_states.shape[0] != x.shape[0]
