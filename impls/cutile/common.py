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


def next_pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, n))))


@dataclass(frozen=True)
class ArraySpec:
    """A tensor argument as the AOT compiler sees it: dtype, rank, and whether its last dimension is contiguous."""

    dtype: torch.dtype
    ndim: int
    unit_last_stride: bool = True

    @classmethod
    def like(cls, t: torch.Tensor) -> ArraySpec:
        return cls(t.dtype, t.dim(), t.stride(-1) == 1)


@dataclass
class KernelCall:
    """One launch: the kernel object (with its compiler options), its grid, its positional arguments."""

    kernel: Any
    grid: tuple[int, ...]
    args: tuple


@functools.cache
def kernel_for(pyfunc, occupancy: int = 0):
    """The `ct.kernel` of a Python function, one object per occupancy hint (0 = compiler's choice)."""
    import cuda.tile as ct

    return ct.kernel(pyfunc, occupancy=occupancy) if occupancy else ct.kernel(pyfunc)


def ct_dtype(dtype: torch.dtype):
    import cuda.tile as ct

    return {torch.float32: ct.float32, torch.float16: ct.float16, torch.bfloat16: ct.bfloat16,
            torch.int32: ct.int32, torch.int64: ct.int64, torch.float64: ct.float64}[dtype]


def dummy(device, dtype=torch.float32, ndim: int = 1) -> torch.Tensor:
    """A 1-element stand-in for an absent optional tensor (the kernel never reads it: a constant says so)."""
    return torch.zeros((1,) * ndim, device=device, dtype=dtype)


def launch(call: KernelCall) -> None:
    import cuda.tile as ct

    ct.launch(torch.cuda.current_stream(), call.grid, call.kernel, call.args)


def too_large(*numels: int) -> str:
    """Reason to refuse when any array would need 64-bit offsets, else ''."""
    big = max(numels)
    if big > INT32_LIMIT:
        return (f"a tensor of {big} elements needs 64-bit offsets; the cuTile kernels index with int32 "
                f"(no IndexedWithInt64 variant is built)")
    return ""
