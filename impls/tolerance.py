"""The one tolerance table: relative error ‖out − ref‖ / ‖ref‖ against the float64 reference, per dtype, judged
over the whole tensor and block by block (`blockwise_err`: every (batch, chunk, head) block of y and of the chunk
states, every (batch, head) of the final states, every (batch, head, chunk) of dt and dA_cumsum)."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch

REL_TOL: dict[torch.dtype, float] = {
    torch.float64: 1e-10,
    torch.float32: 1e-4,
    torch.float16: 5e-3,
    torch.bfloat16: 2e-2,
}
TF32_REL_TOL = 2e-3  # float32 inputs through a tf32 matmul
MAMBA_SSM_FACTOR = 2.0  # on the GPU a backend's error must also be <= 2x mamba-ssm's on the same inputs


def tolerance(dtype: torch.dtype, tf32: bool = False, state_dtype: torch.dtype | None = None) -> float:
    """The input dtype's tolerance (tf32's for float32 through a tf32 matmul); with `state_dtype` (the stages that
    store or read the chunk states: all but chunk_cumsum) the looser of that and the state dtype's, since states
    stored in fp16 on float32 inputs cannot be closer than fp16 allows."""
    tol = TF32_REL_TOL if dtype == torch.float32 and tf32 else REL_TOL[dtype]
    return max(tol, REL_TOL[state_dtype]) if state_dtype is not None else tol


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64; NaN or inf anywhere in out gives inf (never passes)."""
    out64, ref64 = out.detach().to(torch.float64), ref.detach().to(device=out.device, dtype=torch.float64)
    if out64.shape != ref64.shape:
        raise ValueError(f"out: expected shape {tuple(ref64.shape)}, got {tuple(out64.shape)}")
    if not bool(torch.isfinite(out64).all()):
        return float("inf")
    denom = torch.linalg.vector_norm(ref64).item()
    num = torch.linalg.vector_norm(out64 - ref64).item()
    return num / denom if denom > 0 else num


# A block whose reference norm is near zero (states entering chunk 0 without initial states, an empty sequence's
# state) has no scale of its own to be relative to. Its error is bounded by tol × NEAR_ZERO × the norm a block of
# its size holds on average in this tensor, ‖ref‖ / sqrt(number of blocks) (the tensor's RMS scaled to the block's
# size): rounding in a kernel scales with the magnitude of the terms it sums, and those have the tensor's typical
# magnitude. Formally each block passes when ‖Δ_b‖ ≤ tol · max(‖ref_b‖, NEAR_ZERO · ‖ref‖ / sqrt(blocks)): blocks
# at least NEAR_ZERO of the typical block norm are judged purely relatively. NEAR_ZERO = 0.1 keeps heads whose
# magnitude is below the others' (per-head step sizes span 1e-3..1e-1, impls/inputs.py) judged relatively down to
# a tenth of the typical block, while an exactly-zero block must be zero to within a tenth of the error an average
# block may have.
NEAR_ZERO = 0.1


@dataclass(frozen=True)
class BlockErr:
    """The worst block of a block-wise comparison: its ratio ‖Δ_b‖ / max(‖ref_b‖, floor_b) (≤ tol to pass;
    inf for NaN/inf in out), its block index per dimension, and whether the absolute bound judged it."""

    ratio: float
    where: tuple[int, ...]
    near_zero: bool


