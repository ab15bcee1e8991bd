"""The map from the SSD contract to vLLM's varlen prefill call, and back (docs/peers.md derives it).

vLLM's `mamba_chunk_scan_combined_varlen` takes every sequence packed into one row of tokens (no batch axis) and
host-built chunk metadata, as its serving engine prepares it once per batch for all layers:

    cu_seqlens          (nseqs + 1,)   token offset of each sequence
    cu_chunk_seqlens    (nchunks + 1,) token offset of each chunk: chunks restart at every sequence start, so a
                                       sequence's last chunk may be short and no chunk spans two sequences
    last_chunk_indices  (nseqs,)       index of each sequence's last chunk
    seq_idx             (nchunks,)     the sequence of each chunk

Our batch of `b` rows of `seqlen` tokens is `b` packed sequences of `seqlen` (every chunk boundary a multiple of
chunk_size from the row's start, as the contract chunks a row); with cu_seqlens (batch 1) the sequences are the
contract's. Every step here is PyTorch or host work outside vLLM's kernels, so a harness can time it apart.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from impls import validate as check

STEPS = {
    "prepare.metadata": "cu_seqlens, cu_chunk_seqlens, last_chunk_indices and per-chunk seq_idx (int32), built on "
                        "the host and copied to the device: for a batch, from the shape alone, once per (batch, "
                        "seqlen, chunk_size, device) and then cached; with cu_seqlens, from its values on every "
                        "call (one device-to-host read of cu_seqlens: a synchronisation)",
    "prepare.flatten": "x, dt, B, C, z: (batch, seqlen, ...) -> (batch·seqlen, ...) views (a copy only when the "
                       "two leading axes cannot merge)",
    "prepare.initial_states": "with cu_seqlens and an initial state: one state per sequence, zeros for every "
                              "sequence but the first (a (nseqs, nheads, headdim, dstate) tensor); then cast to "
                              "the dtype of vLLM's chunk states (state_dtype, else C's), which its chunk_scan needs "
                              "(a copy when the dtypes differ: fp32 initial states with bf16 inputs are rounded "
                              "to bf16, as vLLM's own state cache would hold them)",
    "prepare.outputs": "y (batch·seqlen, nheads, headdim) in x's dtype and the final states (nseqs, nheads, "
                       "headdim, dstate) fp32, allocated for vLLM to write (its `out` and `final_states_out` with "
                       "slot indices 0..nseqs-1, int32)",
    "finish": "y viewed as (batch, seqlen, nheads, headdim); final states: per row (batch) or the last "
              "sequence's with every sequence's as varlen_states (cu_seqlens); views only",
}


@dataclass(frozen=True)
class ChunkLayout:
    """vLLM's chunk metadata, as host lists."""

    cu_seqlens: tuple[int, ...]
    cu_chunk_seqlens: tuple[int, ...]
    last_chunk_indices: tuple[int, ...]
    seq_idx: tuple[int, ...]

    @property
    def nseqs(self) -> int:
        return len(self.cu_seqlens) - 1

    @property
    def nchunks(self) -> int:
        return len(self.cu_chunk_seqlens) - 1


def chunk_layout(cu_seqlens: list[int], chunk_size: int) -> ChunkLayout:
    """Chunks of `chunk_size` tokens restarting at every sequence start (vLLM's alignment)."""
    if chunk_size <= 0:
        raise ValueError(f"chunk_size: expected a positive integer, got {chunk_size}")
    if not cu_seqlens or cu_seqlens[0] != 0 or any(b <= a for a, b in zip(cu_seqlens, cu_seqlens[1:])):
        raise ValueError(f"cu_seqlens: expected 0 followed by strictly increasing offsets, got {cu_seqlens}")
    bounds, last, seq_idx = [0], [], []
    for i, (start, end) in enumerate(zip(cu_seqlens, cu_seqlens[1:])):
        for chunk_start in range(start, end, chunk_size):
            bounds.append(min(chunk_start + chunk_size, end))
            seq_idx.append(i)
        last.append(len(seq_idx) - 1)
    return ChunkLayout(tuple(cu_seqlens), tuple(bounds), tuple(last), tuple(seq_idx))


def batch_layout(batch: int, seqlen: int, chunk_size: int) -> ChunkLayout:
    """A batch of `batch` rows as packed sequences of `seqlen` tokens each."""
    return chunk_layout([i * seqlen for i in range(batch + 1)], chunk_size)


@dataclass(frozen=True)
class Metadata:
    """ChunkLayout on the device, int32, with the final-state slot of each sequence."""

    cu_seqlens: torch.Tensor
    cu_chunk_seqlens: torch.Tensor
    last_chunk_indices: torch.Tensor
    seq_idx: torch.Tensor
    final_state_indices: torch.Tensor

    @classmethod
    def on(cls, layout: ChunkLayout, device) -> Metadata:
        def tensor(values):
            return torch.tensor(values, dtype=torch.int32).to(device)

        return cls(tensor(layout.cu_seqlens), tensor(layout.cu_chunk_seqlens), tensor(layout.last_chunk_indices),
                   tensor(layout.seq_idx), tensor(list(range(layout.nseqs))))

    @property
    def nseqs(self) -> int:
        return self.last_chunk_indices.shape[0]


_BATCH_METADATA: dict[tuple, Metadata] = {}


