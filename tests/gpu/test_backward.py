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
