"""How close an output must be to the float64 reference: the gate's same-precision bound (`judge`: k × what the
chunked reference achieves at the backend's own precision, block by block), and the flat tolerance table per dtype
(where no same-precision computation is at hand: the tests' own checks, the sampled and fp32 references), both on
the relative error ‖out − ref‖ / ‖ref‖ over the whole tensor and block by block (`block_ratios`: every (batch, chunk,
head) block of y and of the chunk states, every (batch, head) of the final states, every (batch, head, chunk) of dt
and dA_cumsum)."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensor

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


def block_ratios(out: torch.Tensor, ref: torch.Tensor,
                 block: tuple[int | None, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per block of extents `block` (one per dimension, None for the whole dimension), in float64: the ratio
    ‖out_b − ref_b‖ / max(‖ref_b‖, NEAR_ZERO · the average block's norm), and whether that block was judged by the
    near-zero floor. NaN or inf in `out` gives an infinite ratio in its block. Works through slabs of whole blocks
    along dimension 1, so its float64 copies stay bounded at any size. Two outputs compared with one `ref` share
    the denominators, so their ratios compare block by block."""
    if out.shape != ref.shape:
        raise ValueError(f"out: expected shape {tuple(ref.shape)}, got {tuple(out.shape)}")
    if len(block) != ref.dim():
        raise ValueError(f"block: expected {ref.dim()} extents (one per dimension), got {block}")
    extents = tuple(d if b is None else b for b, d in zip(block, ref.shape))
    axis = 1 if ref.dim() > 1 else 0
    per_block = max(1, ref.numel() // max(1, ref.shape[axis]) * extents[axis])
    step = extents[axis] * max(1, SLAB_ELEMENTS // per_block)
    err2, ref2, bad = [], [], []
    for start in range(0, ref.shape[axis], step):
        length = min(step, ref.shape[axis] - start)
        o = out.detach().narrow(axis, start, length).to(torch.float64)
        r = ref.detach().narrow(axis, start, length).to(device=out.device, dtype=torch.float64)
        finite = torch.isfinite(o)
        bad.append(_block_sums((~finite).to(torch.float64), extents) > 0)
        diff = torch.where(finite, o - r, torch.zeros_like(o))  # o and r may be the caller's tensors: no in-place
        err2.append(_block_sums(diff.square(), extents))
        ref2.append(_block_sums(r.square(), extents))
    err2, ref2, bad = torch.cat(err2, dim=axis), torch.cat(ref2, dim=axis), torch.cat(bad, dim=axis)
    denom2 = _denominators2(ref2)
    ratio2 = torch.where(denom2 > 0, err2 / denom2.clamp(min=torch.finfo(torch.float64).tiny), err2)
    ratio = ratio2.sqrt().masked_fill(bad, math.inf)
    return ratio, ref2 < denom2


def _denominators2(ref2: torch.Tensor) -> torch.Tensor:
    """Squared denominators from the blocks' squared reference norms: max(‖ref_b‖², (NEAR_ZERO × the average
    block's norm)²)."""
    return torch.maximum(ref2, (NEAR_ZERO ** 2) * ref2.mean())


def blockwise_err(out: torch.Tensor, ref: torch.Tensor, block: tuple[int | None, ...]) -> BlockErr:
    """The worst block of ‖out − ref‖ / ‖ref‖ over tiles of extents `block` (`block_ratios`)."""
    if out.shape != ref.shape:
        raise ValueError(f"out: expected shape {tuple(ref.shape)}, got {tuple(out.shape)}")
    if ref.numel() == 0:
        return BlockErr(0.0, (), False)
    ratio, near_zero = block_ratios(out, ref, block)
    return worst_block(ratio, near_zero)


def worst_block(score: torch.Tensor, near_zero: torch.Tensor) -> BlockErr:
    """The block of the largest `score` (a ratio per block), where it is and whether the near-zero floor judged it."""
    worst = int(torch.nan_to_num(score, nan=math.inf).flatten().argmax())
    where = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), score.shape))
    return BlockErr(float(score.flatten()[worst]), where, bool(near_zero.flatten()[worst]))


