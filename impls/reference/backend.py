"""Registers the reference stages as the backend "reference"."""

from __future__ import annotations

from impls.reference.chunk_cumsum import chunk_cumsum
from impls.reference.compute_out import compute_out
from impls.reference.fwd_pass_state import fwd_pass_state
from impls.reference.varlen import varlen_states
from impls.registry import Backend, register


@register
class ReferenceBackend(Backend):
    """PyTorch, any device and dtype; float64 inputs compute in float64 (the ground truth)."""

    name = "reference"
    # plain torch ops throughout; tests/models/test_mamba2_layer.py checks the gradients against the sequential
    # definition
    DIFFERENTIABLE = True
    NO_PER_SEQUENCE_INITIAL_STATES = ""
    BACKWARD = "torch autograd through the chunked stages in the inputs' dtype (the forward keeps its graph)"

    def forward_for_backward(self, args, needs):
        from impls.graph_backward import graph_backward

        return graph_backward(self.ssd_forward, args, needs)

    def chunk_cumsum(self, dt, A, chunk_size, dt_bias, dt_softplus, dt_limit):
        return chunk_cumsum(dt, A, chunk_size, dt_bias, dt_softplus, dt_limit)

    def fwd_pass_state(self, B, x, dt, dA_cumsum, initial_states, seq_idx, state_dtype):
        return fwd_pass_state(B, x, dt, dA_cumsum, initial_states, seq_idx, state_dtype)

    def compute_out(self, C, B, x, dt, dA_cumsum, states, D, z, seq_idx, initial_states=None):
        return compute_out(C, B, x, dt, dA_cumsum, states, D, z, seq_idx, initial_states=initial_states)

    def varlen_states(self, B, x, dt, dA_cumsum, states, cu_seqlens, initial_states=None):
        return varlen_states(B, x, dt, dA_cumsum, states, cu_seqlens, initial_states)
