"""The peers' backwards through `impls.ssd` on the GPU, through the gradient gate (harness/gradient_gate.py):
mamba-ssm's own autograd function and TileGym's mamba2_chunk_backward, bf16, at a medium shape with S1's blocks;
and the refusals of those without one."""

from __future__ import annotations

import pytest
import torch

from harness.gradient_gate import check_gradients
from impls.inputs import make_inputs
from impls.problem import Problem, Shape
from impls.registry import BackendUnavailable, get_backend

MEDIUM = Problem(Shape(2, 1024, 16, 64, 1, 128, 256), dtype="bfloat16", has_initial_states=True)


@pytest.mark.parametrize("backend", ["mamba_ssm", "tilegym"])
def test_the_peers_backward_passes_the_gradient_gate(backend):
    ok, why = get_backend(backend).supports(MEDIUM)
    assert ok, why
    inputs = make_inputs(MEDIUM, device="cuda", seed=3)
    report = check_gradients(backend, inputs, torch.bfloat16, torch.device("cuda"), seed=3)
    print(f"[{backend}]", {name: round(r["bound_ratio"], 3) for name, r in report.items()})
    assert {"dx", "ddt", "dA", "dB", "dC", "dD", "ddt_bias", "dinitial_states"} <= set(report)
    assert all(r["ok"] for r in report.values()), report


@pytest.mark.parametrize("backend, words", [
    pytest.param("vllm", "inference engine", id="vllm"),
    pytest.param("fla", "FLA #640", id="fla"),
])
def test_peers_without_a_backward_refuse_on_the_gpu(backend, words):
    import impls
    from harness.calls import forward_arguments

    problem = Problem(Shape(1, 512, 16, 64, 1, 128, 256), dtype="bfloat16")
    kw = forward_arguments(make_inputs(problem, device="cuda", seed=0))
    kw["x"] = kw["x"].requires_grad_()
    with pytest.raises(BackendUnavailable, match=words):
        impls.ssd(**kw, backend=backend)


@pytest.mark.parametrize("backend", ["triton", "mamba_ssm"])
def test_each_kernel_of_the_backward_is_timed_under_its_own_name(backend):
    """harness/measure_time.py kernel_rows over a real backward (the timed rows' own call): every kernel a name and a
    positive median, the shares adding to 100; our backward kernels beside their floor when ceilings are given."""
    from harness import cost_model
    from harness.measure_time import backward_callables, kernel_rows

    problem = Problem(Shape(2, 1024, 16, 64, 1, 128, 256), dtype="bfloat16")
    inputs = make_inputs(problem, device="cuda", seed=0)
    call = backward_callables(get_backend(backend), inputs)["backward"]
    rows = kernel_rows(call, (0.2, 0.8), cost_model.costs(problem), {"matmul_tflops": 700.0, "copy_gbps": 3000.0},
                       backend)
    medians = {stage: value for stage, metric, value in rows if metric == "median_ms"}
    shares = [value for _stage, metric, value in rows if metric == "share_pct"]
    print(f"[{backend}]", {stage: round(ms, 4) for stage, ms in medians.items()})
    assert len(medians) >= 3 and all(stage.startswith("kernel:") and ms >= 0 for stage, ms in medians.items())
    assert sum(shares) == pytest.approx(100.0)
    if backend == "triton":
        assert "kernel:bwd_chunk_kernel" in medians
        assert any(stage == "kernel:bwd_chunk_kernel" and metric == "frac_floor" for stage, metric, _ in rows)
