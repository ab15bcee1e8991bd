"""Pieces the cuTile backward's kernels share: the compile-time constants every kernel takes (copy hints, the
exponential's base, tf32), tiles of (batch, seqlen, heads or groups, channels) tensors and of the states in either
memory order, the gated incoming gradient dŷ = dy ⊙ silu(z), a group's share of heads and the atomic adds of switch
bwd_group_split, and the host's stand-ins and launch options."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import cuda.tile as ct
import torch

from impls.cutile.common import LOG2E, ArraySpec, CopyHints, KernelCall, _param_names, _with_int64_index, needs_int64

ZERO = ct.PaddingMode.ZERO


@dataclass(frozen=True)
class Hints(CopyHints):
    """What every backward kernel's helpers read of its `ct.Constant` parameters (built once in the kernel; its
    fields stay compile-time constants, as `compute_out.OutConsts`'s)."""

    TMA: bool  # switch tma: TMA bulk copies allowed
    LAT: int  # latency hint of the big loads; 0 = none
    EXP2: bool  # switch exp2: dA_cumsum scaled by log2(e) once per load, decays by exp2
    TF32: bool  # fp32 inputs through the tf32 tensor cores
    FTZ: bool  # switch bwd_exp2_ftz: the exp2 flushes subnormal inputs and results to zero

    def base(self):
        """The factor that takes dA_cumsum into the exponential's base (log2 e with exp2, else 1)."""
        return LOG2E if self.EXP2 else 1.0

    def exp(self, v):
        """exp of `v`, already in the exponential's base."""
        if self.EXP2:
            return ct.exp2(v, flush_to_zero=self.FTZ)
        return ct.exp(v)

    def mma(self, a, b, acc):
        if self.TF32:
            return ct.mma(a.astype(ct.tfloat32), b.astype(ct.tfloat32), acc)
        return ct.mma(a, b, acc)


def rows(t, b, block, hg, cb, BL, BC, k):
    """The (BL, BC) tile of rows block·BL … and channels cb·BC … of a (batch, seqlen, heads or groups, channels)
    tensor at head or group `hg`, as stored; rows past seqlen and channels past the last read as zero."""
    tile = ct.load(t, (b, block, hg, cb), (1, BL, 1, BC), padding_mode=ZERO, allow_tma=k.tma(), latency=k.lat())
    return tile.reshape((BL, BC))


def per_position(t, b, h, c, block, BL, k):
    """The (BL,) slice block·BL … of chunk c of a (batch, heads, nchunks, chunk) fp32 tensor (dt, dA_cumsum)."""
    return ct.load(t, (b, h, c, block), (1, 1, 1, BL), allow_tma=k.tma()).reshape((BL,))


def gated_dy(dy, z, b, block, h, pb, BL, BP, HAS_Z, k):
    """dŷ = dy ⊙ silu(z) (dy without z) as an fp32 (BL, BP) tile of `rows` (headdim block pb)."""
    g = rows(dy, b, block, h, pb, BL, BP, k).astype(ct.float32)
    if HAS_Z:
        zz = rows(z, b, block, h, pb, BL, BP, k).astype(ct.float32)
        g = g * zz / (1.0 + k.exp(-zz * k.base()))
    return g


def dy_tiles(dy, z, b, block, h, pb, BL, BP, HAS_Z, dtype, k):
    """(dŷ's (BL, BP) tile as an MMA operand in `dtype`, the same tile in fp32). Without z the operand is the tile as
    loaded: a round trip through fp32 would make the MMA read a converted copy that the warps write to shared memory,
    not the copy engine's tile. With z the gated fp32 tile, converted for the MMA."""
    if HAS_Z:
        gated = gated_dy(dy, z, b, block, h, pb, BL, BP, HAS_Z, k)
        return gated.astype(dtype), gated
    tile = rows(dy, b, block, h, pb, BL, BP, k).astype(dtype)
    return tile, tile.astype(ct.float32)


def state_tile(states, b, c, h, pb, nb, BP, BN, TRANS, k):
    """The (BP, BN) = (headdim, dstate) tile (pb, nb) of the state of chunk c in a 5-d (batch, nchunks, heads, …)
    storage, (…, dstate, headdim) when TRANS else (…, headdim, dstate), as stored."""
    if TRANS:
        st = ct.load(states, (b, c, h, nb, pb), (1, 1, 1, BN, BP), padding_mode=ZERO, allow_tma=k.tma(),
                     latency=k.lat())
        return ct.transpose(st.reshape((BN, BP)))
    st = ct.load(states, (b, c, h, pb, nb), (1, 1, 1, BP, BN), padding_mode=ZERO, allow_tma=k.tma(), latency=k.lat())
    return st.reshape((BP, BN))


