"""Our Triton backward (impls/triton/backward/) through `impls.ssd` on the GPU: the gradient gate
(harness/gradient_gate.py: float64 autograd through the reference as the truth, NaN-poisoned allocations) in bf16
at a medium shape with S1's blocks (chunk 256, headdim 64, dstate 128; the peers' test_backward.py shape) and at one
covering more of the contract (ngroups 2, z, per-channel D, seq_idx, initial states, seqlen not a multiple of the
chunk); the per-sequence states' gradient (cu_seqlens); and two backward calls giving the same bits. Switch
bwd_cb='shared' (the groups' C·Bᵀ formed once by cb_kernel, loaded by bwd_chunk) through the same gate at the first
two shapes, and its two calls the same bits too; switch bwd_group_split 4 (each group's heads over 4 programs) with and
without bwd_atomics likewise, two calls under bwd_atomics within bf16's tolerance of each other (not bitwise)."""

from __future__ import annotations

import pytest

from impls.registry import get_backend
from tests.gpu.backward_cases import (
    CASES,
    GROUP_SPLIT,
    MEDIUM,
    assert_every_gradient_passes,
    assert_two_calls_agree,
    gradients,
)


@pytest.mark.parametrize("problem", CASES)
def test_every_gradient_passes_the_gate(problem):
    assert_every_gradient_passes("triton", problem, "triton")


@pytest.mark.parametrize("problem", CASES[:2])
def test_bwd_cb_shared_passes_the_gate(problem):
    assert_every_gradient_passes(get_backend("triton", bwd_cb="shared"), problem, "triton bwd_cb=shared")


@pytest.mark.parametrize("problem", CASES[:2])
@pytest.mark.parametrize("sources", ["chunk", "tiles"])
def test_bwd_dcb_sources_both_arrangements_pass_the_gate(problem, sources):
    """Switch bwd_dcb_sources: 'chunk' (the sm_90 default since 2026-12-07) and 'tiles', each asked for by name."""
    assert_every_gradient_passes(get_backend("triton", bwd_dcb_sources=sources), problem,
                                 f"triton bwd_dcb_sources={sources}")


@pytest.mark.parametrize("problem", CASES[:2])
@pytest.mark.parametrize("switches", GROUP_SPLIT)
def test_bwd_group_split_passes_the_gate(problem, switches):
    assert_every_gradient_passes(get_backend("triton", **switches), problem, f"triton {switches}")


@pytest.mark.parametrize("switches", [pytest.param({}, id="defaults"),
                                      pytest.param({"bwd_cb": "shared"}, id="bwd_cb-shared"),
                                      pytest.param({"bwd_dcb_sources": "chunk"}, id="bwd_dcb_sources-chunk"),
                                      pytest.param({"bwd_dcb_sources": "tiles"}, id="bwd_dcb_sources-tiles"),
                                      *GROUP_SPLIT])
def test_two_backward_calls_give_the_same_bits(switches):
    """Every reduction is per-head/chunk partials summed in a fixed order: no float atomics (but under bwd_atomics,
    whose two calls agree to bf16's tolerance only)."""
    first, again = gradients("triton", MEDIUM, 4, **switches), gradients("triton", MEDIUM, 4, **switches)
    assert_two_calls_agree(first, again, switches)
