"""The "vllm" backend: vLLM 0.33.0's Mamba-2 prefill SSD kernels (Triton), the ones its serving engine runs,
behind the contract through its varlen entry point `mamba_chunk_scan_combined_varlen`.

Whole forward only (`STAGES = ("forward",)` in __init__.py): vLLM's intermediates differ from the contract's (its
state passing stores the state after each chunk, the contract the state entering it), so its stages do not chain
with ours. The forward is `prepare` (adapter) -> `peer` (vLLM's five kernels) -> `finish` (views); mapping.py
holds the map, docs/peers.md explains it.
"""

from __future__ import annotations

import contextlib
import types
from pathlib import Path
from typing import Any

import torch

from impls.mamba_ssm.upstream import interpreter_mode, interpreter_refuses, interpreting
from impls.problem import Problem
from impls.registry import ForwardOnlyBackend, ForwardResult, pinned_version, register
from impls.vllm import loader, mapping

FLOAT_DTYPES = ("float32", "float16", "bfloat16")
ENTRY = "vllm.model_executor.layers.mamba.ops.ssd_combined.mamba_chunk_scan_combined_varlen"
GRID_AXIS_MAX = 65535  # CUDA's limit on grid axes 1 and 2
NO_STAGES = ("vllm: only the whole forward is available (vLLM's state passing stores the state after each chunk, "
             "not the state entering it, so its kernels do not chain with the contract's stages)")


