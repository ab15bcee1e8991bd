"""Switch warp_specialize: the MMA loops written `tl.range(..., warp_specialize=True)`, and what Triton 3.6 makes of
it, so that the switch either runs as asked or raises.

On sm_90, Triton 3.6's Hopper pass splits such a program into a producer warpgroup that issues the loop's
tensor-descriptor (TMA) copies and consumer warpgroups that do the math, rebalancing registers between them with
`setmaxnreg` — the arrangement tileiras gives every cuTile kernel without being asked. Compiled on the CPU
(`python -m instruments.triton.spills`, `python -m instruments.triton.expressible`, docs/triton-switches.md) it does so
only in part of the space:
- a loop with pointer loads (tma off, compute_out's cb_mode='shared') fails to compile, whatever the tiles;
- fp32 at input_precision 'ieee' compiles to a kernel that is not warp-specialised, with no error;
- at some launch configurations (num_warps 8; a 32-wide headdim tile of chunk_state with operand_swap off) the
  kernel compiles unspecialised, with no error, and at others (a 128-row compute_out tile; a 32-wide compute_out
  tile or a 128-wide dstate tile of the position loop with operand_swap on) the pass pipeline fails.
So the backend refuses the switch combinations that can never compile, before any kernel; the configurations, which
tuning resolves per shape, are checked at launch: a compiler failure is re-raised naming the switch, the stage and
the configuration, and every kernel launched with the switch must be warp-specialised (`setmaxnreg` in its PTX),
else RuntimeError instead of its result. The Triton interpreter (CPU tensors) runs the loop's math only: the switch
changes nothing there.
On a GPU the switch is refused outright (its `gpu_refused` text, raised by `impls.registry.refuse_on_gpu` before any
kernel): on one NVIDIA H200 the specialised kernels gave results over tolerance in 13 of 30 GPU test cases and ran
2-3x slower than without the switch (docs/perf-notes.md, version 15 measured). What is above stays for the
compile-only tools, which launch nothing.
"""

from __future__ import annotations

import triton

from impls.triton.target import interpreting

SWITCH = "switch warp_specialize of backend 'triton'"
_SPECIALISED: dict[str, bool] = {}  # compiled kernel hash -> warp-specialised


def refusal(switches) -> str | None:
    """Why these switches cannot run with warp_specialize (None when they can, or when it is off)."""
    if not switches.warp_specialize:
        return None
    if not switches.tma:
        return (f"{SWITCH}: Triton 3.6 warp-specialises loops whose loads are tensor-descriptor loads only (pointer "
                "loads fail to compile); set tma=True (and tma_descriptors='host' for cuTile's arrangement)")
    if switches.cb_mode == "shared":
        return (f"{SWITCH}: cb_mode='shared' reads C·Bᵀ through pointers inside compute_out's loop, which "
                "Triton 3.6 cannot warp-specialise; use cb_mode='inline'")
    if switches.fuse_state_out:
        return f"{SWITCH}: the fused kernel (fuse_state_out) is not written with it; turn one of them off"
    for name in ("occupancy", "state_occupancy"):
        if getattr(switches, name):
            return (f"{SWITCH}: the warp-specialised kernels set their own registers per warpgroup (setmaxnreg); "
                    f"{name}={getattr(switches, name)} (a maxnreg cap for num_warps warps) cannot apply; leave it "
                    "at 0")
    return None


def check_precision(switches, dot_precision: str) -> None:
    """fp32 inputs at input_precision 'ieee' (cb_precision='fp32') compile without warp specialisation: refused."""
    if switches.warp_specialize and dot_precision == "ieee":
        raise ValueError(f"{SWITCH}: fp32 inputs with cb_precision='fp32' (no tensor cores) compile to a kernel "
                         "that is not warp-specialised; use cb_precision='tf32' or turn warp_specialize off")


def launch(kernel, grid, *args, ws: bool, what: str, config: dict, **kwargs):
    """kernel[grid](*args, **kwargs); with ws, a compiler failure is re-raised naming the switch, the stage and its
    launch configuration, and the compiled kernel must be warp-specialised (RuntimeError otherwise)."""
    if not ws or interpreting():
        return kernel[grid](*args, **kwargs)
    try:
        compiled = kernel[grid](*args, **kwargs)
    except Exception as exc:
        if not _compile_failure(exc):
            raise
        raise RuntimeError(f"{SWITCH}: Triton {triton.__version__} could not compile {_where(what, config)} "
                           f"warp-specialised: {str(exc).strip().splitlines()[-1][:200]}") from exc
    if not specialised(compiled):
        raise RuntimeError(f"{SWITCH}: Triton {triton.__version__} compiled {_where(what, config)} without warp "
                           "specialisation (no setmaxnreg in its PTX); the result is not returned")
    return compiled


def _where(what: str, config: dict) -> str:
    """The stage and its launch configuration, as the errors name them (built only when one is raised)."""
    return f"{what} at {', '.join(f'{k}={v}' for k, v in sorted(config.items()))}"


def specialised(compiled) -> bool:
    """Whether a compiled kernel is warp-specialised: its PTX rebalances registers between warpgroups."""
    key = compiled.hash
    if key not in _SPECIALISED:
        _SPECIALISED[key] = "setmaxnreg" in compiled.asm["ptx"]
    return _SPECIALISED[key]


def _compile_failure(exc: Exception) -> bool:
    from triton.compiler.errors import CompilationError

    return isinstance(exc, CompilationError) or "PassManager::run failed" in str(exc)
