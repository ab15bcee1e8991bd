"""Hostile inputs through the public API: each computes correctly or raises the documented ValueError — never a
silent wrong answer or a crash."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import impls
from impls.inputs import make_inputs
from impls.problem import Problem
from impls.tolerance import rel_err, tolerance
from tests.common import TINY, failures, run_case

pytestmark = pytest.mark.quick  # the quick tier: pytest -m quick

BACKENDS = ["reference", "mamba_ssm"]


def kwargs(problem=None, dtype=torch.float32, **changes):
    kw = make_inputs(problem or Problem(TINY), seed=2, dtype=dtype).forward_kwargs()
    kw.update(changes)
    return kw


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arg, changes", [
    pytest.param("B", {"B": torch.randn(2, 100, 2, 16, dtype=torch.float16)}, id="B-dtype-differs-from-x"),
    pytest.param("z", {"z": torch.randn(2, 100, 4, 16, dtype=torch.float64)}, id="z-dtype-differs-from-x"),
    pytest.param("B", {"B": torch.randn(2, 100, 2, 16, device="meta")}, id="B-on-another-device"),
    pytest.param("chunk_size", {"chunk_size": 1 << 20}, id="huge-chunk"),
    pytest.param("A", {"A": "not a tensor"}, id="A-not-a-tensor"),
])
def test_rejected_with_the_argument_named(backend, arg, changes):
    with pytest.raises(ValueError, match=rf"^{arg}"):
        impls.ssd_forward(**kwargs(**changes), backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("problem", [
    pytest.param(Problem(dataclasses.replace(TINY, seqlen=5)), id="seqlen-below-one-chunk"),
    pytest.param(Problem(dataclasses.replace(TINY, seqlen=1)), id="seqlen-1"),
    pytest.param(Problem(dataclasses.replace(TINY, seqlen=33)), id="one-token-into-second-chunk"),
])
def test_short_sequences_compute_correctly(backend, problem):
    errors = run_case(backend, problem, torch.float32, seed=4)
    assert not failures(errors, torch.float32), errors


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_finite_input_is_caught_or_propagates(backend):
    x = make_inputs(Problem(TINY), seed=2, dtype=torch.float32).x.clone()
    x[0, 3, 1, 2] = float("nan")
    with pytest.raises(ValueError, match="^x: expected finite"):
        impls.ssd_forward(**kwargs(x=x), backend=backend, check_values=True)
    out = impls.ssd_forward(**kwargs(x=x), backend=backend)  # unchecked: the NaN shows, it is not hidden
    assert torch.isnan(out.y).any()


def test_empty_packed_sequence_has_zero_final_state():
    from impls.reference import ssd_sequential

    problem = Problem(dataclasses.replace(TINY, batch=1), varlen=True, nseqs=2)
    kw = kwargs(problem)
    kw["cu_seqlens"] = torch.tensor([0, 40, 40, TINY.seqlen], dtype=torch.int32)
    kw["seq_idx"] = None
    out = impls.ssd_forward(**kw, check_values=True)
    kw64 = {k: (v.double() if torch.is_tensor(v) and v.is_floating_point() else v) for k, v in kw.items()}
    kw64.pop("state_dtype")
    seq = ssd_sequential(**kw64)
    assert out.varlen_states[1].abs().max() == 0
    assert rel_err(out.varlen_states, seq.varlen_states) <= tolerance(torch.float32)
    assert rel_err(out.y, seq.y) <= tolerance(torch.float32)


def test_extreme_decay_stays_finite():
    """Large dt·|A| (decay underflows to 0 inside a chunk) must not produce inf·0 = NaN."""
    kw = kwargs(dt_softplus=False, dt_bias=None)
    kw["dt"] = torch.full_like(kw["dt"], 50.0)
    kw["A"] = torch.full_like(kw["A"], -16.0)
    ref = impls.ssd_forward(**{k: (v.double() if torch.is_tensor(v) and v.is_floating_point() else v)
                               for k, v in kw.items()})
    for backend in BACKENDS:
        out = impls.ssd_forward(**kw, backend=backend)
        assert torch.isfinite(out.y).all()
        assert rel_err(out.y, ref.y) <= tolerance(torch.float32)
