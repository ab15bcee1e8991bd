"""cuTile kernels run on CPU tensors, one tile program at a time, with torch standing in for `cuda.tile` (the subset
the backward's kernels and the forward's compute_out use: loads and stores in tile-space units, gathers, MMAs,
permutes and broadcasts, reductions, scans, elementwise math, compile-time unrolled loops).
A check of a kernel's indexing, masks and arithmetic where no GPU is: not of cuTile's compiler, of its code
generation or of its rounding (an MMA is fp32 over its operands as given, tf32 operands rounded to tf32).

`emulated_launches()`: within it, `impls.cutile.common.launch(call)` runs `call`'s Python function over its grid with
the stand-in in place of `ct` in the impls.cutile modules. Faithful where it matters for the checks: a load's index is
in units of the tile's shape, elements past an array's end read zero with `padding_mode=ZERO` and NaN without (where
cuTile leaves them undetermined), a store drops the elements past the end, a gather returns its padding value where
masked or out of bounds, an atomic add drops the elements out of bounds."""

from __future__ import annotations

import contextlib
import itertools
import math
import sys
import types

import torch

from instruments.intercept import patched

_program: list[tuple[int, ...]] = []  # the running program's (block ids, grid)


class PaddingMode:
    UNDETERMINED = "UNDETERMINED"
    ZERO = "ZERO"


def _tensor(v, like=None) -> torch.Tensor:
    if isinstance(v, torch.Tensor):
        return v
    return torch.tensor(v, dtype=like.dtype if isinstance(like, torch.Tensor) and like.is_floating_point()
                        else (torch.float32 if isinstance(v, float) else torch.int64))


def _scalars_or(fn, a, b):
    if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
        return None
    return fn(_tensor(a, b), _tensor(b, a))


def bid(axis: int) -> int:
    return _program[-1][0][axis]


def num_blocks(axis: int) -> int:
    return _program[-1][1][axis]


def _window(array: torch.Tensor, start: tuple[int, ...], shape: tuple[int, ...]):
    """(the in-bounds part of array[start : start + shape], the slices of the tile it fills)."""
    src, dst = [], []
    for s, n, size in zip(start, shape, array.shape):
        s = int(s)
        lo, hi = max(s, 0), min(s + n, size)
        hi = max(hi, lo)
        src.append(slice(lo, hi))
        dst.append(slice(lo - s, hi - s))
    return tuple(src), tuple(dst)


def load(array, index, shape, *, padding_mode=PaddingMode.UNDETERMINED, **_hints):
    shape = tuple(shape)
    start = tuple(int(i) * n for i, n in zip(index, shape))
    src, dst = _window(array, start, shape)
    # by name: the kernels' modules may hold cuda.tile's own PaddingMode.ZERO, taken when they were imported
    zero = str(getattr(padding_mode, "name", padding_mode)).upper() == "ZERO"
    fill = 0 if zero else (math.nan if array.is_floating_point() else -(2**31))
    tile = torch.full(shape, fill, dtype=array.dtype)
    tile[dst] = array[src]
    return tile


def store(array, index, tile, **_hints):
    tile = _tensor(tile)
    start = tuple(int(i) * n for i, n in zip(index, tile.shape))
    src, dst = _window(array, start, tuple(tile.shape))
    array[src] = tile[dst].to(array.dtype)


def gather(array, indices, *, mask=None, padding_value=0, **_hints):
    idx = tuple(int(i) for i in indices)
    inside = all(0 <= i < n for i, n in zip(idx, array.shape)) and (mask is None or bool(mask))
    return array[idx].clone() if inside else torch.tensor(padding_value, dtype=array.dtype)


def atomic_add(array, indices, update, *, check_bounds=True, **_order):
    """Adds `update` at the broadcast `indices` (a tuple of scalars and index tiles), those out of bounds dropped;
    in the emulator's one order (a GPU's is its own)."""
    idx = torch.broadcast_tensors(*(_tensor(i).to(torch.int64) for i in indices))
    vals = _tensor(update).to(array.dtype).expand(idx[0].shape)
    inside = torch.ones(idx[0].shape, dtype=torch.bool)
    for i, n in zip(idx, array.shape):
        inside &= (i >= 0) & (i < n)
    array.index_put_(tuple(i[inside] for i in idx), vals[inside], accumulate=True)


class MemoryOrder:
    RELAXED = "relaxed"
    ACQ_REL = "acq_rel"


def zeros(shape, dtype):
    return torch.zeros(tuple(shape), dtype=dtype)


