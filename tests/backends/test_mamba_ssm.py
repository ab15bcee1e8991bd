"""Upstream mamba-ssm under the Triton interpreter: its stage-by-stage forward against the float64 reference (the
contract on the covering cases: tests/interface/test_contract.py), its interpreter mode, its refusals.

bf16 is GPU-only: the interpreter computes bf16 dots wrongly (triton-lang/triton#11584)."""

from __future__ import annotations

import pytest
import torch

import impls
from impls.mamba_ssm import upstream
from tests.common import CASES, failures, run_case


def test_the_stage_by_stage_forward_matches_float64():
    """fused=False (its forward composed of its stages, the path that takes a state_dtype of its own); the fused
    default meets the contract with every backend (tests/interface/test_contract.py)."""
    backend = impls.get_backend("mamba_ssm", fused=False)
    problem = impls.Problem(impls.Shape(1, 40, 2, 16, 2, 16, 16), dtype="float16", state_dtype="float32")
    assert backend.supports(problem) == (True, "")
    errors = run_case(backend, problem, torch.float16, seed=7)
    assert not failures(errors, torch.float16), errors


def test_interpreter_mode_restores_upstream_configs():
    mods = impls.get_backend("mamba_ssm").upstream()
    before = {id(t): list(t.configs) for t in upstream.autotuners(mods)}
    assert before, "no upstream autotuners found"
    with upstream.interpreter_mode(mods):
        assert all(len(t.configs) == 1 for t in upstream.autotuners(mods))
    assert {id(t): list(t.configs) for t in upstream.autotuners(mods)} == before


def test_refuses_cpu_without_interpreter(monkeypatch):
    # not TRITON_INTERPRET=0: a kernel module first imported under it stays compiled for the rest of the run
    monkeypatch.setattr(upstream, "interpreting", lambda: False)
    ok, reason = impls.get_backend("mamba_ssm").check_device(torch.device("cpu"))
    assert not ok and "TRITON_INTERPRET" in reason


def test_refuses_what_it_cannot_map():
    problem = impls.Problem(CASES[0].values[0].shape, varlen=True, nseqs=2, has_initial_states=True)
    ok, reason = impls.get_backend("mamba_ssm").supports(problem)
    assert not ok and "initial state" in reason
    # float64 ran at fp32 precision (relative error ~1e-5 against float64's 1e-10), returned as float64
    ok, reason = impls.get_backend("mamba_ssm").supports(impls.Problem(problem.shape, dtype="float64"))
    assert not ok and "float64" in reason and "fp32 precision" in reason
    with pytest.raises(impls.BackendUnavailable, match="state_dtype"):
        from impls.registry import require

        require(impls.get_backend("mamba_ssm"), impls.Problem(problem.shape, state_dtype="float32"),
                torch.device("cpu"))