# The gate's bound tied to same precision (impls/README.md "The gate's bound"): each block's error may be at most
# SAME_PRECISION_K times that block's error in the chunked reference run at the backend's own precision
# (impls/reference/same_precision.py), floored at SAME_PRECISION_K times that computation's whole-tensor error (and
# at the float64 tolerance, for float64 inputs where that computation is the ground truth itself); the whole tensor
# likewise. One K for every backend; its margins are in impls/README.md.
SAME_PRECISION_K = 4.0
BOUND_FLOOR = REL_TOL[torch.float64]


@dataclass(frozen=True)
class Judged:
    """One output judged against the same-precision bound: its whole-tensor error and bound, its worst block by
    error (`block`) and by error over that block's bound (`binding`: ratio ≤ 1 passes)."""

    rel_err: float
    bound: float
    block: BlockErr
    binding: BlockErr

    @property
    def ok(self) -> bool:
        return math.isfinite(self.rel_err) and self.rel_err <= self.bound and self.binding.ratio <= 1.0


def judge(out: torch.Tensor, ref: torch.Tensor, same: torch.Tensor, block: tuple[int | None, ...],
          k: float = SAME_PRECISION_K, floor: torch.Tensor | None = None, least: float = BOUND_FLOOR) -> Judged:
    """`out` against the float64 `ref`, bounded block by block by k × the error of `same` (the same-precision
    computation of the same output) on the same blocks, floored at k × `same`'s whole-tensor error (itself at least
    `least`) and, where given, at k × `floor` (one absolute error norm per block: what a sum's terms' rounding alone
    makes)."""
    if same.shape != ref.shape:
        raise ValueError(f"same: expected shape {tuple(ref.shape)}, got {tuple(same.shape)}")
    err = rel_err(out, ref)
    floor_whole = max(rel_err(same, ref), least)
    if floor is not None:  # the whole tensor likewise: the blocks' floors together, relative to the whole
        ref_norm = torch.linalg.vector_norm(ref.detach().to(torch.float64)).item()
        floor_norm = torch.linalg.vector_norm(floor.to(torch.float64)).item()
        floor_whole = max(floor_whole, floor_norm / ref_norm if ref_norm > 0 else floor_norm)
    if ref.numel() == 0:
        none = BlockErr(0.0, (), False)
        return Judged(err, k * floor_whole, none, none)
    ratio, near_zero = block_ratios(out, ref, block)
    same_ratio, _ = block_ratios(same, ref, block)
    if floor is not None:  # absolute norms per block, in the ratios' units (the same denominators)
        same_ratio = torch.maximum(same_ratio, floor.to(torch.float64) / block_denominators(ref, block))
    bound = k * torch.clamp(same_ratio, min=floor_whole)
    return Judged(err, k * floor_whole, worst_block(ratio, near_zero), worst_block(ratio / bound, near_zero))


def block_denominators(ref: torch.Tensor, block: tuple[int | None, ...]) -> torch.Tensor:
    """The denominator `block_ratios` divides each block's error norm by: max(‖ref_b‖, NEAR_ZERO × the average
    block's norm) (for the small outputs a floor is given for: no slabs)."""
    extents = tuple(d if b is None else b for b, d in zip(block, ref.shape))
    ref2 = _block_sums(ref.detach().to(torch.float64).square(), extents)
    return _denominators2(ref2).sqrt().clamp(min=torch.finfo(torch.float64).tiny)


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
    """Fills a float tensor with NaN (ints with their minimum, bools with True), so reads of unwritten memory
    show."""
    if t.is_floating_point() or t.is_complex():
        return t.fill_(float("nan"))
    if t.dtype == torch.bool:
        return t.fill_(True)
    return t.fill_(torch.iinfo(t.dtype).min)


@contextlib.contextmanager
def poisoned_allocations():
    """Within the block, torch.empty / empty_like / empty_strided / Tensor.new_empty return poisoned tensors
    (NaN for floats, the minimum for integers), so a kernel that leaves part of its (internally allocated)
    output unwritten shows it instead of passing on stale memory. Tensors without storage (a compiler's fake or
    meta tensors, traced inside the block) are left as they are."""
    originals = {name: getattr(torch, name) for name in ("empty", "empty_like", "empty_strided")}
    new_empty = torch.Tensor.new_empty

    def poisoning(fn):
        def allocate(*args, **kwargs):
            t = fn(*args, **kwargs)
            if t.numel() and t.device.type != "meta" and not isinstance(t, FakeTensor):
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
