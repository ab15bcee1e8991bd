"""Shared pieces of the cuTile stages: the lazy `cuda.tile` import, kernel objects per compiler option, tile-size
arithmetic, and the argument descriptions that both the launcher and the ahead-of-time (AOT) compiler use.

Every stage module describes its kernel call as `KernelCall(kernel, grid, args)` where `args` mixes torch tensors
(or `ArraySpec` placeholders when compiling ahead of time, without a GPU) and compile-time constants. One
description feeds `ct.launch` at run time and `cuda.tile.compilation.export_kernel` in the CPU tests, so the code
that the tests disassemble is the code that runs.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import torch

LOG2E = 1.4426950408889634  # exp(v) == exp2(v * LOG2E)
LN2 = 0.6931471805599453
INT32_LIMIT = 2**31 - 1  # cuTile arrays index with int32 unless annotated IndexedWithInt64
DEFAULT_OPT_LEVEL = 3  # `ct.kernel(opt_level=)`'s default in cuda-tile 1.7 (tileiras -O3; it takes 0..3)


def next_pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, n))))


@dataclass(frozen=True)
class ArraySpec:
    """A tensor argument as the AOT compiler sees it: dtype, rank, and whether its last dimension is contiguous."""

    dtype: torch.dtype
    ndim: int
    unit_last_stride: bool = True
    wide: bool = False  # its element offsets pass 2^31 (the kernel then indexes every array with int64)

    @classmethod
    def like(cls, t: torch.Tensor) -> ArraySpec:
        return cls(t.dtype, t.dim(), t.stride(-1) == 1, needs_int64(t))


def span(t: torch.Tensor) -> int:
    """1 + the largest element offset a kernel may form into `t` (its numel when contiguous, more for views)."""
    return 1 + sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride()) if n > 0)


def needs_int64(t) -> bool:
    if isinstance(t, ArraySpec):
        return t.wide
    if not isinstance(t, torch.Tensor):
        return False
    if t.is_contiguous():  # then its span is its numel: no walk over the strides (this runs per launch argument)
        return t.numel() > INT32_LIMIT
    return span(t) > INT32_LIMIT


class CopyHints:
    """The copy hints of a stage's compile-time constants (a frozen dataclass with fields TMA and LAT, built in the
    kernel and handed to its helpers): `tma()` is the loads' and stores' allow_tma= (None lets the compiler decide,
    False forbids TMA), `lat()` the big loads' latency= (None without a hint)."""

    def tma(self):
        return None if self.TMA else False

    def lat(self):
        return self.LAT if self.LAT > 0 else None


@dataclass
class KernelCall:
    """One launch: the kernel object (with its compiler options), its grid, its positional arguments; `wide` when
    the kernel indexes its arrays with int64; `pdl` when it is launched as a programmatic dependent launch (switch
    pdl: the kernel then waits for its predecessor itself, see `launch`)."""

    kernel: Any
    grid: tuple[int, ...]
    args: tuple
    wide: bool = False
    pdl: bool = False


@functools.cache
def _param_names(pyfunc) -> tuple[str, ...]:
    import inspect

    return tuple(inspect.signature(pyfunc).parameters)


def kernel_call(pyfunc, grid, args, occupancy: int = 0, opt_level: int = DEFAULT_OPT_LEVEL,
                pdl: bool = False) -> KernelCall:
    """The launch of `pyfunc` on `args`: the int64-indexed build of the kernel when any array's offsets pass 2^31
    (int32 otherwise: cheaper address arithmetic). Runs on every stage call: the signature is read once."""
    wide = any(map(needs_int64, args))
    arrays = ()
    if wide:
        arrays = tuple(n for n, a in zip(_param_names(pyfunc), args) if isinstance(a, (torch.Tensor, ArraySpec)))
    return KernelCall(kernel_for(pyfunc, occupancy, arrays, opt_level), tuple(grid), tuple(args), wide, pdl)


