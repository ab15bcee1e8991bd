"""Registers upstream mamba-ssm's SSD forward as the backend "mamba_ssm"."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from impls import validate as check
from impls.mamba_ssm import upstream
from impls.mamba_ssm.chunk_cumsum import chunk_cumsum
from impls.mamba_ssm.compute_out import compute_out
from impls.mamba_ssm.fwd_pass_state import fwd_pass_state
from impls.mamba_ssm.layout import upstream_layout
from impls.problem import Problem
from impls.registry import Backend, BackendUnavailable, ForwardResult, installed_files, pinned_version, register, switch


@dataclass(frozen=True)
class MambaSSMSwitches:
    fused: bool = switch(
        True, "ssd_forward calls upstream's fused forward (_mamba_chunk_scan_combined_fwd, what "
              "mamba_chunk_scan_combined runs) instead of composing the five upstream kernels stage by stage")


def upstream_cu_seqlens_guard(cu_seqlens, seqlen: int) -> None:
    """Upstream's varlen kernel reads the chunk of each offset without a bound: an offset past seqlen reads past
    the states and dA_cumsum. The offsets are read on the host here (one small copy) and refused as the other
    backends refuse them (`validate.cu_seqlens_bounds`), whatever check_values says."""
    check.cu_seqlens_bounds(cu_seqlens.tolist(), seqlen)


@register
class MambaSSMBackend(Backend):
    """mamba-ssm 2.3.2.post1: its Triton kernels, unchanged; on CPU tensors only under TRITON_INTERPRET=1."""

    name = "mamba_ssm"
    NO_PER_SEQUENCE_INITIAL_STATES = ("upstream's kernels take initial_states (batch, ...) and apply a row's to its "
                                      "first sequence only (mamba_ssm/ops/triton/ssd_state_passing.py)")
    Switches = MambaSSMSwitches
    TUNED = True  # upstream's Triton autotuners pick their configs on the first call
    TILE_PROTOCOL = "peer-autotune"
    NON_INCREASING_DECAY = ("mamba-ssm's kernels (they clamp dt at >= dt_limit's low end, 0 by default, and "
                            "exp(dA_cumsum[l] - dA_cumsum[s]) at <= 1: they assume dA_cumsum non-increasing inside a "
                            "chunk)")
    _up = None

    @classmethod
    def available(cls):
        try:
            cls.upstream()
        except ImportError as exc:
            return False, f"mamba-ssm SSD kernels cannot be imported ({exc}); install as the README says"
        return pinned_version("mamba-ssm", upstream.version(), upstream.VERSION_REQUIRED)

    @classmethod
    def peer_files(cls) -> dict[str, Path]:
        """Every .py file of the installed mamba_ssm: its SSD modules import across the package."""
        return installed_files("mamba_ssm")

    @classmethod
    def upstream(cls):
        if cls._up is None:
            cls._up = upstream.load()
        return cls._up

    def check_device(self, device):
        if device.type == "cuda":
            return True, ""
        if device.type == "cpu" and upstream.interpreting():
            return True, ""
        return False, f"Triton kernels need a CUDA device, or CPU tensors with TRITON_INTERPRET=1 (got {device})"

    def supports(self, problem: Problem):
        if problem.dtype not in ("float32", "float16", "bfloat16"):
            return False, (f"dtype {problem.dtype}: upstream's kernels compute in fp32 (fp32 dt, dA_cumsum and "
                           f"accumulators), so {problem.dtype} inputs would silently run at fp32 precision")
        if problem.varlen and problem.has_initial_states:
            return False, ("upstream chunk_state_varlen ignores the initial state when the first sequence ends "
                           "inside the first chunk; whether it does depends on cu_seqlens' values, which a problem "
                           "does not fix, so every varlen problem with initial states is refused")
        if self.switches.fused and problem.state_dtype not in (None, problem.dtype):
            return False, ("the fused forward stores states in C's dtype; state_dtype needs fused=False "
                           "(the stage-by-stage path)")
        why = upstream.interpreter_refuses(problem)  # last: what the kernels cannot do anywhere is said first
        return not why, why

    def tf32_matmuls(self, stage, device) -> bool:
        # tl.dot on fp32 inputs uses tf32 on the GPU (Triton's default input_precision); exact in the interpreter
        return device.type == "cuda"

    def _mode(self, device):
        return upstream.interpreter_mode(self.upstream()) if device.type == "cpu" else contextlib.nullcontext()

    def chunk_cumsum(self, dt, A, chunk_size, dt_bias, dt_softplus, dt_limit):
        with self._mode(dt.device):
            return chunk_cumsum(self.upstream(), dt, A, chunk_size, dt_bias, dt_softplus, dt_limit)

    def fwd_pass_state(self, B, x, dt, dA_cumsum, initial_states, seq_idx, state_dtype):
        with self._mode(x.device):
            return fwd_pass_state(self.upstream(), B, x, dt, dA_cumsum, initial_states, seq_idx, state_dtype)

    def compute_out(self, C, B, x, dt, dA_cumsum, states, D, z, seq_idx):
        with self._mode(x.device):
            return compute_out(self.upstream(), C, B, x, dt, dA_cumsum, states, D, z, seq_idx)

    def varlen_states(self, B, x, dt, dA_cumsum, states, cu_seqlens):
        upstream_cu_seqlens_guard(cu_seqlens, x.shape[1])
        B, x = upstream_layout(B=B, x=x)
        with self._mode(x.device):
            return self.upstream().ssd_chunk_state.chunk_state_varlen(
                B[0], x[0], dt[0], dA_cumsum[0], cu_seqlens, states[0])

    BACKWARD = ("upstream's autograd function (mamba_chunk_scan_combined), unchanged: its forward keeps the inputs "
                "and y; its backward recomputes chunk_cumsum, C·Bᵀ, the chunk states and the state pass")

    def forward_for_backward(self, args, needs):
        from impls.graph_backward import graph_backward

        if args["cu_seqlens"] is not None:
            raise BackendUnavailable("mamba_ssm has no backward with cu_seqlens: upstream's backward asserts that "
                                     "return_varlen_states is off (mamba_ssm/ops/triton/ssd_combined.py, "
                                     "MambaChunkScanCombinedFn.backward)")
        if args["state_dtype"] not in (None, args["x"].dtype):
            raise BackendUnavailable("mamba_ssm has no backward with a state_dtype of its own: upstream's autograd "
                                     "function stores states in C's dtype")
        device = args["x"].device

        def forward(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens, dt_softplus,
                    dt_limit, state_dtype):
            with self._mode(device):
                y, final_states = self.upstream().ssd_combined.mamba_chunk_scan_combined(
                    x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states,
                    seq_idx=seq_idx, dt_softplus=dt_softplus, dt_limit=dt_limit, return_final_states=True)
            return ForwardResult(y, final_states)

        return graph_backward(forward, args, needs, context=lambda: self._mode(device))

    def ssd_forward(self, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
                    dt_softplus, dt_limit, state_dtype):
        if not self.switches.fused:
            return super().ssd_forward(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx,
                                       cu_seqlens, dt_softplus, dt_limit, state_dtype)
        if cu_seqlens is not None:
            upstream_cu_seqlens_guard(cu_seqlens, x.shape[1])
        with self._mode(x.device):
            res = self.upstream().ssd_combined._mamba_chunk_scan_combined_fwd(
                x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states,
                seq_idx=seq_idx, cu_seqlens=cu_seqlens, dt_softplus=dt_softplus, dt_limit=dt_limit)
        out, _out_x, dt_out, dA_cumsum, states, final_states = res[:6]
        return ForwardResult(out, final_states, res[6] if cu_seqlens is not None else None, dt_out, dA_cumsum,
                             states)
