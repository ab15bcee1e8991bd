"""dt = 0 through the exponent fold (switch exp_fold) on the GPU: q = dA_cumsum·log2(e) − log2(0) = +inf must give
zero terms, not NaN, with the hardware's log2 and exp2 (the CPU tests run numpy's and torch's)."""

from __future__ import annotations

import pytest
import torch

import impls
from impls.inputs import make_inputs
from impls.problem import Problem, Shape
from tests.common import failures, float64_forward, forward_errors


@pytest.mark.parametrize("name,switches", [
    pytest.param("cutile", {}, id="cutile"),
    pytest.param("cutile", {"exp2_ftz": True, "heads_per_tile": 2, "head_mma": "per_head"}, id="cutile-ftz-heads2"),
    pytest.param("triton", {}, id="triton"),
])
def test_zero_dt_through_the_fold(name, switches):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    try:
        backend = impls.get_backend(name, exp_fold=True, **switches)
    except impls.BackendUnavailable as exc:
        pytest.skip(str(exc))
    problem = Problem(Shape(2, 300, 8, 64, 2, 64, 128), dt_softplus=False, has_dt_bias=False)
    inputs = make_inputs(problem, device="cuda", seed=3, dtype=torch.bfloat16)
    inputs.dt[:, ::3] = 0.0  # no softplus, bias or clamp: stage 1 passes the zeros through
    errors = forward_errors(backend, inputs, float64_forward(inputs))
    assert not failures(errors, torch.bfloat16, backend, "cuda"), errors
