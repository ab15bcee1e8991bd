"""The Triton backend ("triton"): the three stages as Triton kernels, written with the same stage boundaries,
layouts and operand orders as the cuTile backend, so that comparing the two isolates the language.

This file wires the stages to the switches and to the tuning protocol: for every stage it resolves a launch
configuration through impls/tuning.py (impls/triton/tune.py: `tunable` declares the stage's space, fallback and
call), clamps block sizes to the problem and remembers what ran, which `describe()` reports. Outputs are allocated with
torch.empty looked up at call time, so tests can NaN-poison them with impls.tolerance.poisoned_allocations.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from impls import defaults, interpreter, tuning
from impls.inner_chunk import InnerChunked, InnerRuns
from impls.problem import Problem, Shape, dtype_name
from impls.registry import Backend, ForwardResult, register
from impls.triton import descriptors, target, tune
from impls.triton.chunk_cumsum import chunk_cumsum as _chunk_cumsum
from impls.triton.clamp import MAX_DSTATE, clamp
from impls.triton.compute_out import compute_out as _compute_out
from impls.triton.defaults import DEFAULTS as TRITON_DEFAULTS
from impls.triton.fused import fused_state_out as _fused_state_out
from impls.triton.fwd_pass_state import chunk_states as _chunk_states
from impls.triton.fwd_pass_state import pass_states as _pass_states
from impls.triton.fwd_pass_state import serial_states as _serial_states
from impls.triton.stages import FUSED
from impls.triton.switches import TritonSwitches
from impls.triton.target import interpreting


@register
class TritonBackend(InnerChunked, Backend):
    """Triton kernels on CUDA tensors; on CPU tensors only under the Triton interpreter (TRITON_INTERPRET=1)."""

    name = "triton"
    Switches = TritonSwitches
    TUNED = True
    TILE_PROTOCOL = None  # per stage, in describe()["stages"] (impls/tuning.py Resolution)
    CANNOT_EXPRESS = {
        "latency_hints": "Triton has no per-load latency hint; the nearest analogues are the num_stages "
                         "(software-pipelining depth) and num_warps switches",
    }

    DEFAULTS = TRITON_DEFAULTS  # per target (impls/triton/defaults.py)
    BACKWARD = ("Triton kernels (impls/triton/backward/): the forward keeps stage 1's dt and dA_cumsum, the final "
                "states and the states entering every chunk (switch bwd_recompute_states: none, stage 2 runs again); "
                "the backward walks the chunks in reverse carrying the state gradient, then per-head chunk, "
                "per-group d(C·Bᵀ)/dC and dB, and chunk_cumsum's backward kernels, every reduction by partials "
                "summed in a fixed order (no atomics; switch bwd_group_split spreads a group's heads over several "
                "programs whose partials are summed without atomics, bwd_atomics adds them atomically); with z, "
                "compute_out runs again without it (ŷ, for dz); with cu_seqlens, the per-sequence states' gradient "
                "goes back through the forward's PyTorch varlen_states by autograd")

    def __init__(self, switches=None, **overrides):
        super().__init__(switches, **overrides)
        why = self.switch_refusal(self.switches)
        if why:
            raise ValueError(why)
        if self.switches.launch_path == "cached" and interpreting():
            raise ValueError("switch launch_path='cached' of backend 'triton': it launches the kernels Triton "
                             "compiled, and the Triton interpreter (TRITON_INTERPRET=1) compiles none; use "
                             "launch_path='triton' there")
        self._resolved: dict[tuple[str, str], tune.Resolved] = {}
        self._keys: dict[tuple, str] = {}  # (stage, shape, dtype, flags) -> record key (switches fixed per instance)
        self._layouts: dict[tuple, str | None] = {}  # input_refusal's answers for aligned inputs, per layout
        self.last_tuning: dict[str, dict[str, Any]] = {}
        self._inner = InnerRuns(self.last_tuning)  # the forward at the inner chunk (switch inner_chunk)

    @classmethod
    def switch_refusal(cls, switches: TritonSwitches) -> str | None:
        """Why these switches do not go together (the text __init__ raises), or None; nothing of the environment
        (the interpreter's refusal of launch_path='cached' is __init__'s own)."""
        sw = switches
        if sw.fuse_state_out and sw.cb_mode == "shared" and sw.fused_program == "row_tile":
            return ("switch fuse_state_out of backend 'triton': the fused kernel's 'row_tile' programs compute C·Bᵀ "
                    "inline; cb_mode='shared' is read by fused_program='chunk' only (use cb_mode='inline', or "
                    "fused_program='chunk')")
        if sw.fuse_state_out and sw.heads_first:
            return ("switch fuse_state_out of backend 'triton': the fused kernel does not read heads_first "
                    "(compute_out's program order); turn one of them off")
        if sw.fuse_state_out and sw.state_pass != TritonSwitches().state_pass:
            return ("switch state_pass of backend 'triton': fuse_state_out=True runs stage 2 inside the fused "
                    f"kernel, so state_pass={sw.state_pass!r} would be recorded without running (leave it at its "
                    "default or turn fuse_state_out off)")
        if sw.fuse_state_out and sw.state_occupancy:
            return ("switch state_occupancy of backend 'triton': fuse_state_out=True runs stage 2 inside the fused "
                    "kernel (its occupancy is `occupancy`'s); leave state_occupancy at 0")
        if sw.fused_program != "row_tile" and not sw.fuse_state_out:
            return (f"switch fused_program={sw.fused_program!r} of backend 'triton': it arranges the programs of the "
                    "fused kernel, which runs only with fuse_state_out=True (set it, or leave fused_program at "
                    "'row_tile')")
        if sw.fuse_state_out and not sw.exp2_ftz:
            return ("switch exp2_ftz=False of backend 'triton': the fused kernel (fuse_state_out) is written with "
                    "tl.exp2 only; leave exp2_ftz at True or turn fuse_state_out off")
        if sw.cb_lower_triangle and (sw.cb_mode != "shared" or sw.fuse_state_out):
            return ("switch cb_lower_triangle of backend 'triton': it arranges compute_out's C·Bᵀ kernel, which runs "
                    f"with cb_mode='shared' and without fuse_state_out only (got cb_mode={sw.cb_mode!r}, "
                    f"fuse_state_out={sw.fuse_state_out})")
        if sw.decay_single and (not sw.decay_factor or sw.fuse_state_out):
            return ("switch decay_single of backend 'triton': it sums compute_out's factored decay (decay_factor) in "
                    "one accumulator, so it needs decay_factor=True and runs without fuse_state_out only (the fused "
                    f"kernel adds the state term after the source tiles; got decay_factor={sw.decay_factor}, "
                    f"fuse_state_out={sw.fuse_state_out})")
        if sw.fuse_state_out and sw.exp_fold:
            return ("switch exp_fold of backend 'triton': the fused kernel (fuse_state_out) multiplies by dt per "
                    "score; turn exp_fold or fuse_state_out off")
        if sw.bwd_atomics and sw.bwd_group_split == 1:
            return ("switch bwd_atomics of backend 'triton': it accumulates the partials of bwd_group_split's k > 1 "
                    "programs per group, and bwd_group_split=1 has one program per group (set bwd_group_split to "
                    "2, 4 or 8, or leave bwd_atomics off)")
        if sw.tma_descriptors == "host" and not sw.tma:
            return ("switch tma_descriptors='host' of backend 'triton': it says where tma's descriptors are made; "
                    "with tma=False there are none (set tma=True, or leave tma_descriptors='device')")
        return None

    # --- capability -------------------------------------------------------------------------------------
    @classmethod
    def tuning_device(cls, device: torch.device) -> str | None:
        return target.device_name(device)  # "triton-interpreter" off the GPU: its records are read under that name

    @classmethod
    def available(cls) -> tuple[bool, str]:
        if interpreting() or torch.cuda.is_available():
            return True, ""
        return False, "no CUDA device, and the Triton interpreter is off (TRITON_INTERPRET=1 before import)"

    def supports(self, problem: Problem) -> tuple[bool, str]:
        if problem.dtype not in ("float32", "float16", "bfloat16"):
            return False, f"dtype {problem.dtype}: the kernels take float32, float16 or bfloat16 inputs"
        if problem.shape.dstate > MAX_DSTATE:
            return False, (f"dstate {problem.shape.dstate} > {MAX_DSTATE}: compute_out holds all of dstate "
                           "in one tile")
        why = interpreter.refuses(problem, interpreting())  # last: what the kernels cannot do anywhere is said first
        return not why, why

    def check_device(self, device: torch.device) -> tuple[bool, str]:
        device = torch.device(device)
        if device.type == "cuda" or (device.type == "cpu" and interpreting()):
            return True, ""
        return False, f"tensors on {device}: Triton runs CUDA tensors (CPU ones only under TRITON_INTERPRET=1)"

    @classmethod
    def target(cls, device: torch.device) -> str:
        """"interpreter" under TRITON_INTERPRET=1 (whatever the device), else the device's."""
        return "interpreter" if interpreting() else defaults.device_target(device)

    def input_refusal(self, entry: str, args: dict[str, Any]) -> str | None:
        """With tma on, why a tensor-descriptor load or store of this call cannot be made, as the stage's own check
        (impls/triton/descriptors.py) would refuse it: x, B, C and given states as passed, and what the call
        allocates contiguous and reads or writes through descriptors (y; stage 2's fp32 local states and, in the
        three-stage forward, the states compute_out reads; in memory order (…, dstate, headdim) with
        transposed_layout). None without tma. Every call asks: with every base pointer aligned, the answer depends
        on the shapes, strides and dtypes only, and is remembered per those (a few of them)."""
        if not self.switches.tma or entry == "chunk_cumsum":
            return None
        x, B, C, states = args["x"], args["B"], args.get("C"), args.get("states")
        pointers = x.data_ptr() | B.data_ptr()
        key = [entry, args.get("state_dtype"), x.dtype, x.shape, x.stride(), B.shape, B.stride()]  # C: B's shape
        if C is not None:
            pointers |= C.data_ptr()
            key.append(C.stride())
        if states is not None:
            pointers |= states.data_ptr()
            key += (states.dtype, states.stride())
        aligned, key = not pointers % 16, tuple(key)
        if aligned and key in self._layouts:
            return self._layouts[key]
        why = self._tma_refusal(entry, args)
        if aligned:
            if len(self._layouts) >= 64:
                self._layouts.clear()
            self._layouts[key] = why
        return why

    def _tma_refusal(self, entry: str, args: dict[str, Any]) -> str | None:
        x, B = args["x"], args["B"]
        given = {name: args[name] for name in ("x", "B", "C") if args.get(name) is not None}
        if args.get("states") is not None:
            given["states"] = descriptors.memory_order(args["states"])
        inner = x.shape[-1] if self.switches.transposed_layout else B.shape[-1]  # the states' last dim in memory
        staged = not self.switches.fuse_state_out
        made = {}  # contiguous tensors the call allocates: name -> (last dimension, bytes per element)
        if entry in ("compute_out", "ssd_forward"):
            made["y"] = (x.shape[-1], x.element_size())
        if entry in ("fwd_pass_state", "ssd_forward") and staged and self.switches.state_pass == "chunk_parallel":
            made["chunk-local states"] = (inner, 4)
        if entry == "ssd_forward" and staged:
            made["states"] = (inner, (args.get("state_dtype") or x.dtype).itemsize)
        reasons = [descriptors.refusal(name, t) for name, t in given.items()]
        reasons += [descriptors.row_refusal(name, *row) for name, row in made.items()]
        why = next((r for r in reasons if r), None)
        return f"switch 'tma' of backend 'triton': {why}" if why else None

    # --- stages -------------------------------------------------------------------------------------------
    def chunk_cumsum(self, dt, A, chunk_size, dt_bias, dt_softplus, dt_limit):
        batch, seqlen, nheads = dt.shape
        shape = Shape(batch, seqlen, nheads, 0, 0, 0, chunk_size)
        dims = {"nheads": nheads, "chunk": chunk_size}
        flags = {"bias": dt_bias is not None, "softplus": bool(dt_softplus),
                 "limit": tuple(dt_limit) != (0.0, math.inf)}

        def launch(config):
            return _chunk_cumsum(dt, A, chunk_size, dt_bias, dt_softplus, dt_limit, config=config,
                                 switches=self.switches, empty=self._empty)

        config = self._config("chunk_cumsum", shape, dtype_name(dt.dtype), flags, dims, dt.device, launch)
        return launch(config)

    def fwd_pass_state(self, B, x, dt, dA_cumsum, initial_states, seq_idx, state_dtype):
        if self.switches.state_pass == "serial":
            return self._serial_states(B, x, dt, dA_cumsum, initial_states, seq_idx, state_dtype)
        shape, dims = self._shape(x, B, dt)
        dtype = dtype_name(x.dtype)
        precision = self._dot_precision(x)

        def launch_local(config):
            return _chunk_states(B, x, dt, dA_cumsum, seq_idx, config=config, switches=self.switches,
                                 empty=self._empty, dot_precision=precision)

        local_config = self._config("chunk_state", shape, dtype, {"seq": seq_idx is not None}, dims, x.device,
                                    launch_local)
        local = launch_local(local_config)
        out_dtype = state_dtype or x.dtype

        def launch_pass(config):
            return _pass_states(local, dA_cumsum, initial_states, seq_idx, x.shape[1], out_dtype, config=config,
                                switches=self.switches, empty=self._empty)

        flags = {"seq": seq_idx is not None, "init": initial_states is not None, "state": dtype_name(out_dtype)}
        pass_config = self._config("state_passing", shape, dtype, flags, dims, x.device, launch_pass)
        return launch_pass(pass_config)

    def _serial_states(self, B, x, dt, dA_cumsum, initial_states, seq_idx, state_dtype):
        """state_pass='serial': one kernel walking the chunks, with chunk_state's launch fields under a key of its
        own (the flag state_pass)."""
        shape, dims = self._shape(x, B, dt)
        precision = self._dot_precision(x)
        out_dtype = state_dtype or x.dtype
        flags = {"seq": seq_idx is not None, "init": initial_states is not None, "state": dtype_name(out_dtype),
                 "state_pass": "serial"}

        def launch(config):
            return _serial_states(B, x, dt, dA_cumsum, initial_states, seq_idx, out_dtype, config=config,
                                  switches=self.switches, empty=self._empty, dot_precision=precision)

        config = self._config("chunk_state", shape, dtype_name(x.dtype), flags, dims, x.device, launch)
        return launch(config)

    def compute_out(self, C, B, x, dt, dA_cumsum, states, D, z, seq_idx):
        shape, dims = self._shape(x, B, dt)
        precision = self._dot_precision(x)
        flags = {"seq": seq_idx is not None, "z": z is not None, "D": "none" if D is None else D.dim()}

        def launch(config):
            return _compute_out(C, B, x, dt, dA_cumsum, states, D, z, seq_idx, config=config,
                                switches=self.switches, empty=self._empty, dot_precision=precision)

        config = self._config("compute_out", shape, dtype_name(x.dtype), flags, dims, x.device, launch)
        return launch(config)

    def tf32_matmuls(self, stage, device) -> bool:
        # the interpreter (CPU tensors) ignores tl.dot's input_precision: its dots are exact fp32
        return device.type == "cuda" and self.switches.cb_precision == "tf32"

    # --- the fused arrangement (switch fuse_state_out): chunk_cumsum, then stages 2 and 3 in one kernel ----------
    def fused_state_out(self, C, B, x, dt, dA_cumsum, initial_states, D, z, seq_idx, state_dtype):
        """-> (y, states, final states): impls/triton/fused.py on stage 1's outputs."""
        shape, dims = self._shape(x, B, dt)
        precision = self._dot_precision(x)
        out_dtype = state_dtype or x.dtype
        flags = {"seq": seq_idx is not None, "z": z is not None, "D": "none" if D is None else D.dim(),
                 "init": initial_states is not None, "state": dtype_name(out_dtype)}

        def launch(config):
            return _fused_state_out(C, B, x, dt, dA_cumsum, initial_states, D, z, seq_idx, out_dtype, config=config,
                                    switches=self.switches, empty=self._empty, dot_precision=precision)

        config = self._config(FUSED, shape, dtype_name(x.dtype), flags, dims, x.device, launch)
        return launch(config)

    def _forward(self, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
                 dt_softplus, dt_limit, state_dtype):
        if not self.switches.fuse_state_out:
            return Backend.ssd_forward(self, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx,
                                       cu_seqlens, dt_softplus, dt_limit, state_dtype)
        dt_out, dA_cumsum = self.chunk_cumsum(dt, A, chunk_size, dt_bias, dt_softplus, dt_limit)
        y, states, final = self.fused_state_out(C, B, x, dt_out, dA_cumsum, initial_states, D, z, seq_idx,
                                                state_dtype)
        varlen = None
        if cu_seqlens is not None:
            varlen = self.varlen_states(B, x, dt_out, dA_cumsum, states, cu_seqlens)
        return ForwardResult(y, final, varlen, dt_out, dA_cumsum, states)

    def _own_parts(self, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
                   dt_softplus, dt_limit, state_dtype):
        if not self.switches.fuse_state_out:
            return {}
        dt_out, dA_cumsum = self.chunk_cumsum(dt, A, chunk_size, dt_bias, dt_softplus, dt_limit)
        return {"fused_state_out": lambda: self.fused_state_out(C, B, x, dt_out, dA_cumsum, initial_states, D, z,
                                                                seq_idx, state_dtype)}

    def forward_for_backward(self, args, needs):
        from impls.triton.backward.run import forward_for_backward

        return forward_for_backward(self, args, needs)

    # --- what ran -----------------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out["stages"] = {stage: dict(info) for stage, info in self.last_tuning.items()}
        out.update(self._inner.describe())  # switch inner_chunk: what ran at the inner chunk
        out["tuning_mode"] = self.switches.tuning
        return out

    # --- helpers ------------------------------------------------------------------------------------------
    @staticmethod
    def _empty(shape, dtype, device) -> torch.Tensor:
        # looked up at call time, so that impls.tolerance.poisoned_allocations can NaN-fill every output
        return torch.empty(shape, dtype=dtype, device=device)

    def _dot_precision(self, x: torch.Tensor) -> str:
        # input_precision only means something for fp32 operands; fp16/bf16 dots get Triton's default
        precision = "tf32"
        if x.dtype == torch.float32 and self.switches.cb_precision == "fp32":
            precision = "ieee"
        return precision

    @staticmethod
    def _shape(x, B, dt) -> tuple[Shape, dict[str, int]]:
        batch, seqlen, nheads, headdim = x.shape
        ngroups, dstate = B.shape[2], B.shape[3]
        chunk = dt.shape[3]
        shape = Shape(batch, seqlen, nheads, headdim, ngroups, dstate, chunk)
        return shape, {"nheads": nheads, "chunk": chunk, "headdim": headdim, "dstate": dstate}

    def _config(self, stage: str, shape: Shape, dtype: str, flags: dict, dims: dict[str, int],
                device: torch.device, launch: Callable[[dict], Any]) -> dict[str, int]:
        """The launch configuration of `stage` for this call (resolved once per tuning key), and records its
        source."""
        memo = (stage, shape, dtype, tuple(flags.items()))
        key = self._keys.get(memo)
        if key is None:
            key = self._keys[memo] = tune.record_key(self.switches, shape.label(), dtype, flags, stage)
        resolved = self._resolved.get((stage, key))
        if resolved is None:
            same = tune.same_sass_key(self.switches, shape.label(), dtype, flags, stage)
            t = tune.tunable(stage, self.switches, key, dtype, dims, device, launch, same)
            resolution = tuning.resolve(t)
            # a record holds the tuned fields; the pinned switches win over it (applied by resolve), all clamped
            resolved = tune.Resolved(clamp(stage, resolution.config, dims), resolution, tuple(sorted(t.pins)))
            self._resolved[(stage, key)] = resolved
        self.last_tuning[stage] = resolved.as_dict()
        return dict(resolved.config)
