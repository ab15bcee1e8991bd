"""The chunked reference against the sequential definition (float64). In lower precision it meets the contract as
every backend does: tests/interface/test_contract.py."""

from __future__ import annotations

import pytest
import torch

from impls.inputs import make_inputs
from impls.problem import Problem, Shape
from impls.reference import ssd_sequential
from impls.tolerance import rel_err, tolerance
from tests.common import CASES, float64_forward, judged

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
    q = inputs.chunk_size
    assert max(judged("y", chunked.y, seq.y, q)) < state_tol
    assert max(judged("final_states", chunked.final_states, seq.final_states, q)) < tol
    assert max(judged("states", chunked.states, seq.chunk_states, q)) < state_tol
    if problem.varlen:
        assert max(judged("varlen_states", chunked.varlen_states, seq.varlen_states, q)) < tol


LONG_CASES = [  # many chunks per sequence and seqlen >= 1000, tiny heads to stay fast
    pytest.param(Problem(Shape(2, 1200, 2, 4, 1, 4, 64), nseqs=3, has_initial_states=True, has_z=True,
                         D_per_channel=True), id="seq_idx-per-row-1200"),
    pytest.param(Problem(Shape(1, 1100, 2, 4, 1, 4, 32), varlen=True, nseqs=3, has_initial_states=True),
                 id="cu_seqlens-init-1100"),
    pytest.param(Problem(Shape(1, 1000, 4, 4, 2, 4, 128), dt_limit=(0.005, 0.05)), id="dt_limit-1000"),
    pytest.param(Problem(Shape(1, 1000, 2, 4, 1, 4, 64), dt_softplus=False, has_dt_bias=True),
                 id="bias-no-softplus-1000"),
]


@pytest.mark.parametrize("problem", LONG_CASES)
def test_chunked_matches_sequential_long(problem):
    inputs = make_inputs(problem, seed=17, dtype=torch.float64)
    chunked, seq = float64_forward(inputs), sequential(inputs)
    pairs = {"y": (chunked.y, seq.y), "final_states": (chunked.final_states, seq.final_states),
             "states": (chunked.states, seq.chunk_states)}
    if problem.varlen:
        pairs["varlen_states"] = (chunked.varlen_states, seq.varlen_states)
    errors = {name: judged(name, *pair, inputs.chunk_size) for name, pair in pairs.items()}
    assert all(max(e) < tolerance(torch.float64) for e in errors.values()), errors


def test_sequential_does_not_import_the_chunked_code():
    """The definition computes dt processing and cu_seqlens' sequence index itself."""
    import ast
    from pathlib import Path

    import impls.reference.sequential as definition

    tree = ast.parse(Path(definition.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in imported if m and m.startswith("impls")}, imported


def test_sequential_is_not_trivially_zero():
    """The comparison above would pass on two zero outputs: make sure the definition produces signal."""
    seq = sequential(make_inputs(CASES[0].values[0], seed=3, dtype=torch.float64))
    assert seq.y.abs().mean() > 0.1 and seq.final_states.abs().mean() > 1e-3


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


def test_empty_first_sequence_drops_the_initial_state():
    """cu_seqlens = [0, 0, ...]: position 0 belongs to sequence 1, so the initial state (sequence 0's) is dropped;
    the chunked reference agrees with the definition, and differs from a run that keeps it."""
    problem = Problem(Shape(1, 200, 2, 4, 1, 4, 32), varlen=True, nseqs=3, has_initial_states=True)
    inputs = make_inputs(problem, seed=19, dtype=torch.float64)
    inputs.cu_seqlens = torch.tensor([0, 0, 90, 200], dtype=torch.int32)
    inputs.seq_idx = None
    chunked, seq = float64_forward(inputs), sequential(inputs)
    for name in ("y", "final_states", "varlen_states"):
        assert max(judged(name, getattr(chunked, name), getattr(seq, name), 32)) < tolerance(torch.float64), name
    assert chunked.varlen_states[0].abs().max() == 0
    inputs.initial_states = None
    assert torch.allclose(float64_forward(inputs).y, chunked.y)
