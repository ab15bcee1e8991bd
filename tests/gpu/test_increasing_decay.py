"""Inputs whose dA_cumsum increases inside a chunk (A > 0, or a negative dt without softplus or dt_limit), which the
contract allows (impls/README.md): every backend computes them within tolerance of the float64 reference, or says
why it cannot (Backend.NON_INCREASING_DECAY, switch decay_factor; switch exp_fold: a negative dt) and refuses them
under check_values. On the CPU
only mamba-ssm's, vLLM's and our Triton kernels could be checked (tests/interface/test_hostile.py); cuTile's,
TileGym's and FLA's are checked here."""

from __future__ import annotations

import pytest
import torch

import impls
from impls.api import needs_non_negative_dt, non_increasing_decay
from impls.problem import Shape
from tests.common import INCREASING, failures, float64_forward, forward_errors, increasing_decay

SHAPE = Shape(1, 200, 4, 32, 2, 32, 64)  # headdim and dstate 32: the smallest cuTile builds
BACKENDS = [pytest.param("cutile", {}, id="cutile"), pytest.param("triton", {}, id="triton"),
            pytest.param("tilegym", {"tuning": "fallback"}, id="tilegym"), pytest.param("fla", {}, id="fla"),
            pytest.param("mamba_ssm", {}, id="mamba_ssm"), pytest.param("vllm", {}, id="vllm"),
            pytest.param("cutile", {"exp_fold": True}, id="cutile-exp_fold"),
            pytest.param("triton", {"exp_fold": True}, id="triton-exp_fold")]


@pytest.mark.parametrize("name, switches", BACKENDS)
@pytest.mark.parametrize("case, arg", INCREASING)
def test_increasing_decay_is_computed_or_refused(name, switches, case, arg):
    try:
        backend = impls.get_backend(name, **switches)
    except impls.BackendUnavailable as exc:
        pytest.skip(str(exc))
    inputs = increasing_decay(case, SHAPE, device="cuda")
    if non_increasing_decay(backend) or (needs_non_negative_dt(backend) and arg == "dt"):
        with pytest.raises(ValueError, match=rf"^{arg}: "):
            impls.ssd_forward(**inputs.forward_kwargs(), backend=backend, check_values=True)
        return
    errors = forward_errors(backend, inputs, float64_forward(inputs))
    assert not failures(errors, torch.float32, backend, "cuda"), errors
