"""Registers, spills and warps of the Triton backend's kernels as a forward at a headline shape launches them,
compiled for sm_90 on a machine without a GPU.

    python -m instruments.triton.spills [--shapes S1 S2 S3 S4] [--switch tma=True tma_descriptors=host ...]
                                  [--tuning fallback|record] [--dtype bfloat16]

The backend's own stage calls run on empty CPU tensors of the shape (the headline problem: D per head, no z, no
initial states, no sequence index) with Triton's driver replaced by one that answers "sm_90" and compiles each
kernel (`JITFunction.run` with warmup: `triton.compile` for the target, ptxas included) instead of launching it; the
launch configuration is resolved as on an NVIDIA H200 (`--tuning fallback`: the sm_90 fallback clamped to the
shape; `record`: the committed record where its stack matches this one). Launch switches pin fields as usual
(`--switch block_dstate=128 heads_per_tile=2 occupancy=3`). For each kernel launched, one row: registers per thread
and local-memory loads/stores in the SASS (cuobjdump: LDL/STL, the spill traffic), warps per program, shared memory,
whether it is warp-specialised (setmaxnreg in the PTX) and the writes onto the register
operand of a warpgroup MMA that may still be running (MMA; `mma_operand_hazards`, 0 in a correct kernel). The
process must not run under the interpreter (TRITON_INTERPRET unset); `compile_only` (instruments/intercept.py) puts
Triton's driver, the kernels' caches and the backend's device answers back when it ends. docs/perf-notes.md
(version 15) quotes its tables.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys

import torch

from instruments.assignments import parse_assignments
from instruments.intercept import GPU, compile_only
from instruments.sass import cubin_facts, mma_operand_hazards

HEADLINE_SHAPES = ("S1", "S2", "S3", "S4")


@dataclasses.dataclass(frozen=True)
class KernelFacts:
    shape: str
    kernel: str
    registers: int
    ldl: int
    stl: int
    warps: int
    shared: int  # bytes per program
    warp_specialized: bool
    mma_hazards: int  # register writes onto the operand of a warpgroup MMA that may still run (0 = none)
    config: dict


def _forward_stages(backend, shape, dtype: torch.dtype) -> None:
    """fwd_pass_state then compute_out, as the forward calls them (with fuse_state_out the fused kernel instead), on
    empty CPU tensors of `shape`."""
    b, seqlen, h, p, g, n, chunk = (shape.batch, shape.seqlen, shape.nheads, shape.headdim, shape.ngroups,
                                    shape.dstate, shape.chunk_size)
    nchunks = math.ceil(seqlen / chunk)
    x = torch.empty(b, seqlen, h, p, dtype=dtype)
    B = torch.empty(b, seqlen, g, n, dtype=dtype)
    dt = torch.empty(b, h, nchunks, chunk)
    if backend.switches.fuse_state_out:  # one kernel for both stages
        backend.fused_state_out(B, B, x, dt, dt, None, torch.empty(h), None, None, None)
        return
    states = backend.fwd_pass_state(B, x, dt, dt, None, None, None)[0]
    backend.compute_out(B, B, x, dt, dt, states, torch.empty(h), None, None)


def report(shapes=HEADLINE_SHAPES, switches: dict | None = None, tuning: str = "fallback",
           dtype: str = "bfloat16") -> list[KernelFacts]:
    """One row per kernel the two MMA stages launch at each shape with these switches."""
    from impls.cli import load_shape
    from impls.triton.backend import TritonBackend
    from impls.triton.stages import FUSED
    from impls.triton.switches import TritonSwitches

    rows = []
    with compile_only() as compiled:
        for shape_name in shapes:
            backend = TritonBackend(TritonSwitches(**{"tuning": tuning, **(switches or {})}))
            start = len(compiled)
            _forward_stages(backend, load_shape(shape_name), getattr(torch, dtype))
            stages = backend.describe()["stages"]
            for name, kernel in compiled[start:]:
                facts = cubin_facts(kernel.asm["cubin"])
                stage = {"chunk_state_kernel": "chunk_state", "serial_state_kernel": "chunk_state",
                         "state_passing_kernel": "state_passing", "fused_kernel": FUSED}.get(name, "compute_out")
                ptx = kernel.asm["ptx"]
                rows.append(KernelFacts(shape_name, name, facts.registers, facts.ldl, facts.stl,
                                        kernel.metadata.num_warps, kernel.metadata.shared, "setmaxnreg" in ptx,
                                        mma_operand_hazards(facts.sass),
                                        # cb_kernel (cb_mode='shared') has no tuned fields; with the fused kernel no
                                        # compute_out stage ran
                                        stages.get(stage, {}).get("config", {}) if name != "cb_kernel" else {}))
    return rows




def format_table(rows: list[KernelFacts]) -> str:
    head = (f"{'shape':5} {'kernel':22} {'regs':>4} {'LDL':>4} {'STL':>4} {'warps':>5} {'smem B':>7} {'WS':>3} "
            f"{'MMA':>3}  config")
    lines = [head, "-" * 110]
    for r in rows:
        config = ", ".join(f"{k}={v}" for k, v in sorted(r.config.items()))
        lines.append(f"{r.shape:5} {r.kernel:22} {r.registers:4d} {r.ldl:4d} {r.stl:4d} {r.warps:5d} {r.shared:7d} "
                     f"{'yes' if r.warp_specialized else 'no':>3} {r.mma_hazards:3d}  {config}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(HEADLINE_SHAPES))
    parser.add_argument("--switch", nargs="+", default=[], metavar="NAME=VALUE",
                        help="Triton switches away from their defaults (launch fields pin the config)")
    parser.add_argument("--tuning", default="fallback", choices=("fallback", "record"))
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    args = parser.parse_args(argv)
    switches = parse_assignments(args.switch, "--switch")
    rows = report(args.shapes, switches, args.tuning, args.dtype)
    changed = ", ".join(args.switch)
    print(f"Triton kernels of fwd_pass_state and compute_out as launched on an {GPU} (sm_90, {args.dtype}, "
          f"tuning {args.tuning}{'; ' + changed if changed else ''}), compiled without a GPU")
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