def _block_sums(t: torch.Tensor, block: tuple[int, ...]) -> torch.Tensor:
    """Sums of `t` over tiles of extents `block` (None: the whole dimension), the last tile of a dimension
    padded with zeros: one entry per block."""
    sizes = [d if b is None else b for b, d in zip(block, t.shape)]
    pads = []
    for size, d in zip(reversed(sizes), reversed(t.shape)):
        pads += [0, -d % size]
    t = torch.nn.functional.pad(t, pads) if any(pads) else t
    tiled = t.reshape([n for size, d in zip(sizes, t.shape) for n in (d // size, size)])
    return tiled.sum(dim=tuple(range(1, tiled.dim(), 2)))


SLAB_ELEMENTS = 1 << 26  # blockwise_err converts this many elements to float64 at a time (bounded memory)


def blockwise_err(out: torch.Tensor, ref: torch.Tensor, block: tuple[int | None, ...]) -> BlockErr:
    """The worst block of ‖out − ref‖ / ‖ref‖ over tiles of extents `block` (one per dimension, None for the whole
    dimension), in float64; blocks with near-zero reference norm judged by the bound above NEAR_ZERO. Works
    through slabs of whole blocks along dimension 1, so its float64 copies stay bounded at any size."""
    if out.shape != ref.shape:
        raise ValueError(f"out: expected shape {tuple(ref.shape)}, got {tuple(out.shape)}")
    if len(block) != ref.dim():
        raise ValueError(f"block: expected {ref.dim()} extents (one per dimension), got {block}")
    if ref.numel() == 0:
        return BlockErr(0.0, (), False)
    extents = tuple(d if b is None else b for b, d in zip(block, ref.shape))
    if not bool(torch.isfinite(out).all()):
        bad = (~torch.isfinite(out)).nonzero()[0].tolist()
        return BlockErr(math.inf, tuple(i // e for i, e in zip(bad, extents)), False)
    axis = 1 if ref.dim() > 1 else 0
    per_block = max(1, ref.numel() // ref.shape[axis] * extents[axis])
    step = extents[axis] * max(1, SLAB_ELEMENTS // per_block)
    err2, ref2 = [], []
    for start in range(0, ref.shape[axis], step):
        length = min(step, ref.shape[axis] - start)
        o = out.detach().narrow(axis, start, length).to(torch.float64)
        r = ref.detach().narrow(axis, start, length).to(device=out.device, dtype=torch.float64)
        err2.append(_block_sums((o - r).square_(), extents))  # o and r may be the caller's tensors: no in-place
        ref2.append(_block_sums(r.square(), extents))
    err2, ref2 = torch.cat(err2, dim=axis), torch.cat(ref2, dim=axis)
    floor2 = (NEAR_ZERO ** 2) * ref2.mean()  # NEAR_ZERO × the norm of the average block, squared
    denom2 = torch.maximum(ref2, floor2)
    ratio2 = torch.where(denom2 > 0, err2 / denom2.clamp(min=torch.finfo(torch.float64).tiny), err2)
    worst = int(ratio2.argmax())
    where = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), ratio2.shape))
    return BlockErr(math.sqrt(float(ratio2.flatten()[worst])), where, bool(ref2.flatten()[worst] < floor2))


def output_blocks(name: str, chunk_size: int) -> tuple[tuple[int | None, ...], tuple[str, ...]]:
    """The blocks each output is judged by, and the names of the block index's dimensions:
    y (batch, chunk, head); states (batch, chunk, head); final and per-sequence states (batch or sequence,
    head); dt and dA_cumsum (batch, head, chunk)."""
    return _OUTPUT_BLOCKS[name](chunk_size)


_OUTPUT_BLOCKS = {
    "y": lambda q: ((1, q, 1, None), ("batch", "chunk", "head", "")),
    "states": lambda q: ((1, 1, 1, None, None), ("batch", "chunk", "head", "", "")),
    "final_states": lambda q: ((1, 1, None, None), ("batch", "head", "", "")),
    "varlen_states": lambda q: ((1, 1, None, None), ("sequence", "head", "", "")),
    "dt": lambda q: ((1, 1, 1, None), ("batch", "head", "chunk", "")),
    "dA_cumsum": lambda q: ((1, 1, 1, None), ("batch", "head", "chunk", "")),
}


def describe_block(where: tuple[int, ...], dims: tuple[str, ...]) -> str:
    """"batch 0, chunk 3, head 5" for a block index and its dimensions' names."""
    return ", ".join(f"{d} {i}" for i, d in zip(where, dims) if d)


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fills a float tensor with NaN (ints with their minimum), so reads of unwritten memory show."""
    if t.is_floating_point():
        return t.fill_(float("nan"))
    return t.fill_(torch.iinfo(t.dtype).min)


@contextlib.contextmanager
def poisoned_allocations():
    """Within the block, torch.empty / empty_like / empty_strided / Tensor.new_empty return poisoned tensors
    (NaN for floats, the minimum for integers), so a kernel that leaves part of its (internally allocated)
    output unwritten shows it instead of passing on stale memory."""
    originals = {name: getattr(torch, name) for name in ("empty", "empty_like", "empty_strided")}
    new_empty = torch.Tensor.new_empty

    def poisoning(fn):
        def allocate(*args, **kwargs):
            t = fn(*args, **kwargs)
            if t.numel():
                poison_(t)
            return t

        return allocate

    try:
        for name, fn in originals.items():
            setattr(torch, name, poisoning(fn))
        torch.Tensor.new_empty = poisoning(new_empty)
        yield
    finally:
        for name, fn in originals.items():
            setattr(torch, name, fn)
        torch.Tensor.new_empty = new_empty
