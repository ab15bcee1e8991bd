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
from tests.common import INCREASING, TINY, failures, float64_forward, forward_errors, increasing_decay, run_case

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


@pytest.mark.parametrize("backend", [*BACKENDS, "triton"])
@pytest.mark.parametrize("dt_limit", [pytest.param((0.0, 1e40), id="0-to-1e40"),
                                      pytest.param((1e-3, 3.5e38), id="1e-3-to-3.5e38")])
def test_dt_limit_beyond_the_float32_range(backend, dt_limit):
    """A finite upper bound past fp32's largest value clamps nothing in fp32: no overflow error, the same result."""
    problem = Problem(dataclasses.replace(TINY, batch=1, seqlen=40), dt_limit=dt_limit)
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


@pytest.mark.parametrize("backend", ["reference", "triton"])  # their per-sequence states read cu_seqlens on the host
@pytest.mark.parametrize("cu_seqlens", [
    pytest.param([0, 10, 50], id="past-seqlen"),  # was an IndexError from deep in the per-sequence states
    pytest.param([0, 10, 30], id="short-of-seqlen"),  # was computed silently
    pytest.param([0, 30, 10, 40], id="decreasing"),
    pytest.param([5, 10, 40], id="not-from-0"),
])
def test_bad_cu_seqlens_refused_where_read_on_the_host(backend, cu_seqlens):
    """Without check_values too: a backend that reads cu_seqlens on the host anyway checks them there."""
    kw = kwargs(Problem(dataclasses.replace(TINY, batch=1, seqlen=40, chunk_size=16), varlen=True, nseqs=2))
    kw.update(cu_seqlens=torch.tensor(cu_seqlens, dtype=torch.int32), seq_idx=None)
    with pytest.raises(ValueError, match=r"^cu_seqlens: expected 0 = cu_seqlens\[0\] <= .* seqlen \(40\)"):
        impls.ssd_forward(**kw, backend=backend)


@pytest.mark.parametrize("backend", ["mamba_ssm", "vllm", "triton"])
def test_bf16_is_refused_under_the_interpreter(backend):
    """The Triton interpreter computes bf16 dots wrongly (outputs off by ~1e10 relative on these inputs): a
    Triton-based backend refuses bf16 there, saying why, instead of returning them."""
    from impls.registry import backend_class

    kw = kwargs(Problem(dataclasses.replace(TINY, batch=1, seqlen=40, chunk_size=16)), dtype=torch.bfloat16)
    with pytest.raises(impls.BackendUnavailable, match=r"bfloat16 under the Triton interpreter .*#11584"):
        impls.ssd_forward(**kw, backend=backend_class(backend)())  # built directly: vLLM's files need not be here


def test_bf16_chunk_cumsum_runs_under_the_interpreter():
    """chunk_cumsum has no dots: bf16 dt is computed right there, and not refused."""
    kw = kwargs(Problem(dataclasses.replace(TINY, batch=1, seqlen=40, chunk_size=16)))
    dt = kw["dt"].bfloat16()
    ref = impls.chunk_cumsum(dt.double(), kw["A"].double(), 16, kw["dt_bias"].double(), True)
    out = impls.chunk_cumsum(dt, kw["A"], 16, kw["dt_bias"], True, backend="mamba_ssm")
    assert all(rel_err(o, r) <= tolerance(torch.float32) for o, r in zip(out, ref))


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


INCREASING_SHAPE = dataclasses.replace(TINY, batch=1, seqlen=40, chunk_size=16)
ASSUMING = [pytest.param("mamba_ssm", {"fused": True}, id="mamba_ssm-fused"),
            pytest.param("mamba_ssm", {"fused": False}, id="mamba_ssm-stages"),
            pytest.param("vllm", {}, id="vllm")]


def backend_or_skip(name, switches):
    try:
        return impls.get_backend(name, **switches)
    except impls.BackendUnavailable as exc:
        pytest.skip(str(exc))


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("case, arg", INCREASING)
def test_increasing_decay_is_computed(backend, case, arg):
    inputs = increasing_decay(case, INCREASING_SHAPE)
    ref = float64_forward(inputs)
    assert bool((ref.dA_cumsum[..., 1:] > ref.dA_cumsum[..., :-1]).any())
    errors = forward_errors(backend, inputs, ref)
    assert not failures(errors, torch.float32, backend), errors


@pytest.mark.parametrize("name, switches", ASSUMING)
@pytest.mark.parametrize("case, arg", INCREASING)
def test_increasing_decay_is_refused_where_kernels_assume_it(name, switches, case, arg):
    """mamba-ssm's and vLLM's kernels clamp dt at 0 and exp(dA_cumsum[l] - dA_cumsum[s]) at 1 (20-30 % off the
    float64 reference on these inputs): check_values and the harness's gate refuse such inputs, naming the
    argument and why, as for the factored decay."""
    from harness import correctness

    backend = backend_or_skip(name, switches)
    inputs = increasing_decay(case, INCREASING_SHAPE)
    why = rf"^{arg}: .*{'mamba-ssm' if name == 'mamba_ssm' else 'vLLM'}'s kernels"
    with pytest.raises(ValueError, match=why):
        impls.ssd_forward(**inputs.forward_kwargs(), backend=backend, check_values=True)
    with pytest.raises(ValueError, match=why):
        correctness.refuse_unsafe_inputs(backend, inputs)


@pytest.mark.parametrize("case, arg", INCREASING)
def test_mamba_ssm_stages_refuse_increasing_decay(case, arg):
    backend = impls.get_backend("mamba_ssm", fused=False)
    inputs = increasing_decay(case, INCREASING_SHAPE)
    ref = impls.ssd_forward(**inputs.forward_kwargs())
    cumsum = (inputs.dt, inputs.A, inputs.chunk_size, None, inputs.dt_softplus)
    if case == "dt-negative-without-softplus":  # upstream's chunk cumsum clamps dt at 0
        with pytest.raises(ValueError, match="^dt: .*mamba-ssm's kernels"):
            impls.chunk_cumsum(*cumsum, backend=backend, check_values=True)
    else:  # A > 0 alone: its chunk cumsum is right, the later stages are not
        dt, dA = impls.chunk_cumsum(*cumsum, backend=backend, check_values=True)
        assert rel_err(dA, ref.dA_cumsum) <= tolerance(torch.float32)
    with pytest.raises(ValueError, match="^dA_cumsum: .*mamba-ssm's kernels"):
        impls.fwd_pass_state(inputs.B, inputs.x, ref.dt, ref.dA_cumsum, backend=backend, check_values=True)
    with pytest.raises(ValueError, match="^dA_cumsum: .*mamba-ssm's kernels"):
        impls.compute_out(inputs.C, inputs.B, inputs.x, ref.dt, ref.dA_cumsum, ref.states, backend=backend,
                          check_values=True)
