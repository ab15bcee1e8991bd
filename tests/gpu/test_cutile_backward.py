"""Our cuTile backward (impls/cutile/backward/) through `impls.ssd` on the GPU: the gradient gate
(harness/gradient_gate.py: float64 autograd through the reference as the truth, NaN-poisoned allocations) in bf16 at a
medium shape with S1's blocks (chunk 256, headdim 64, dstate 128; the peers' test_backward.py shape) and at one
covering more of the contract (ngroups 2, z, per-channel D, seq_idx, initial states, seqlen not a multiple of the
chunk); the per-sequence states' gradient (cu_seqlens); two backward calls giving the same bits; and the gradients of
our Triton backward on the same inputs. Switch bwd_cb='shared' (the groups' C·Bᵀ formed once by cb_kernel, loaded by
the chunk kernel) through the same gate at the first two shapes, and its two calls the same bits too. The CPU checks
(AOT compiles, the kernels under emulation) are tests/backends/test_cutile_backward.py."""

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
from impls.tolerance import rel_err, tolerance

pytestmark = pytest.mark.gpu

MEDIUM = Problem(Shape(2, 1024, 16, 64, 1, 128, 256), dtype="bfloat16", has_initial_states=True)
CONTRACT = Problem(Shape(2, 1000, 8, 64, 2, 128, 256), dtype="bfloat16", has_z=True, D_per_channel=True,
                   has_initial_states=True, nseqs=3)
CASES = [
    pytest.param(MEDIUM, id="medium-S1-blocks-init"),
    pytest.param(CONTRACT, id="g2-z-Dchannel-seq_idx-init-seqlen1000"),
    pytest.param(Problem(Shape(1, 900, 8, 64, 2, 64, 128), dtype="bfloat16", varlen=True, nseqs=4,
                         has_initial_states=True), id="cu_seqlens-4-seqs-init"),
]


@pytest.fixture(autouse=True)
def _needs_cuda_tile():
    pytest.importorskip("cuda.tile")


@pytest.mark.parametrize("problem", CASES)
def test_every_gradient_passes_the_gate(problem):
    report = check_gradients("cutile", make_inputs(problem, device="cuda", seed=3), torch.bfloat16,
                             torch.device("cuda"), seed=3)
    print("[cutile]", {name: round(r["bound_ratio"], 3) for name, r in report.items()})
    assert {"dx", "ddt", "dA", "dB", "dC", "dD", "ddt_bias", "dinitial_states"} <= set(report)
    assert all(r["ok"] for r in report.values()), report


def _gradients(backend: str, problem: Problem, seed: int, **switches) -> dict:
    inputs = make_inputs(problem, device="cuda", seed=seed)
    grads_in = output_gradients(inputs, seed)
    kw = forward_arguments(inputs)
    leaves = {n: kw[n].detach().clone().requires_grad_() for n in GRAD_INPUTS if kw.get(n) is not None}
    impl = get_backend(backend, **switches) if switches else backend
    out = impls.ssd(**{**kw, **leaves}, backend=impl)
    found = torch.autograd.grad([out.y, out.final_states], list(leaves.values()),
                                [grads_in["y"].to(out.y.dtype), grads_in["final_states"].float()])
    return dict(zip(leaves, found))


def test_two_backward_calls_and_recomputed_states_give_the_same_bits():
    """Every reduction is per-head/chunk partials summed in a fixed order: no float atomics; switch
    bwd_recompute_states runs the forward's own stage 2 again."""
    first, again = _gradients("cutile", MEDIUM, 4), _gradients("cutile", MEDIUM, 4)
    recomputed = _gradients("cutile", MEDIUM, 4, bwd_recompute_states=True)
    for name, grad in first.items():
        assert torch.equal(grad, again[name]), name
        assert torch.equal(grad, recomputed[name]), name


@pytest.mark.parametrize("problem", CASES[:2])
def test_bwd_cb_shared_passes_the_gate(problem):
    backend = get_backend("cutile", bwd_cb="shared")
    report = check_gradients(backend, make_inputs(problem, device="cuda", seed=3), torch.bfloat16,
                             torch.device("cuda"), seed=3)
    print("[cutile bwd_cb=shared]", {name: round(r["bound_ratio"], 3) for name, r in report.items()})
    assert {"dx", "ddt", "dA", "dB", "dC", "dD", "ddt_bias", "dinitial_states"} <= set(report)
    assert all(r["ok"] for r in report.values()), report


def test_bwd_cb_shared_two_backward_calls_give_the_same_bits():
    first, again = _gradients("cutile", MEDIUM, 4, bwd_cb="shared"), _gradients("cutile", MEDIUM, 4, bwd_cb="shared")
    for name, grad in first.items():
        assert torch.equal(grad, again[name]), name


# gradients of one element each (not sums over the batch and time, whose cancellation the gate allows for by its sum
# floor, harness/gradient_gate.py SUMS): within bf16's flat tolerance of each other
ELEMENTWISE = ("x", "z", "dt", "B", "C", "initial_states")


@pytest.mark.parametrize("problem", [MEDIUM, CONTRACT], ids=["medium", "contract"])
def test_the_same_gradients_as_our_triton_backward(problem):
    """The same algorithm in both languages, the same operands rounded to bf16: every gradient of one element each
    within bf16's flat tolerance of the Triton backward's (all of them printed; each passes its own gate above)."""
    cutile, triton = _gradients("cutile", problem, 6), _gradients("triton", problem, 6)
    apart = {name: rel_err(grad, triton[name]) for name, grad in cutile.items()}
    print("[cutile vs triton]", {name: f"{err:.2e}" for name, err in apart.items()})
    assert all(apart[name] <= tolerance(torch.bfloat16) for name in ELEMENTWISE if name in apart), apart
