"""What the GPU tests of our two backwards (test_triton_backward.py, test_cutile_backward.py) share: the problems,
the gradient gate over every gradient, the gradients of one `impls.ssd` call, and the switch variants of the per-group
sums (bwd_group_split, bwd_atomics) with what two calls must agree to under them."""

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

# S1's blocks (chunk 256, headdim 64, dstate 128; the peers' test_backward.py shape), one covering more of the
# contract (ngroups 2, z, per-channel D, seq_idx, initial states, seqlen not a multiple of the chunk), and the
# per-sequence states' gradient (cu_seqlens)
MEDIUM = Problem(Shape(2, 1024, 16, 64, 1, 128, 256), dtype="bfloat16", has_initial_states=True)
CONTRACT = Problem(Shape(2, 1000, 8, 64, 2, 128, 256), dtype="bfloat16", has_z=True, D_per_channel=True,
                   has_initial_states=True, nseqs=3)
CASES = [
    pytest.param(MEDIUM, id="medium-S1-blocks-init"),
    pytest.param(CONTRACT, id="g2-z-Dchannel-seq_idx-init-seqlen1000"),
    pytest.param(Problem(Shape(1, 900, 8, 64, 2, 64, 128), dtype="bfloat16", varlen=True, nseqs=4,
                         has_initial_states=True), id="cu_seqlens-4-seqs-init"),
]
GATED = {"dx", "ddt", "dA", "dB", "dC", "dD", "ddt_bias", "dinitial_states"}
# switch bwd_group_split (each group's heads over k programs, fp32 partials summed without atomics) and bwd_atomics (the
# partials of dC and dB added atomically instead): 4 heads per program at MEDIUM, 1 at CONTRACT
GROUP_SPLIT = [pytest.param({"bwd_group_split": 4}, id="group-split-4"),
               pytest.param({"bwd_group_split": 4, "bwd_atomics": True}, id="group-split-4-atomics")]


def assert_every_gradient_passes(backend, problem: Problem, label: str) -> None:
    """The gradient gate (float64 autograd through the reference, allocations poisoned) in bf16, every bound ratio
    printed."""
    report = check_gradients(backend, make_inputs(problem, device="cuda", seed=3), torch.bfloat16,
                             torch.device("cuda"), seed=3)
    print(f"[{label}]", {name: round(r["bound_ratio"], 3) for name, r in report.items()})
    assert GATED <= set(report)
    assert all(r["ok"] for r in report.values()), report


def gradients(backend: str, problem: Problem, seed: int, **switches) -> dict:
    """The gradients of one `impls.ssd` call on fresh inputs of `seed`, by input name."""
    inputs = make_inputs(problem, device="cuda", seed=seed)
    grads_in = output_gradients(inputs, seed)
    kw = forward_arguments(inputs)
    leaves = {n: kw[n].detach().clone().requires_grad_() for n in GRAD_INPUTS if kw.get(n) is not None}
    impl = get_backend(backend, **switches) if switches else backend
    out = impls.ssd(**{**kw, **leaves}, backend=impl)
    found = torch.autograd.grad([out.y, out.final_states], list(leaves.values()),
                                [grads_in["y"].to(out.y.dtype), grads_in["final_states"].float()])
    return dict(zip(leaves, found))


def assert_two_calls_agree(first: dict, again: dict, switches: dict) -> None:
    """Two calls' gradients the same bits; under switch bwd_atomics (float atomic adds in the GPU's order, not
    deterministic) within bf16's flat tolerance of each other instead."""
    from impls.tolerance import rel_err, tolerance

    for name, grad in first.items():
        if switches.get("bwd_atomics"):
            assert rel_err(grad, again[name]) <= tolerance(torch.bfloat16), name
        else:
            assert torch.equal(grad, again[name]), name
