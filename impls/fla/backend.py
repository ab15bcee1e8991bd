"""The "fla" backend: FLA 0.6.0's chunked simple GLA (Triton) computing the SSD forward through an exact map.

FLA has no stage split: only the whole forward (`ssd_forward` = `prepare` -> `peer` -> `finish`); the stage
methods raise NotImplementedError and its declaration (`STAGES = ("forward",)` in __init__.py) says so.
mapping.py holds the map; docs/peers.md derives it and quantifies each way a near-miss mapping goes wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from impls.fla import mapping, peer
from impls.problem import Problem, per_sequence_initial_states
from impls.registry import ForwardOnlyBackend, ForwardResult, installed_files, pinned_version, register, switch

FLOAT_DTYPES = ("float32", "float16", "bfloat16")
NO_STAGES = ("fla: FLA's chunk_simple_gla has no stage split matching the contract (chunk-local states, state "
             "passing and output are its internal kernels, on its own chunk); only ssd_forward is available")
INTERPRETER_FAILS = ("FLA 0.6.0's chunk_fwd_kernel_h calls `.to(tl.int64)` on its `range` loop index, which the "
                     "Triton 3.6 interpreter (TRITON_INTERPRET=1) hands over as a Python int: AttributeError; so "
                     "FLA runs on CUDA devices only")


@dataclass(frozen=True)
class FlaSwitches:
    chunk: str = switch(
        "fla", "FLA's chunk length: 'fla' = its own default (64) whatever the problem's chunk_size (the result "
               "does not depend on it); 'requested' = pass the problem's chunk_size (FLA 0.6.0 takes any power of "
               "two through its chunk_size keyword)", choices=("fla", "requested"))
    state_v_first: bool = switch(
        False, "FLA's state_v_first: store states (headdim, dstate) — the contract's layout — instead of FLA's "
               "default (dstate, headdim), which costs a transposed copy of the initial state in `prepare`")


@register
class FlaBackend(ForwardOnlyBackend):
    """FLA 0.6.0 chunk_simple_gla (Triton); CUDA only; whole forward only."""

    NO_PER_SEQUENCE_INITIAL_STATES = ""  # FLA's varlen kernels take one initial state per sequence natively

    name = "fla"
    Switches = FlaSwitches
    NO_STAGES = NO_STAGES
    TUNED = True  # FLA's Triton autotuners pick their configs on the first call
    TILE_PROTOCOL = "peer-autotune"

    # --- capability -------------------------------------------------------------------------------------
    @classmethod
    def available(cls) -> tuple[bool, str]:
        ok, reason = pinned_version("fla-core", peer.version(), peer.VERSION_REQUIRED)
        if not ok:
            return ok, reason
        try:
            peer.load()
        except Exception as exc:
            return False, f"fla.ops.simple_gla cannot be imported: {exc}"
        return True, ""

    @classmethod
    def peer_files(cls) -> dict[str, Path]:
        """Every .py file of the installed fla: chunk_simple_gla imports across the package (ops/common, ops/utils,
        utils)."""
        return installed_files("fla")

    def check_device(self, device) -> tuple[bool, str]:
        device = torch.device(device)
        if device.type != "cuda":
            return False, f"{device.type} tensors: {INTERPRETER_FAILS}"
        return True, ""

    def supports(self, problem: Problem) -> tuple[bool, str]:
        s = problem.shape
        if problem.dtype not in FLOAT_DTYPES:
            return False, f"dtype {problem.dtype}: FLA's kernels take {FLOAT_DTYPES}"
        if problem.has_seq_idx and not problem.varlen:
            return False, ("seq_idx without cu_seqlens: FLA marks packed sequences by cu_seqlens only (batch 1); "
                           "deriving them from seq_idx would need a device-to-host sync")
        if problem.varlen and s.batch != 1:
            return False, "cu_seqlens: FLA (like the contract) takes packed sequences in batch 1 only"
        if problem.state_dtype not in (None, problem.dtype):
            return False, ("state_dtype: FLA keeps its per-chunk states internal (in the input dtype); the forward "
                           "returns none, so a different state dtype cannot be honoured")
        if s.ngroups and s.nheads % s.ngroups:
            return False, f"ngroups {s.ngroups} does not divide nheads {s.nheads}"
        if self.switches.chunk == "requested" and (s.chunk_size & (s.chunk_size - 1) or s.chunk_size < 16):
            return False, f"chunk='requested': FLA needs a power-of-two chunk_size >= 16, got {s.chunk_size}"
        return True, ""

    def tf32_matmuls(self, stage, device) -> bool:
        # tl.dot on fp32 inputs runs in tf32 (Triton's default input_precision)
        return True

    def chunk_used(self, requested: int) -> int:
        return requested if self.switches.chunk == "requested" else peer.FLA_DEFAULT_CHUNK

    # --- the whole forward: prepare (adapter) -> peer (FLA) -> finish (adapter) ------------------------------
    def prepare(self, x, dt, A, B, C, chunk_size, dt_bias=None, initial_states=None, cu_seqlens=None,
                dt_softplus=False, dt_limit=(0.0, float("inf"))) -> mapping.GlaArgs:
        """mapping.STEPS "prepare.*": FLA's q, k, v, g, initial state and cu_seqlens."""
        return mapping.gla_args(x, dt, A, B, C, self.chunk_used(chunk_size), dt_bias, initial_states, cu_seqlens,
                                dt_softplus, dt_limit, self.switches.state_v_first)

    def peer(self, args: mapping.GlaArgs):
        """FLA's kernels only: (o, final states in FLA's layout)."""
        return peer.run(args)

    def finish(self, raw, x, D=None, z=None, cu_seqlens=None, own_initial_states=False) -> ForwardResult:
        """mapping.STEPS "finish.*"."""
        o, ht = raw
        y, final, per_seq = mapping.finish(o, ht, x, D, z, self.switches.state_v_first, cu_seqlens,
                                           own_initial_states)
        return ForwardResult(y, final, per_seq)

    def ssd_forward(self, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
                    dt_softplus, dt_limit, state_dtype):
        if seq_idx is not None and cu_seqlens is None:
            raise NotImplementedError("fla: seq_idx needs cu_seqlens (supports() refuses it)")
        args = self.prepare(x, dt, A, B, C, chunk_size, dt_bias, initial_states, cu_seqlens, dt_softplus,
                            dt_limit)
        return self.finish(self.peer(args), x, D, z, args.cu_seqlens, per_sequence_initial_states(initial_states, x))

    def forward_parts(self, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
                      dt_softplus, dt_limit, state_dtype):
        args = self.prepare(x, dt, A, B, C, chunk_size, dt_bias, initial_states, cu_seqlens, dt_softplus, dt_limit)
        raw = self.peer(args)
        return {
            "adapter_prepare": lambda: self.prepare(x, dt, A, B, C, chunk_size, dt_bias, initial_states, cu_seqlens,
                                                    dt_softplus, dt_limit),
            "peer": lambda: self.peer(args),
            "adapter_finish": lambda: self.finish(raw, x, D, z, args.cu_seqlens,
                                                  per_sequence_initial_states(initial_states, x)),
        }

    # --- the backward: FLA's own raises on Hopper with this Triton (FLA #640); recorded, not worked around ------
    NO_BACKWARD = ("FLA 0.6.0's chunk_simple_gla backward raises on Hopper (sm_90) with Triton >= 3.4 and < 3.7.1 "
                   "unless its TileLang backend is installed (fla/ops/common/chunk_o.py, FLA #640: chunk_bwd_dqkwg "
                   "'produces incorrect results'); this study's cards are Hopper with Triton 3.6 and no TileLang, so "
                   "the adapter takes no gradients and no workaround is tried")

    # --- what ran -----------------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out.update({
            "peer": f"fla-core {peer.version()} (fla.ops.simple_gla.chunk_simple_gla)",
            "stages": list(self.STAGES),
            "chunk_size_used": "the problem's chunk_size" if self.switches.chunk == "requested"
            else peer.FLA_DEFAULT_CHUNK,
            "adapter_steps": dict(mapping.STEPS),
            "mapping": "q=C, k=B (groups repeated to heads), v=dt·x, g=dt·A (natural log, fp32), scale=1",
            "tf32": "float32 inputs: tl.dot runs in tf32",
        })
        return out