def full(shape, fill_value, dtype):
    return torch.full(tuple(shape), fill_value, dtype=dtype)


def arange(size, *, dtype, start=0, step=1):
    return torch.arange(start, start + size * step, step, dtype=dtype)


def _tf32(t: torch.Tensor) -> torch.Tensor:
    """fp32 rounded to tf32's 10-bit mantissa (to nearest)."""
    bits = t.to(torch.float32).contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


TFLOAT32 = "tfloat32"


def astype(t, dtype):
    t = _tensor(t)
    if dtype == TFLOAT32:
        return _tf32(t)
    return t.to(dtype)


def mma(a, b, acc):
    return acc + a.to(torch.float32) @ b.to(torch.float32)


def broadcast_to(x, shape):
    return _tensor(x).expand(tuple(shape))


def transpose(x, axis0=None, axis1=None):
    if axis0 is None:
        return x.transpose(-1, -2)
    return x.transpose(axis0, axis1)


def permute(x, axes):
    return x.permute(*axes)


def static_iter(iterable):
    return iterable


def extract(x, index, shape):
    return x[tuple(slice(int(i) * n, (int(i) + 1) * n) for i, n in zip(index, shape))]


def where(cond, x, y):
    x_t = _tensor(x, y)
    return torch.where(_tensor(cond), x_t, _tensor(y, x_t))


def minimum(a, b, **_kw):
    found = _scalars_or(torch.minimum, a, b)
    return min(a, b) if found is None else found


def maximum(a, b, **_kw):
    found = _scalars_or(torch.maximum, a, b)
    return max(a, b) if found is None else found


def sum(x, axis=None, *, keepdims=False, **_kw):  # noqa: A001 - cuda.tile's name
    if axis is None:
        return x.sum()
    return x.sum(dim=axis, keepdim=keepdims)


def cumsum(x, axis=0, *, reverse=False, **_kw):
    if reverse:
        return x.flip(axis).cumsum(axis).flip(axis)
    return x.cumsum(axis)


def _unary(fn):
    return lambda v, **_kw: fn(_tensor(v).to(torch.float32) if not _tensor(v).is_floating_point() else _tensor(v))


def stand_in() -> types.SimpleNamespace:
    """The `ct` the kernels see under emulation."""
    return types.SimpleNamespace(
        bid=bid, num_blocks=num_blocks, load=load, store=store, gather=gather, atomic_add=atomic_add,
        MemoryOrder=MemoryOrder, zeros=zeros, full=full, arange=arange,
        astype=astype, mma=mma, transpose=transpose, permute=permute, broadcast_to=broadcast_to,
        static_iter=static_iter, extract=extract, where=where, minimum=minimum, maximum=maximum,
        sum=sum, cumsum=cumsum, exp=_unary(torch.exp), exp2=_unary(torch.exp2), log=_unary(torch.log),
        log2=_unary(torch.log2), PaddingMode=PaddingMode, float32=torch.float32, float16=torch.float16,
        bfloat16=torch.bfloat16, int32=torch.int32, int64=torch.int64, tfloat32=TFLOAT32)


class Emulation:
    """The stand-in swapped for `ct` in the loaded impls.cutile modules while a launch runs (only then: their host
    code keeps building real kernel objects, whose annotations name `ct`'s)."""

    def __init__(self):
        import cuda.tile as real_ct

        self.real, self.ct = real_ct, stand_in()

    @contextlib.contextmanager
    def swapped(self):
        modules = [m for name, m in list(sys.modules.items())
                   if name.startswith("impls.cutile") and getattr(m, "ct", None) is self.real]
        for module in modules:
            module.ct = self.ct
        try:
            yield
        finally:
            for module in modules:
                module.ct = self.real

    def run(self, call) -> None:
        """Every program of `call` (an impls.cutile.common.KernelCall) in turn, on its arguments."""
        pyfunc = call.kernel._pyfunc
        grid = tuple(call.grid) + (1,) * (3 - len(call.grid))
        with self.swapped():
            for z, y, x in itertools.product(range(grid[2]), range(grid[1]), range(grid[0])):
                _program.append(((x, y, z), grid))
                try:
                    pyfunc(*call.args)
                finally:
                    _program.pop()


@contextlib.contextmanager
def emulated_launches():
    """Within: every cuTile launch runs under emulation (`Emulation`; `torch.Tensor.astype` added for the tiles);
    everything put back on exit."""
    from impls.cutile import common

    with patched(torch.Tensor, astype=astype), patched(common, launch=Emulation().run):
        yield
