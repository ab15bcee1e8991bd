"""An internal chunk behind the caller's (switch inner_chunk, cuTile and Triton): the chunk the forward's stages run
at, and the forward's per-chunk outputs converted to the caller's chunk (impls/README.md, "An internal chunk")."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from impls.registry import ForwardResult

INNER_CHUNKS = (0, 64, 128)  # the switch's choices; 0 = off, the stages run at the caller's chunk
PREFIX = "inner_"  # describe()'s and the timed parts' names of what ran at the inner chunk: inner_<stage>


def stage_chunk(inner: int, chunk_size: int, backend: str) -> int:
    """The chunk the forward's stages run at: `inner` where it is set and smaller than chunk_size (it must divide
    it), else chunk_size (at a chunk no larger than the inner one the switch changes nothing)."""
    if not inner or inner >= chunk_size:
        return chunk_size
    if chunk_size % inner:
        raise ValueError(f"switch inner_chunk={inner} of backend {backend!r}: the forward's stages would run at "
                         f"{inner}-token chunks, and chunk_size={chunk_size} is not a whole number of them "
                         f"(inner_chunk must divide chunk_size: use a multiple of {inner}, or inner_chunk=0)")
    return inner


def caller_dt(dt: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """Stage 1's dt (batch, nheads, inner nchunks, inner chunk) laid out per the caller's chunk (batch, nheads,
    nchunks, chunk_size): the same positions, the padded tail dt = 0 (a view where no padding is added)."""
    batch, nheads, nchunks, inner = dt.shape
    padded = -(-nchunks * inner // chunk_size) * chunk_size
    flat = dt.reshape(batch, nheads, nchunks * inner)
    if padded > nchunks * inner:
        flat = F.pad(flat, (0, padded - nchunks * inner))
    return flat.reshape(batch, nheads, padded // chunk_size, chunk_size)


def caller_dA_cumsum(dA_cumsum: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """Λ within every inner chunk -> Λ within every caller chunk: each inner chunk's values plus the sum of the
    inner chunks before it in the same caller chunk (their Λ at the last position); an inner chunk past the
    sequence's end counts as flat (Λ = 0 within it), so the caller chunk's padded tail stays flat."""
    batch, nheads, nchunks, inner = dA_cumsum.shape
    ratio = chunk_size // inner
    caller = -(-nchunks // ratio)
    if caller * ratio > nchunks:
        dA_cumsum = F.pad(dA_cumsum, (0, 0, 0, caller * ratio - nchunks))
    blocks = dA_cumsum.reshape(batch, nheads, caller, ratio, inner)
    before = torch.cumsum(blocks[..., :-1, -1], dim=-1)  # the decay of the inner chunks before each one
    offsets = F.pad(before, (1, 0))[..., None]
    return (blocks + offsets).reshape(batch, nheads, caller, chunk_size)


def caller_states(states: torch.Tensor | None, ratio: int) -> torch.Tensor | None:
    """The states entering every inner chunk (batch, inner nchunks, nheads, headdim, dstate) -> those entering every
    caller chunk: every `ratio`-th, as a view (the contract's strides are free: no copy, and the inner states' memory
    held while the view lives). None stays None (a fused forward that stores none)."""
    return None if states is None else states[:, ::ratio]


def to_caller_chunk(result: ForwardResult, chunk_size: int) -> ForwardResult:
    """The forward's result at the inner chunk as the caller's chunk gives it: y, the final states and the
    per-sequence states as they are (the same math); dt, dA_cumsum and the states converted."""
    inner = result.dt.shape[-1]
    return ForwardResult(result.y, result.final_states, result.varlen_states, caller_dt(result.dt, chunk_size),
                         caller_dA_cumsum(result.dA_cumsum, chunk_size),
                         caller_states(result.states, chunk_size // inner))


class InnerChunked:
    """The whole-forward entries of a backend with switch inner_chunk (cuTile, Triton): `ssd_forward` and
    `forward_parts` run its own `_forward` / `_own_parts`, at the inner chunk where the switch sets one
    (`InnerRuns`, kept as `self._inner`). Listed before Backend in the class's bases."""

    def ssd_forward(self, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
                    dt_softplus, dt_limit, state_dtype):
        args = _arguments(locals())
        inner = stage_chunk(self.switches.inner_chunk, chunk_size, self.name)
        return self._forward(**args) if inner == chunk_size else self._inner.forward(self._forward, args, inner)

    def forward_parts(self, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
                      dt_softplus, dt_limit, state_dtype):
        """The backend's own parts (fuse_state_out: the fused kernel on ready stage-1 outputs, timed as
        "part:fused_state_out"), or with inner_chunk the pieces at the inner chunk and the conversion
        (InnerRuns.parts)."""
        args = _arguments(locals())
        inner = stage_chunk(self.switches.inner_chunk, chunk_size, self.name)
        if inner == chunk_size:
            return self._own_parts(**args)
        return self._inner.parts(self, self._forward, self._own_parts, args, inner)


