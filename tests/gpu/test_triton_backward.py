"""Our Triton backward (impls/triton/backward/) through `impls.ssd` on the GPU: the gradient gate
(harness/gradient_gate.py: float64 autograd through the reference as the truth, NaN-poisoned allocations) in bf16
at a medium shape with S1's blocks (chunk 256, headdim 64, dstate 128; the peers' test_backward.py shape) and at one
covering more of the contract (ngroups 2, z, per-channel D, seq_idx, initial states, seqlen not a multiple of the
chunk); the per-sequence states' gradient (cu_seqlens); and two backward calls giving the same bits. Switch
bwd_cb='shared' (the groups' C·Bᵀ formed once by cb_kernel, loaded by bwd_chunk) through the same gate at the first
two shapes, and its two calls the same bits too."""

from __future__ import annotations

import pytest
import torch

import impls
from harness.calls import forward_arguments
from harness.gradient_gate import check_gradients, output_gradients
from impls.api import GRAD_INPUTS
from impls.inputs import make_inputs
from impls.problem import Problem, Shape
from impls.registry import get_backend

MEDIUM = Problem(Shape(2, 1024, 16, 64, 1, 128, 256), dtype="bfloat16", has_initial_states=True)
CASES = [
    pytest.param(MEDIUM, id="medium-S1-blocks-init"),
    pytest.param(Problem(Shape(2, 1000, 8, 64, 2, 128, 256), dtype="bfloat16", has_z=True, D_per_channel=True,
                         has_initial_states=True, nseqs=3), id="g2-z-Dchannel-seq_idx-init-seqlen1000"),
    pytest.param(Problem(Shape(1, 900, 8, 64, 2, 64, 128), dtype="bfloat16", varlen=True, nseqs=4,
                         has_initial_states=True), id="cu_seqlens-4-seqs-init"),
]


@pytest.mark.parametrize("problem", CASES)
def test_every_gradient_passes_the_gate(problem):
    report = check_gradients("triton", make_inputs(problem, device="cuda", seed=3), torch.bfloat16,
                             torch.device("cuda"), seed=3)
    print("[triton]", {name: round(r["bound_ratio"], 3) for name, r in report.items()})
    assert {"dx", "ddt", "dA", "dB", "dC", "dD", "ddt_bias", "dinitial_states"} <= set(report)
    assert all(r["ok"] for r in report.values()), report


@pytest.mark.parametrize("problem", CASES[:2])
def test_bwd_cb_shared_passes_the_gate(problem):
    backend = get_backend("triton", bwd_cb="shared")
    report = check_gradients(backend, make_inputs(problem, device="cuda", seed=3), torch.bfloat16,
                             torch.device("cuda"), seed=3)
    print("[triton bwd_cb=shared]", {name: round(r["bound_ratio"], 3) for name, r in report.items()})
    assert all(r["ok"] for r in report.values()), report


@pytest.mark.parametrize("switches", [pytest.param({}, id="defaults"),
                                      pytest.param({"bwd_cb": "shared"}, id="bwd_cb-shared")])
def test_two_backward_calls_give_the_same_bits(switches):
    """Every reduction is per-head/chunk partials summed in a fixed order: no float atomics."""
    inputs = make_inputs(MEDIUM, device="cuda", seed=4)
    grads_in = output_gradients(inputs, 4)
    kw = forward_arguments(inputs)
    backend = get_backend("triton", **switches)
    runs = []
    for _ in range(2):
        leaves = {n: kw[n].detach().clone().requires_grad_() for n in GRAD_INPUTS if kw.get(n) is not None}
        out = impls.ssd(**{**kw, **leaves}, backend=backend)
        found = torch.autograd.grad([out.y, out.final_states], list(leaves.values()),
                                    [grads_in["y"].to(out.y.dtype), grads_in["final_states"].float()])
        runs.append(dict(zip(leaves, found)))
    for name, grad in runs[0].items():
        assert torch.equal(grad, runs[1][name]), name
