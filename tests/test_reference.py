"""The chunked reference against the sequential definition (float64), and in lower precision against itself."""

from __future__ import annotations

import pytest
import torch

from impls.inputs import make_inputs
from impls.reference import ssd_sequential
from impls.tolerance import rel_err, tolerance
from tests.common import CASES, float64_forward, run_case

pytestmark = pytest.mark.quick  # the quick tier: pytest -m quick


def sequential(inputs):
    kw = inputs.to(torch.float64).forward_kwargs()
    kw.pop("state_dtype")
    return ssd_sequential(**kw)


@pytest.mark.parametrize("problem", CASES)
def test_chunked_matches_sequential_float64(problem):
    inputs = make_inputs(problem, seed=11, dtype=torch.float64)
    chunked, seq = float64_forward(inputs), sequential(inputs)
    tol = tolerance(torch.float64)
    # states stored in a narrower state_dtype round what compute_out reads: y is then judged at that precision
    state_tol = tol if problem.state_dtype is None else tolerance(problem.torch_state_dtype)
    assert rel_err(chunked.y, seq.y) < state_tol
    assert rel_err(chunked.final_states, seq.final_states) < tol
    assert rel_err(chunked.states, seq.chunk_states) < state_tol
    if problem.varlen:
        assert rel_err(chunked.varlen_states, seq.varlen_states) < tol


def test_sequential_is_not_trivially_zero():
    """The comparison above would pass on two zero outputs: make sure the definition produces signal."""
    seq = sequential(make_inputs(CASES[0].values[0], seed=3, dtype=torch.float64))
    assert seq.y.abs().mean() > 0.1 and seq.final_states.abs().mean() > 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("problem", CASES[:7])
def test_reference_low_precision(problem, dtype):
    errors = run_case("reference", problem, dtype, seed=5)
    bad = {k: v for k, v in errors.items() if not v <= tolerance(dtype)}
    assert not bad, bad


@pytest.mark.parametrize("problem", [CASES[0], CASES[4], CASES[5]])
def test_blockwise_reference_matches_sequential(problem, monkeypatch):
    """One chunk per block (as at 2^20 tokens, where the work is split to bound memory) changes nothing."""
    import sys

    for module in ("impls.reference.compute_out", "impls.reference.fwd_pass_state"):
        monkeypatch.setattr(sys.modules[module], "BLOCK_ELEMENTS", 1)
    inputs = make_inputs(problem, seed=13, dtype=torch.float64)
    chunked, seq = float64_forward(inputs), sequential(inputs)
    assert rel_err(chunked.y, seq.y) < tolerance(torch.float64)
    assert rel_err(chunked.final_states, seq.final_states) < tolerance(torch.float64)