def batch_metadata(batch: int, seqlen: int, chunk_size: int, device, cached: bool = True) -> Metadata:
    """Metadata of a batch (a function of the shape alone); cached per (batch, seqlen, chunk_size, device)."""
    key = (batch, seqlen, chunk_size, str(torch.device(device)))
    if cached and key in _BATCH_METADATA:
        return _BATCH_METADATA[key]
    meta = Metadata.on(batch_layout(batch, seqlen, chunk_size), device)
    if cached:
        _BATCH_METADATA[key] = meta
    return meta


def varlen_metadata(cu_seqlens: torch.Tensor, chunk_size: int, seqlen: int) -> Metadata:
    """Metadata of packed sequences: reads cu_seqlens on the host (a synchronisation on a GPU) and checks that
    the offsets end at seqlen: vLLM's kernels would write y past its end (heap corruption under the interpreter),
    or leave its tail unwritten."""
    bounds = [int(v) for v in cu_seqlens.tolist()]
    check.cu_seqlens_bounds(bounds, seqlen)
    return Metadata.on(chunk_layout(bounds, chunk_size), cu_seqlens.device)


@dataclass
class VarlenArgs:
    """Arguments of vLLM's mamba_chunk_scan_combined_varlen, plus what `finish` needs."""

    x: torch.Tensor  # (T, h, p)
    dt: torch.Tensor  # (T, h)
    A: torch.Tensor
    B: torch.Tensor  # (T, g, n)
    C: torch.Tensor
    chunk_size: int
    meta: Metadata
    out: torch.Tensor  # (T, h, p), x's dtype
    final_states: torch.Tensor  # (nseqs, h, p, n) fp32
    D: torch.Tensor | None
    z: torch.Tensor | None
    dt_bias: torch.Tensor | None
    initial_states: torch.Tensor | None  # (nseqs, h, p, n)
    dt_softplus: bool
    dt_limit: tuple[float, float]
    state_dtype: torch.dtype | None
    batch: int
    seqlen: int


def flat(t: torch.Tensor | None) -> torch.Tensor | None:
    """(batch, seqlen, ...) -> (batch·seqlen, ...): a view unless the two axes cannot merge."""
    return None if t is None else t.reshape(t.shape[0] * t.shape[1], *t.shape[2:])


def per_sequence_initial_states(initial_states, nseqs: int):
    """The contract's initial state applies to a row's first sequence: zeros for the others (cu_seqlens)."""
    if initial_states is None or initial_states.shape[0] == nseqs:
        return initial_states
    per_seq = initial_states.new_zeros(nseqs, *initial_states.shape[1:])
    per_seq[0] = initial_states[0]
    return per_seq


def in_states_dtype(initial_states, C, state_dtype):
    """vLLM's chunk_scan compiles only when the initial states have its chunk states' dtype (state_dtype, else C's):
    its kernel picks one pointer or the other per chunk (Triton: "Mismatched type for prev_states_ptr", seen on one
    NVIDIA H200 with bf16 inputs and fp32 initial states, 2026-12-04)."""
    states_dtype = state_dtype or C.dtype
    if initial_states is None or initial_states.dtype == states_dtype:
        return initial_states
    return initial_states.to(states_dtype)


def varlen_args(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None, cu_seqlens=None,
                dt_softplus=False, dt_limit=(0.0, float("inf")), state_dtype=None) -> VarlenArgs:
    batch, seqlen, nheads, headdim = x.shape
    if cu_seqlens is None:
        meta = batch_metadata(batch, seqlen, chunk_size, x.device)
    else:
        meta = varlen_metadata(cu_seqlens, chunk_size, batch * seqlen)
    out = torch.empty(batch * seqlen, nheads, headdim, dtype=x.dtype, device=x.device)
    final = torch.empty(meta.nseqs, nheads, headdim, B.shape[-1], dtype=torch.float32, device=x.device)
    return VarlenArgs(flat(x), flat(dt), A, flat(B), flat(C), chunk_size, meta, out, final, D, flat(z), dt_bias,
                      in_states_dtype(per_sequence_initial_states(initial_states, meta.nseqs), C, state_dtype),
                      dt_softplus,
                      tuple(float(v) for v in dt_limit), state_dtype, batch, seqlen)


def run(ssd_combined, args: VarlenArgs) -> None:
    """vLLM's kernels only: writes args.out and args.final_states."""
    m = args.meta
    ssd_combined.mamba_chunk_scan_combined_varlen(
        args.x, args.dt, args.A, args.B, args.C, args.chunk_size, m.cu_seqlens, m.cu_chunk_seqlens,
        m.last_chunk_indices, m.seq_idx, args.out, D=args.D, z=args.z, dt_bias=args.dt_bias,
        initial_states=args.initial_states, dt_softplus=args.dt_softplus, dt_limit=args.dt_limit,
        state_dtype=args.state_dtype, final_states_out=args.final_states, final_state_indices=m.final_state_indices)


def finish(args: VarlenArgs, varlen: bool):
    """-> (y (batch, seqlen, h, p), final states (batch, h, p, n) fp32, per-sequence states or None)."""
    y = args.out.view(args.batch, args.seqlen, *args.out.shape[1:])
    if varlen:
        return y, args.final_states[-1:], args.final_states
    return y, args.final_states, None
