"""Our cuTile backward (impls/cutile/backward/) through `impls.ssd` on the GPU: the gradient gate
(harness/gradient_gate.py: float64 autograd through the reference as the truth, NaN-poisoned allocations) in bf16 at a
medium shape with S1's blocks (chunk 256, headdim 64, dstate 128; the peers' test_backward.py shape) and at one
covering more of the contract (ngroups 2, z, per-channel D, seq_idx, initial states, seqlen not a multiple of the
chunk); the per-sequence states' gradient (cu_seqlens); two backward calls giving the same bits; and the gradients of
our Triton backward on the same inputs. Switch bwd_cb='shared' (the groups' C·Bᵀ formed once by cb_kernel, loaded by
the chunk kernel) through the same gate at the first two shapes, and its two calls the same bits too; switch
bwd_group_split 4 (each group's heads over 4 programs) with and without bwd_atomics likewise, two calls under
bwd_atomics within bf16's tolerance of each other (not bitwise); switch bwd_exp2_ftz through the gate at the first
two shapes. The CPU checks (AOT compiles, the kernels under
emulation) are tests/backends/test_cutile_backward.py."""

from __future__ import annotations

import pytest
import torch

from impls.registry import get_backend
from impls.tolerance import rel_err, tolerance
from tests.gpu.backward_cases import (
    CASES,
    CONTRACT,
    GROUP_SPLIT,
    MEDIUM,
    assert_every_gradient_passes,
    assert_two_calls_agree,
)
from tests.gpu.backward_cases import gradients as _gradients

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _needs_cuda_tile():
    pytest.importorskip("cuda.tile")


@pytest.mark.parametrize("problem", CASES)
def test_every_gradient_passes_the_gate(problem):
    assert_every_gradient_passes("cutile", problem, "cutile")


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
    assert_every_gradient_passes(get_backend("cutile", bwd_cb="shared"), problem, "cutile bwd_cb=shared")


@pytest.mark.parametrize("problem", CASES[:2])
def test_bwd_exp2_ftz_passes_the_gate(problem):
    """Switch bwd_exp2_ftz: every backward kernel's exp2 flushing subnormals to zero (the CPU's emulator cannot)."""
    assert_every_gradient_passes(get_backend("cutile", bwd_exp2_ftz=True), problem, "cutile bwd_exp2_ftz")


@pytest.mark.parametrize("problem", CASES[:2])
@pytest.mark.parametrize("sources", ["chunk", "tiles"])
def test_bwd_dcb_sources_both_arrangements_pass_the_gate(problem, sources):
    """Switch bwd_dcb_sources: 'chunk' (the sm_90 default since 2026-12-07) and 'tiles', each asked for by name."""
    assert_every_gradient_passes(get_backend("cutile", bwd_dcb_sources=sources), problem,
                                 f"cutile bwd_dcb_sources={sources}")


def test_bwd_cb_shared_two_backward_calls_give_the_same_bits():
    first, again = _gradients("cutile", MEDIUM, 4, bwd_cb="shared"), _gradients("cutile", MEDIUM, 4, bwd_cb="shared")
    for name, grad in first.items():
        assert torch.equal(grad, again[name]), name


@pytest.mark.parametrize("problem", CASES[:2])
@pytest.mark.parametrize("switches", GROUP_SPLIT)
def test_bwd_group_split_passes_the_gate(problem, switches):
    assert_every_gradient_passes(get_backend("cutile", **switches), problem, f"cutile {switches}")


@pytest.mark.parametrize("switches", GROUP_SPLIT)
def test_bwd_group_split_two_backward_calls_agree(switches):
    """The same bits with the partials summed without atomics; within bf16's tolerance under bwd_atomics (not
    bitwise)."""
    first, again = _gradients("cutile", MEDIUM, 4, **switches), _gradients("cutile", MEDIUM, 4, **switches)
    assert_two_calls_agree(first, again, switches)


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