def vllm_chunks(problem: Problem) -> int:
    """vLLM's chunk count: exact for a batch; for packed sequences the most it can be (each of the nseqs - 1
    inner boundaries may split one more chunk), since supports() sees the sequence count but not the lengths."""
    s = problem.shape
    if problem.varlen:
        return -(-s.seqlen // s.chunk_size) + problem.nseqs - 1
    return s.batch * -(-s.seqlen // s.chunk_size)


@register
class VllmBackend(ForwardOnlyBackend):
    """vLLM 0.33.0 (Triton); CUDA, or CPU tensors under TRITON_INTERPRET=1; whole forward only."""

    NO_PER_SEQUENCE_INITIAL_STATES = ""  # its varlen forward takes one initial state per sequence natively
    NO_BACKWARD = "vLLM is an inference engine: its SSD kernels have no backward"

    name = "vllm"
    # vLLM itself is never installed: its SSD kernel files are checked by available() (impls/vllm/loader.py)
    TUNED = True  # its Triton autotuners pick their configs on the first call of a shape
    TILE_PROTOCOL = "peer-autotune"
    NO_STAGES = NO_STAGES
    NON_INCREASING_DECAY = ("vLLM's kernels (they clamp dt at >= dt_limit's low end, 0 by default, and "
                            "exp(dA_cumsum[l] - dA_cumsum[s]) at <= 1: they assume dA_cumsum non-increasing inside a "
                            "chunk)")

    # --- capability -------------------------------------------------------------------------------------
    @classmethod
    def available(cls) -> tuple[bool, str]:
        root = loader.find_root()
        if root is None:
            return False, loader.where()
        ok, reason = pinned_version("vllm", loader.version(root), loader.VERSION_REQUIRED)
        if not ok:
            return ok, f"{reason} (at {root})"
        try:
            loader.load()
        except Exception as exc:  # noqa: BLE001 - the reason is the answer
            return False, f"vLLM's SSD modules cannot be loaded from {root}: {exc}"
        return True, ""

    @classmethod
    def peer_files(cls) -> dict[str, Path]:
        """vLLM's SSD kernel files that loader.load() executes, where it finds them."""
        return loader.kernel_files()

    def check_device(self, device) -> tuple[bool, str]:
        device = torch.device(device)
        if device.type == "cuda" or (device.type == "cpu" and interpreting()):
            return True, ""
        return False, f"Triton kernels need a CUDA device, or CPU tensors with TRITON_INTERPRET=1 (got {device})"

    def supports(self, problem: Problem) -> tuple[bool, str]:
        s = problem.shape
        if problem.dtype not in FLOAT_DTYPES:
            return False, (f"dtype {problem.dtype}: vLLM forms C·Bᵀ with tl.dot in fp32 for any input that is not "
                           f"fp16/bf16 (ssd_bmm.py dot_dtype), so {problem.dtype} would silently run in fp32")
        if s.chunk_size <= 0 or s.chunk_size & (s.chunk_size - 1):
            return False, f"chunk_size {s.chunk_size}: vLLM asserts a power of two"
        if s.ngroups <= 0 or s.nheads % s.ngroups:
            return False, f"ngroups {s.ngroups} does not divide nheads {s.nheads}"
        if problem.has_seq_idx and not problem.varlen:
            return False, ("seq_idx without cu_seqlens: vLLM takes sequence boundaries as host-built chunk "
                           "metadata; deriving them from seq_idx would need a device-to-host sync per call")
        if problem.varlen and s.batch != 1:
            return False, "cu_seqlens: packed sequences in batch 1 only (the contract's form)"
        chunks = vllm_chunks(problem)
        if chunks * s.ngroups > GRID_AXIS_MAX:
            return False, (f"{chunks} chunks × {s.ngroups} groups > {GRID_AXIS_MAX}: vLLM launches its C·Bᵀ kernel "
                           f"with chunks × groups on grid axis 1 (and chunk states, chunk scan with chunks there), "
                           f"which CUDA caps at {GRID_AXIS_MAX}")
        why = interpreter_refuses(problem)  # last: what the kernels cannot do anywhere is said first
        return not why, why

    def tf32_matmuls(self, stage: str, device: torch.device) -> bool:
        # tl.dot on fp32 inputs uses tf32 on the GPU (Triton's default input_precision); exact in the interpreter
        return device.type == "cuda"

    # --- the whole forward: prepare (adapter) -> peer (vLLM) -> finish (adapter) ------------------------------
    @staticmethod
    def _modules() -> types.SimpleNamespace:
        mods = loader.load()
        return types.SimpleNamespace(**{name: getattr(mods, name) for name in loader.SSD_FILES})

    def _mode(self, device):
        return interpreter_mode(self._modules()) if device.type == "cpu" else contextlib.nullcontext()

    def prepare(self, x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")), state_dtype=None):
        """mapping.STEPS "prepare.*"."""
        return mapping.varlen_args(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens,
                                   dt_softplus, dt_limit, state_dtype)

    def peer(self, args: mapping.VarlenArgs) -> None:
        """vLLM's kernels only (chunk cumsum, chunk states, state passing, C·Bᵀ, chunk scan)."""
        with self._mode(args.x.device):
            mapping.run(loader.load().ssd_combined, args)

    def finish(self, args: mapping.VarlenArgs, varlen: bool) -> ForwardResult:
        y, final, per_seq = mapping.finish(args, varlen)
        return ForwardResult(y, final, per_seq)

    def ssd_forward(self, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
                    dt_softplus, dt_limit, state_dtype):
        if seq_idx is not None and cu_seqlens is None:
            raise NotImplementedError("vllm: seq_idx needs cu_seqlens (supports() refuses it)")
        args = self.prepare(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens, dt_softplus,
                            dt_limit, state_dtype)
        self.peer(args)
        return self.finish(args, varlen=cu_seqlens is not None)

    def forward_parts(self, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
                      dt_softplus, dt_limit, state_dtype):
        def prepare():
            return self.prepare(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, cu_seqlens,
                                dt_softplus, dt_limit, state_dtype)

        args = prepare()
        varlen = cu_seqlens is not None
        parts = {"adapter_prepare": prepare, "peer": lambda: self.peer(args),
                 "adapter_finish": lambda: self.finish(args, varlen)}
        if not varlen:  # what the cached metadata costs to build (paid once per shape and device)
            b, L = x.shape[:2]
            parts["adapter_metadata_uncached"] = lambda: mapping.batch_metadata(b, L, chunk_size, x.device,
                                                                                cached=False)
        return parts

    # --- what ran -----------------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        out = super().describe()
        root = loader.find_root()
        out.update({
            "peer": f"vllm {loader.version(root) if root else None} ({ENTRY})",
            "files": str(root / loader.OPS) if root else None,
            "stand_ins": "vllm.triton_utils, vllm.platforms.current_platform, ops.mamba_ssm.softplus "
                         "(impls/vllm/loader.py)",
            "stages": list(self.STAGES),
            "adapter_steps": dict(mapping.STEPS),
            "chunking": "chunks restart at every sequence start (vLLM's alignment)",
            "tf32": "float32 inputs: tl.dot runs in tf32 on the GPU",
            "autotuned": self.autotuned(),
        })
        return out

    @staticmethod
    def autotuned() -> dict[str, str]:
        """The config each of vLLM's autotuned kernels last picked in this process (what ran), by kernel name."""
        import triton

        if loader.loaded() is None:
            return {}
        out = {}
        for module in vars(VllmBackend._modules()).values():
            for name, value in vars(module).items():
                if isinstance(value, triton.runtime.Autotuner) and getattr(value, "best_config", None) is not None:
                    out[name] = str(value.best_config)
        return out
