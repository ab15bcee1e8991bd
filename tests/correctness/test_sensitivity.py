"""The correctness checks can fail: deliberately broken copies of the reference must each be caught by the same
comparison the real backends go through (tests/common.run_case)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from impls.problem import Problem
from impls.reference import chunk_cumsum, compute_out, fwd_pass_state
from impls.reference.backend import ReferenceBackend
from impls.reference.fwd_pass_state import chunk_local_states, pass_states
from tests.common import TINY, failures, run_case


class DropsD(ReferenceBackend):
    def compute_out(self, C, B, x, dt, dA_cumsum, states, D, z, seq_idx):
        return compute_out(C, B, x, dt, dA_cumsum, states, None, z, seq_idx)


class IgnoresZ(ReferenceBackend):
    def compute_out(self, C, B, x, dt, dA_cumsum, states, D, z, seq_idx):
        return compute_out(C, B, x, dt, dA_cumsum, states, D, None, seq_idx)


class IgnoresDtBias(ReferenceBackend):
    def chunk_cumsum(self, dt, A, chunk_size, dt_bias, dt_softplus, dt_limit):
        return chunk_cumsum(dt, A, chunk_size, None, dt_softplus, dt_limit)


class IgnoresInitialStates(ReferenceBackend):
    def fwd_pass_state(self, B, x, dt, dA_cumsum, initial_states, seq_idx, state_dtype):
        return fwd_pass_state(B, x, dt, dA_cumsum, None, seq_idx, state_dtype)


class IgnoresSeqIdx(ReferenceBackend):
    def fwd_pass_state(self, B, x, dt, dA_cumsum, initial_states, seq_idx, state_dtype):
        return fwd_pass_state(B, x, dt, dA_cumsum, initial_states, None, state_dtype)

    def compute_out(self, C, B, x, dt, dA_cumsum, states, D, z, seq_idx):
        return compute_out(C, B, x, dt, dA_cumsum, states, D, z, None)


class DecayOffByOne(ReferenceBackend):
    """Carries states across a chunk boundary with the decay of the chunk's second-to-last token."""

    def fwd_pass_state(self, B, x, dt, dA_cumsum, initial_states, seq_idx, state_dtype):
        local = chunk_local_states(B, x, dt, dA_cumsum, seq_idx)
        entering, final = pass_states(local, dA_cumsum[..., -2], initial_states)
        return entering.to(state_dtype or x.dtype), final.float()


BROKEN = [
    pytest.param(DropsD, Problem(TINY), id="D-dropped"),
    pytest.param(IgnoresZ, Problem(TINY, has_z=True), id="z-ignored"),
    pytest.param(IgnoresDtBias, Problem(TINY), id="dt_bias-ignored"),
    pytest.param(IgnoresInitialStates, Problem(TINY, has_initial_states=True), id="initial-states-ignored"),
    pytest.param(IgnoresSeqIdx, Problem(TINY, nseqs=3), id="seq_idx-ignored"),
    pytest.param(DecayOffByOne, Problem(TINY), id="chunk-boundary-decay-off-by-one"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("broken, problem", BROKEN)
def test_broken_reference_is_caught(broken, problem, dtype):
    errors = run_case(broken(), problem, dtype, seed=3)
    assert failures(errors, dtype), f"{broken.__name__} passed every check: {errors}"


def test_unbroken_reference_passes():
    errors = run_case(ReferenceBackend(), dataclasses.replace(Problem(TINY), has_z=True, nseqs=3,
                                                              has_initial_states=True), torch.float32, seed=3)
    assert not failures(errors, torch.float32), errors