def _arguments(scope: dict) -> dict:
    """ssd_forward's keyword arguments from an entry's locals (self left out)."""
    return {k: v for k, v in scope.items() if k != "self"}


class InnerRuns:
    """Runs a backend's forward (and the parts of it the harness times apart) at the inner chunk and keeps what ran
    for describe(): the stage sources those calls record in `sources` (the backend's own per-stage dict) are moved
    out of it to inner_<stage> entries, and the entries of the caller-chunk stage calls left as they were."""

    def __init__(self, sources: dict):
        self.sources = sources
        self.last: dict | None = None

    @contextlib.contextmanager
    def running(self, inner: int, caller: int):
        """Within it the backend's calls run at chunk `inner`: what they record in `sources` goes to `last`."""
        before = dict(self.sources)
        self.sources.clear()
        try:
            yield
        finally:
            ran = {PREFIX + stage: dict(info) for stage, info in self.sources.items()}
            self.sources.clear()
            self.sources.update(before)
            same = self.last is not None and (self.last["chunk"], self.last["caller_chunk"]) == (inner, caller)
            self.last = {"chunk": inner, "caller_chunk": caller, "stages": {**(self.last["stages"] if same else {}),
                                                                            **ran}}

    def forward(self, forward: Callable[..., ForwardResult], args: dict, inner: int) -> ForwardResult:
        """`forward(**args)` at chunk `inner`, its result at args' chunk_size."""
        with self.running(inner, args["chunk_size"]):
            out = forward(**{**args, "chunk_size": inner})
        return to_caller_chunk(out, args["chunk_size"])

    def parts(self, backend, forward: Callable[..., ForwardResult], own_parts: Callable[..., dict], args: dict,
              inner: int) -> dict[str, Callable[[], object]]:
        """The forward's pieces at chunk `inner` as zero-argument calls on ready inputs (Backend.forward_parts):
        the backend's own parts there (the fused kernel) or else each stage on the previous stages' outputs, as
        inner_<name>, and the conversion to the caller's chunk, "to_caller_chunk"."""
        from impls.stages import FORWARD_STAGES, run_chain

        caller, inner_args = args["chunk_size"], {**args, "chunk_size": inner}
        with self.running(inner, caller):
            result = forward(**inner_args)
            own = own_parts(**inner_args)
            if not own:
                got = {name: t for outputs in run_chain(backend, inner_args).values() for name, t in outputs.items()}
                own = {stage.name: functools.partial(stage.call, backend, inner_args, got) for stage in FORWARD_STAGES}

        def aside(fn):
            def call():
                with self.running(inner, caller):
                    return fn()
            return call

        parts = {PREFIX + name: aside(fn) for name, fn in own.items()}
        parts["to_caller_chunk"] = functools.partial(to_caller_chunk, result, caller)
        return parts

    def describe(self) -> dict:
        """{"inner_chunk": the chunks of the last inner run, "tuning_sources": its stages' sources (read by the
        rows' tuning and tile_protocol columns)}; {} before any."""
        if self.last is None:
            return {}
        return {"inner_chunk": {k: v for k, v in self.last.items() if k != "stages"},
                "tuning_sources": {k: dict(v) for k, v in self.last["stages"].items()}}
