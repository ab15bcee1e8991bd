"""A NaN in dt stays NaN through chunk_cumsum's dt_limit clamp, as torch.clamp keeps it in the reference: on the GPU
the hardware's max/min return the operand that is not NaN, which would turn the NaN into dt_limit's bound and
hide it (the interpreter keeps NaN either way, so the CPU cannot tell; impls/triton/chunk_cumsum.py,
impls/cutile/chunk_cumsum.py)."""

from __future__ import annotations

import math

import pytest
import torch

import impls


@pytest.mark.parametrize("name", ["reference", "triton", "cutile"])
def test_nan_dt_survives_the_limit(name):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    try:
        backend = impls.get_backend(name)
    except impls.BackendUnavailable as exc:
        pytest.skip(str(exc))
    g = torch.Generator(device="cpu").manual_seed(5)
    dt = (torch.rand(1, 100, 4, generator=g) * 0.1).cuda()
    dt[0, 37, 2] = math.nan
    A = -torch.rand(4, generator=g).cuda()
    dt_out, dA = impls.chunk_cumsum(dt, A, 64, dt_bias=None, dt_softplus=False, dt_limit=(0.01, 0.05),
                                    backend=backend)
    assert torch.isnan(dt_out[0, 2, 0, 37]) and torch.isnan(dA[0, 2, 0, 37:64]).all()
    finite = torch.ones_like(dt_out, dtype=torch.bool)
    finite[0, 2, 0] = False
    assert torch.isfinite(dt_out[finite]).all()
