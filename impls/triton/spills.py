"""Registers, spills and warps of the Triton backend's kernels as a forward at a headline shape launches them,
compiled for sm_90 on a machine without a GPU.

    python -m impls.triton.spills [--shapes S1 S2 S3 S4] [--switch tma=True tma_descriptors=host ...]
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
process must not run under the interpreter (TRITON_INTERPRET unset); `compile_only` puts Triton's driver, the
kernels' caches and the backend's device answers back when it ends. docs/perf-notes.md (version 15) quotes its
tables.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import math
import os
import re
import sys

import torch

from impls.cutile.spills import count_spills, parse_assignments

HEADLINE_SHAPES = ("S1", "S2", "S3", "S4")
GPU = "NVIDIA H200"


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


class _CompileOnlyDriver:
    """What `JITFunction.run` asks of Triton's driver, answered for an sm_90 GPU that is not there."""

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", 90, 32)

    def get_active_torch_device(self):
        return torch.device("cpu")


@contextlib.contextmanager
def compile_only():
    """Within: every Triton kernel launch compiles for sm_90 and returns without running; yields the list the
    compiled kernels are appended to, (kernel name, CompiledKernel)."""
    import triton.runtime.jit as jit
    from triton.runtime import driver

    from impls.triton import target
    from impls.triton.backend import TritonBackend

    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("TRITON_INTERPRET is set: unset it to compile for a GPU")
    compiled, caches = [], {}  # caches: JITFunction -> its own binders and kernels, put back on the way out
    real_run = jit.JITFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        if self not in caches:  # binders made here hold the sm_90 target answered here: give them a cache of their own
            caches[self] = self.device_caches
            self.device_caches = collections.defaultdict(self.create_binder)
        kernel = real_run(self, *args, grid=grid, warmup=True, **kwargs)
        compiled.append((self.fn.__name__, kernel))
        return kernel

    saved = (target.arch, target.device_name, TritonBackend.__dict__["available"], TritonBackend.check_device)
    saved_driver = driver._active  # None until a launch asked for one (a CPU machine has none to create)
    driver.set_active(_CompileOnlyDriver())
    jit.JITFunction.run = run
    target.arch = lambda device: "sm90"
    target.device_name = lambda device: GPU
    TritonBackend.available = classmethod(lambda cls: (True, ""))
    TritonBackend.check_device = lambda self, device: (True, "")
    try:
        yield compiled
    finally:
        jit.JITFunction.run = real_run
        driver._active = saved_driver
        for fn, cache in caches.items():
            fn.device_caches = cache
        target.arch, target.device_name, TritonBackend.available, TritonBackend.check_device = saved


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
    from impls.cutile import aot
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
                sass = aot.sass(kernel.asm["cubin"])
                ldl, stl = count_spills(sass)
                stage = {"chunk_state_kernel": "chunk_state", "serial_state_kernel": "chunk_state",
                         "state_passing_kernel": "state_passing", "fused_kernel": FUSED}.get(name, "compute_out")
                ptx = kernel.asm["ptx"]
                rows.append(KernelFacts(shape_name, name, aot.resource_usage(kernel.asm["cubin"])["REG"], ldl, stl,
                                        kernel.metadata.num_warps, kernel.metadata.shared, "setmaxnreg" in ptx,
                                        mma_operand_hazards(sass),
                                        # cb_kernel (cb_mode='shared') has no tuned fields; with the fused kernel no
                                        # compute_out stage ran
                                        stages.get(stage, {}).get("config", {}) if name != "cb_kernel" else {}))
    return rows




_WIDTH = {".64": 2, ".WIDE": 2, ".F64": 2, ".128": 4}  # suffixes of 64- and 128-bit destinations
_WIDE_OPS = ("CS2R", "DADD", "DMUL", "DFMA", "DMNMX")  # 64-bit destinations whatever their suffix
_NO_DESTINATION = ("ST", "RED", "ATOM", "BRA", "BAR", "EXIT", "HGMMA", "WARPGROUP", "DEPBAR", "SYNCS", "UTMA",
                   "ARRIVES", "MEMBAR", "FENCE", "CCTL", "NOP", "RET", "CALL", "WARPSYNC", "LDGDEPBAR", "ISETP",
                   "FSETP", "DSETP", "HSETP2", "PLOP3", "R2UR", "USETMAXREG", "ELECT", "VOTE")


def _written(op: str, operands: str) -> set[int]:
    """The registers an instruction writes: its first register operand after any predicate destinations (SHFL's
    `PT, R5, ...`), 1, 2 or 4 wide (the destination type's suffix: .64/.WIDE/.F64 first or alone, .128; CS2R and
    the double-precision ops are 64-bit). Uniform-datapath instructions write uniform registers only."""
    base = op.split(".")[0]
    if base.startswith(_NO_DESTINATION) or op.startswith("U"):
        return set()
    first = re.match(r"(?:!?U?P(?:T|\d+)\s*,\s*)*R(\d+)\b", operands)
    if not first:
        return set()
    suffixes = op.split(".")[1:]
    width = 2 if base in _WIDE_OPS else 1
    for suffix, w in _WIDTH.items():
        if suffix == ".F64" and base == "F2F":  # F2F.<destination>.<source>: only the destination type counts
            w = w if suffixes and suffixes[0] == "F64" else 1
        elif suffix[1:] not in suffixes:
            continue
        width = max(width, w)
    return set(range(int(first.group(1)), int(first.group(1)) + width))


def mma_operand_hazards(sass_text: str) -> int:
    """How many register writes of the machine code land on the register operand (A fragment: 4 registers) of a
    warpgroup MMA (HGMMA) that may still be running. Each loop body (a backward branch's target to the branch) is
    walked twice in order, as iteration i then i + 1. HGMMAs accumulate into an open group that the one marked `gsb0`
    commits; every `WARPGROUP.DEPBAR.LE gsb0, N` retires all committed groups but the newest N. A write to the A
    registers of an HGMMA in a committed group not yet retired, or in the open group, is the sm_90 race vLLM's
    chunk-scan autotuner drops Triton configs for (NaN rows). Waits of N > 0 are not hazards by themselves: the
    non-swapped serial kernel keeps three of four k-slices in flight across its back-edge and rewrites each A block
    only after the HGMMA that read it retired."""
    from impls.cutile import aot

    code = [(ins.addr, ins.op, ins.args) for ins in aot.sass_instructions(sass_text)]
    hazards = 0
    for pc_branch, op, rest in code:
        target = re.search(r"0x([0-9a-f]+)", rest)
        if not op.startswith("BRA") or not target or int(target.group(1), 16) >= pc_branch:
            continue
        body = [(o, r) for pc, o, r in code if int(target.group(1), 16) <= pc <= pc_branch]
        committed: list[set[int]] = []
        open_group: set[int] = set()
        for o, r in body + body:
            if o.startswith("HGMMA"):
                a = re.match(r"R\d+,\s*R(\d+)", r)
                if a:
                    open_group |= set(range(int(a.group(1)), int(a.group(1)) + 4))
                if re.search(r"\bgsb0\b", r):
                    committed.append(open_group)
                    open_group = set()
                continue
            wait = re.match(r"gsb0,\s*0x([0-9a-f]+)", r) if o.startswith("WARPGROUP.DEPBAR") else None
            if wait:
                keep = int(wait.group(1), 16)
                committed = committed[max(0, len(committed) - keep):]
                continue
            written = _written(o, r)
            hazards += sum(1 for regs in (*committed, open_group) if regs & written)
    return hazards


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