def head_share(gp, heads_per_group, SPLIT):
    """(group g, the share's heads [lo, hi) within the group) of partial `gp` = g·SPLIT + p of a per-group kernel
    (switch bwd_group_split): heads [p·H/SPLIT, (p+1)·H/SPLIT) of H = heads_per_group; SPLIT 1: every head."""
    part = gp % SPLIT
    return gp // SPLIT, part * heads_per_group // SPLIT, (part + 1) * heads_per_group // SPLIT


def add_rows(t, b, positions, hg, tile, BL, BC):
    """Float atomic adds (relaxed) of an fp32 (BL, BC) tile into rows `positions` (BL,) and channels 0 … BC − 1 of a
    (batch, seqlen, groups, channels) fp32 array at batch row b, group hg (switch bwd_atomics); rows past seqlen and
    channels past the last are dropped."""
    channels = ct.arange(BC, dtype=ct.int32).reshape((1, BC))
    ct.atomic_add(t, (b, positions.reshape((BL, 1)), hg, channels), tile, memory_order=ct.MemoryOrder.RELAXED)


def allocate(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """`torch.empty` in the (shape, dtype, device) form the chunked backward's host helpers take."""
    return torch.empty(shape, dtype=dtype, device=device)


def chunk_length(seqlen, c, CHUNK):
    """Tokens of chunk c (CHUNK but in the last chunk of a sequence that is not a multiple of it)."""
    return ct.minimum(CHUNK, seqlen - c * CHUNK)


def kernel_call(pyfunc, grid, args, config: dict, opt_level: int) -> KernelCall:
    """The launch of `pyfunc` on `args` with the config's compiler hints: `occupancy` (CTAs per SM, 0 = the
    compiler's choice) and `worker_warps` (math warps of the warp-specialised kernel, `ct.kernel(num_worker_warps=)`,
    0 = the compiler's choice: one warpgroup; 8 has two warpgroups share every MMA of the tile, which is what takes the
    chunk and dcb kernels' 64-wide tiles off local memory on sm_90); the int64-indexed build when any array's offsets
    pass 2^31, as the forward's stages (`impls.cutile.common.kernel_call`)."""
    wide = any(map(needs_int64, args))
    arrays = ()
    if wide:
        arrays = tuple(n for n, a in zip(_param_names(pyfunc), args) if isinstance(a, (torch.Tensor, ArraySpec)))
    kernel = _kernel(pyfunc, config.get("occupancy", 0), config.get("worker_warps", 0), arrays, opt_level)
    return KernelCall(kernel, tuple(grid), tuple(args), wide)


@functools.cache
def _kernel(pyfunc, occupancy: int, worker_warps: int, int64_arrays: tuple[str, ...], opt_level: int):
    fn = _with_int64_index(pyfunc, int64_arrays) if int64_arrays else pyfunc
    return ct.kernel(fn, occupancy=occupancy or None, opt_level=opt_level, num_worker_warps=worker_warps or None)


def state_storage(states: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """(the 5-d storage a kernel reads, whether it is (…, dstate, headdim)) of the states' logical (batch, nchunks,
    heads, headdim, dstate) view: the forward's transposed_layout hands back a transposed view of a dstate-major
    storage; a copy only where neither last dimension is contiguous."""
    if states.stride(-1) != 1 and states.stride(-2) == 1:
        return states.transpose(-1, -2), True
    return (states if states.stride(-1) == 1 else states.contiguous()), False


def unit_last(t: torch.Tensor) -> torch.Tensor:
    """`t` itself where its last dimension is contiguous, else a contiguous copy (an incoming gradient from autograd
    may be an expanded or strided view)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def or_stand_in(t: torch.Tensor | None, device, dtype: torch.dtype, ndim: int) -> torch.Tensor:
    """`t`, or for an absent optional tensor the shared 1-element stand-in of its dtype and rank (the kernel neither
    reads nor writes it: a constant says so)."""
    from impls.cutile.common import dummy

    return t if t is not None else dummy(device, dtype, ndim)