@functools.cache
def kernel_for(pyfunc, occupancy: int = 0, int64_arrays: tuple[str, ...] = (), opt_level: int = DEFAULT_OPT_LEVEL):
    """The `ct.kernel` of a Python function, one object per occupancy hint (0 = compiler's choice), per set of
    parameters annotated `ct.IndexedWithInt64` (empty = all int32) and per optimisation level (switch opt_level,
    `ct.kernel(opt_level=)`, passed to tileiras as -O<level>)."""
    import cuda.tile as ct

    fn = _with_int64_index(pyfunc, int64_arrays) if int64_arrays else pyfunc
    return ct.kernel(fn, occupancy=occupancy or None, opt_level=opt_level)


def _with_int64_index(pyfunc, names: tuple[str, ...]):
    """A copy of the kernel function (same code, so the same source for cuTile's front end) whose array parameters
    `names` carry the `ct.IndexedWithInt64` annotation: shapes, strides and offsets in int64."""
    import types
    import typing

    import cuda.tile as ct

    clone = types.FunctionType(pyfunc.__code__, pyfunc.__globals__, pyfunc.__name__, pyfunc.__defaults__,
                               pyfunc.__closure__)
    clone.__qualname__, clone.__module__ = pyfunc.__qualname__, pyfunc.__module__
    hints = typing.get_type_hints(pyfunc, include_extras=True)
    clone.__annotations__ = {**hints, **{n: ct.IndexedWithInt64 for n in names}}
    return clone


def ct_dtype(dtype: torch.dtype):
    import cuda.tile as ct

    return {torch.float32: ct.float32, torch.float16: ct.float16, torch.bfloat16: ct.bfloat16,
            torch.int32: ct.int32, torch.int64: ct.int64, torch.float64: ct.float64}[dtype]


_DUMMIES: dict[tuple, torch.Tensor] = {}


def dummy(device, dtype=torch.float32, ndim: int = 1) -> torch.Tensor:
    """A 1-element stand-in for an absent optional tensor (the kernel neither reads nor writes it: a constant says
    so). One per (device, dtype, ndim), made once: a fresh one per call cost an allocation and a fill kernel per
    absent input. One first asked for during CUDA-graph capture is not kept (it would live in the graph's pool)."""
    key = (torch.device(device), dtype, ndim)
    t = _DUMMIES.get(key)
    if t is None:
        t = torch.zeros((1,) * ndim, device=device, dtype=dtype)
        if not (t.is_cuda and torch.cuda.is_current_stream_capturing()):
            _DUMMIES[key] = t
    return t


# Programmatic dependent launch (switch pdl). `ct.launch(..., programmatic_dependent_launch=True)` lets the kernel
# start before its predecessor in the stream has finished (CUDA's programmatic stream serialization). Why the
# kernels so launched stay correct: the first statement of each (`if PDL:` at the top of the kernel) is
# `ct.grid_dependency_control_wait()`, which returns only once the predecessor grid has completed and its memory
# writes are visible; every load and every store of the kernel comes after it, so no read of a predecessor's output
# (dt and dA_cumsum from stage 1, the states or local states from stage 2, C·Bᵀ from cb_kernel) and no write over a
# buffer a predecessor may still read can happen early. cuTile keeps that order: its token pass treats the wait as a
# store to every array with acquire order (cuda/tile/_passes/token_order.py), so no memory operation moves above it.
# Completion is transitive: a kernel's CTAs all pass their wait before it completes, so compute_out's wait on stage
# 2 covers stage 1's outputs too. `ct.grid_dependency_control_launch_dependents()` (chunk_cumsum and the dependent
# kernels, at their start) only lets the next dependent kernel be scheduled early; it promises nothing about memory,
# which that kernel's own wait covers. Launched without PDL, both instructions have nothing to wait for or release.
def launch(call: KernelCall) -> None:
    import cuda.tile as ct

    ct.launch(torch.cuda.current_stream(), call.grid, call.kernel, call.args,
              programmatic_dependent_launch=call.pdl)

