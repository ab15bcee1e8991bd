"""The contract, tested once: every registered backend × every workload × each direction it declares, on a covering
set of cases per (workload, direction) — each part of the contract (impls/README.md) in at least one case a backend
runs, not the product of them — against float64: fresh inputs, NaN-poisoned allocations, the tolerance table of
impls/tolerance.py at each stage's reported precision, whole tensor and block by block.

A backend that cannot run a case here (no GPU, a problem it refuses) is skipped with its reason; a backend without a
backward refuses the backward directions, naming itself. Switch variants and a backend's own paths stay in its own
file (tests/backends/test_triton_interp.py, tests/backends/test_vllm.py, ...)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness import gate, plan, workloads
from harness.gradient_gate import backend_gradients, gradient_blocks, output_gradients, reference_gradients
from impls.inputs import make_inputs
from impls.problem import Problem, Shape, dtype_name
from impls.registry import BackendUnavailable, backend_class, get_backend, list_backends, require
from impls.tolerance import blockwise_err, rel_err, tolerance
from tests.common import as_fused_projection_views, failures, float64_forward, forward_errors

CPU = torch.device("cpu")
TINY = Shape(batch=2, seqlen=100, nheads=4, headdim=16, ngroups=2, dstate=16, chunk_size=32)


@dataclasses.dataclass(frozen=True)
class Case:
    problem: Problem  # its dtype is the one the case runs in
    strided: bool = False  # x and z as column slices of one projection (Mamba-2's in_proj)


# Per (workload, direction): the cases; together they cover the contract, each part in a case every backend that
# has it runs (a backend's refusal of one case loses no part another case holds for it).
COVERING = {
    ("ssd", "forward"): {
        "ngroups1-seqlen-below-chunk-no-softplus-no-bias-fp32":
            Case(Problem(dataclasses.replace(TINY, seqlen=20, ngroups=1), dtype="float32", dt_softplus=False,
                         has_dt_bias=False)),
        "seq_idx-per-row-initial-states-z-D-per-channel-dt_limit-fp16":
            Case(Problem(dataclasses.replace(TINY, seqlen=70, nheads=2), dtype="float16", nseqs=3,
                         has_initial_states=True, has_z=True, D_per_channel=True, dt_limit=(0.005, 0.05))),
        "cu_seqlens-strided-x-z-no-D-bias-no-softplus-p24-n40-seqlen-multiple-fp32":
            Case(Problem(Shape(1, 96, 2, 24, 2, 40, 16), dtype="float32", varlen=True, nseqs=3, has_z=True,
                         has_D=False, dt_softplus=False), strided=True),
        "cu_seqlens-initial-states-state_dtype-fp32-fp16":
            Case(Problem(dataclasses.replace(TINY, batch=1), dtype="float16", varlen=True, nseqs=3,
                         has_initial_states=True, state_dtype="float32")),
        "headline-bf16": Case(Problem(TINY, dtype="bfloat16")),
    },
    ("ssd", "backward"): {
        "initial-states-z-fp32": Case(Problem(Shape(1, 40, 2, 16, 2, 16, 16), dtype="float32", has_initial_states=True,
                                              has_z=True)),
    },
    ("ssd", "forward_backward"): {
        "seq_idx-D-per-channel-dt_limit-fp32": Case(Problem(Shape(2, 40, 2, 8, 1, 8, 16), dtype="float32", nseqs=2,
                                                            D_per_channel=True, dt_limit=(0.005, 0.05))),
    },
    ("mamba2_layer", "forward"): {
        "plain-fp32": Case(Problem(Shape(1, 40, 2, 16, 2, 16, 16), dtype="float32")),
    },
    ("mamba2_layer", "backward"): {
        "D-per-channel-dt_limit-fp32": Case(Problem(Shape(1, 32, 2, 16, 1, 16, 16), dtype="float32",
                                                    D_per_channel=True, dt_limit=(0.005, 0.05))),
    },
    ("mamba2_layer", "forward_backward"): {
        "plain-fp32": Case(Problem(Shape(1, 24, 2, 16, 2, 16, 16), dtype="float32")),
    },
    ("mamba2_lm", "forward"): {
        "plain-fp32": Case(Problem(Shape(1, 40, 2, 16, 2, 16, 16), dtype="float32")),
    },
    ("mamba2_lm", "train_step"): {
        "D-per-channel-fp32": Case(Problem(Shape(1, 24, 2, 16, 1, 16, 16), dtype="float32", D_per_channel=True)),
    },
}


def _params():
    out = []
    for backend in list_backends():
        for (workload, direction), cases in COVERING.items():
            assert direction in workloads.get(workload).directions
            marks = pytest.mark.quick if backend == "reference" else ()  # the quick tier: the reference's, in a second
            out += [pytest.param(backend, workload, direction, case, id=f"{backend}-{workload}-{direction}-{name}",
                                 marks=marks) for name, case in cases.items()]
    return out


def test_every_workload_and_direction_has_cases():
    assert {(w, d) for w in workloads.names() for d in workloads.get(w).directions} == set(COVERING)


def _runnable(name: str, problem: Problem):
    """The backend built for the CPU and able to run `problem` here, else the test is skipped with its reason."""
    try:
        backend = get_backend(name)
        require(backend, problem, CPU)
    except BackendUnavailable as exc:
        pytest.skip(str(exc))
    return backend


def _has_backward(name: str) -> bool:
    return bool(backend_class(name).BACKWARD)


@pytest.mark.parametrize("backend, workload, direction, case", _params())
def test_contract(backend, workload, direction, case):
    impl = _runnable(backend, case.problem)
    if workload == "ssd" and direction == "forward":
        _ssd_forward(impl, case)
    elif workload == "ssd":
        _ssd_gradients(impl, case, with_forward=direction == "forward_backward")
    else:
        _through_the_gate(backend, workload, direction, case)


def _ssd_forward(impl, case: Case) -> None:
    dtype = case.problem.torch_dtype
    inputs = make_inputs(case.problem, seed=11, dtype=dtype)
    if case.strided:
        inputs = as_fused_projection_views(inputs)
    errors = forward_errors(impl, inputs, float64_forward(inputs))
    assert {"forward.y", "forward.final_states"} <= set(errors)
    assert not failures(errors, dtype, impl, "cpu"), errors


def _ssd_gradients(impl, case: Case, with_forward: bool) -> None:
    """Every gradient of impls.ssd (and with `with_forward` its outputs, computed under autograd) against float64
    autograd through the chunked reference, within the dtype's tolerance whole and per block; a backend without a
    backward refuses, naming itself."""
    dtype = case.problem.torch_dtype
    inputs = make_inputs(case.problem, seed=13, dtype=dtype)
    grads_in = output_gradients(inputs)
    if not _has_backward(impl.name):
        with pytest.raises(BackendUnavailable, match=f"backend '{impl.name}' has no backward"):
            backend_gradients(impl, inputs, grads_in)
        return
    truth = reference_gradients(inputs, grads_in)
    got = backend_gradients(impl, inputs, grads_in)
    tol = tolerance(dtype)
    errors = {}
    for name, expected in truth.items():
        if expected is None:
            continue
        block, _ = gradient_blocks(name, inputs.chunk_size, expected.dim())
        actual = got[name]
        errors[name] = max(rel_err(actual, expected), blockwise_err(actual, expected, block).ratio)
    assert {"dx", "dA", "dB", "dC"} <= set(errors)
    assert all(err <= tol for err in errors.values()), errors
    if with_forward:
        import impls

        kw = {k: v.detach().requires_grad_() if k in ("x", "B") else v for k, v in inputs.forward_kwargs().items()}
        out = impls.ssd(**kw, backend=impl)
        ref = float64_forward(inputs)
        assert out.y.grad_fn is not None
        assert rel_err(out.y, ref.y) <= tol and rel_err(out.final_states, ref.final_states) <= tol


def _through_the_gate(backend: str, workload: str, direction: str, case: Case) -> None:
    """The workload's own gate (harness/gate.py over its declaration) passes; the backward directions of a
    backend without a backward are refused, naming it."""
    declared = workloads.get(workload)
    bench = plan.BenchSettings(stages=declared.stage_names, time=False)
    built = plan.build(plan.point(backend, case.problem, workload=workload, direction=direction, bench=bench))
    if direction != "forward" and not _has_backward(backend):
        kw = declared.arguments(built.inputs)
        with pytest.raises(BackendUnavailable, match=f"backend '{backend}' has no backward"):
            declared.backward.call(built.backend, kw, declared.backward.leaves(kw))
        return
    report = gate.run(built)
    assert not report.failures, report.failures
    assert {"forward", *(s.name for s in declared.stages)} <= set(report.stages)
    if direction != "forward":
        assert any(stage.startswith("grad:") for stage in report.stages)
    assert dtype_name(built.dtype) == case.problem.dtype
