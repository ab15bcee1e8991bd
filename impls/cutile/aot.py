"""Ahead-of-time compilation of the cuTile stages on a machine without a GPU, and SASS facts read from the cubin.

`build_call(stage, dtype, switches, ...)` makes the same `KernelCall` the launcher makes, with `ArraySpec`
placeholders for the tensors; `export(call, arch)` turns it into a cubin with
`cuda.tile.compilation.export_kernel`; `sass(cubin)` disassembles it with the cuobjdump of the venv
(`nvidia-cuda-cuobjdump` wheel; with the `nvidia-cuda-nvdisasm` wheel beside it; triton's older bundled copy is the
last resort). `pdl_access_guards(sass_text)` follows a listing's control flow to say what each global-memory access of
a programmatic dependent launch waits on first. `python -m impls.cutile.aot STAGE [--switches JSON] [--config JSON]`
prints one variant's SASS facts.
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from impls.cutile.common import ArraySpec, KernelCall, ct_dtype

STAGES = ("chunk_cumsum", "fwd_pass_state", "compute_out")
# compute_out_cb: stage 3's C·Bᵀ kernel, launched when shared_cb; fused: stages 2 and 3 in one (fuse_state_out)
KERNELS = (*STAGES, "compute_out_cb", "fused")
# stage 2 with state_pass='chunk_parallel': the local states, then the pass across chunks (not in the SASS fixture)
STATE_PASS_KERNELS = ("fwd_pass_state_local", "fwd_pass_state_pass")
# the fused kernel with fused_program='chunk' (impls/cutile/fused_chunk.py; not in the SASS fixture)
FUSED_PROGRAM_KERNELS = ("fused_chunk",)
# A small problem with every optional piece present: the shape does not enter the code (all sizes are runtime
# values), only the tile sizes derived from it do.
AOT_DIMS = dict(batch=2, seqlen=512, nheads=8, headdim=64, ngroups=2, dstate=128, chunk=128)


def array_constraint(spec: ArraySpec):
    import cuda.tile as ct
    from cuda.tile.compilation import ArrayConstraint

    elem = torch.empty((), dtype=spec.dtype).element_size()
    per16 = max(1, 16 // elem)
    stride_div = [per16] * (spec.ndim - 1) + [1 if spec.unit_last_stride else per16]
    index = ct.int64 if spec.wide else ct.int32
    return ArrayConstraint(ct_dtype(spec.dtype), spec.ndim, index_dtype=index, stride_lower_bound_incl=0,
                           alias_groups=(), may_alias_internally=False,
                           stride_constant=[None] * (spec.ndim - 1) + [1 if spec.unit_last_stride else None],
                           stride_divisible_by=stride_div, base_addr_divisible_by=16)


def signature(call: KernelCall):
    """The KernelSignature of `call`: arrays from their specs, runtime scalars int32/fp32, constants as given."""
    import cuda.tile as ct
    from cuda.tile.compilation import CallingConvention, KernelSignature, ScalarConstraint

    pyfunc = call.kernel._annotated_function.pyfunc
    params = list(inspect.signature(pyfunc).parameters.values())
    out = []
    for param, arg in zip(params, call.args):
        constant = "Constant" in str(param.annotation)
        if isinstance(arg, ArraySpec):
            out.append(array_constraint(arg))
        elif constant:
            out.append(arg)
        elif isinstance(arg, float):
            out.append(ScalarConstraint(ct.float32))
        else:
            out.append(ScalarConstraint(ct.int32))
    return KernelSignature(out, CallingConvention.cutile_python_v1()).with_mangled_symbol(pyfunc.__name__)


def export(call: KernelCall, arch: str) -> bytes:
    from cuda.tile.compilation import export_kernel

    buf = io.BytesIO()
    export_kernel(call.kernel, [signature(call)], buf, gpu_code=arch, output_format="cubin")
    return buf.getvalue()


def build_call(stage: str, dtype: torch.dtype, switches, dims: dict | None = None, config: dict | None = None,
               optional: bool = True, wide: bool = False, d_mode: int | None = None) -> KernelCall:
    """The stage's KernelCall for `dtype` with placeholders; `optional` turns on every optional input; `wide`
    builds the int64-indexed kernel (arrays whose offsets pass 2^31); `d_mode` (compute_out, fused) overrides
    the skip term's form: 0 none, 1 D per head (a 1-d D), 2 D per channel."""
    d = dict(AOT_DIMS, **(dims or {}))
    config = dict(config or {})
    f32, i32 = torch.float32, torch.int32

    def spec(dt, ndim):  # every placeholder of this call, int32- or int64-indexed
        return ArraySpec(dt, ndim, wide=wide)

    dims6 = (d["batch"], d["seqlen"], d["nheads"], d["headdim"], d["ngroups"], d["dstate"])
    tf32 = dtype == f32 and switches.cb_precision == "tf32"
    d_mode = (2 if optional else 0) if d_mode is None else d_mode
    d_spec = spec(f32, 1 if d_mode == 1 else 2)
    if stage == "chunk_cumsum":
        from impls.cutile import chunk_cumsum as mod

        arrays = (spec(dtype, 3), spec(f32, 1), spec(f32, 1), spec(f32, 4), spec(f32, 4))
        return mod.make_call(arrays, (d["batch"], d["seqlen"], d["nheads"]), d["chunk"], optional, optional,
                             (0.0, 0.1) if optional else (0.0, float("inf")), switches, config)
    if stage == "fwd_pass_state":
        from impls.cutile import fwd_pass_state as mod

        arrays = (spec(dtype, 4), spec(dtype, 4), spec(f32, 4), spec(f32, 4), spec(f32, 4),
                  spec(i32, 2), spec(dtype, 5), spec(f32, 4))
        return mod.make_call(arrays, dims6, d["chunk"], optional, optional, tf32, switches, config)
    if stage == "fwd_pass_state_local":
        from impls.cutile import fwd_pass_state as mod

        arrays = (spec(dtype, 4), spec(dtype, 4), spec(f32, 4), spec(f32, 4), spec(i32, 2), spec(f32, 5))
        return mod.make_local_call(arrays, dims6, d["chunk"], optional, tf32, switches, config)
    if stage == "fwd_pass_state_pass":
        from impls.cutile import fwd_pass_state as mod

        arrays = (spec(f32, 5), spec(f32, 4), spec(f32, 4), spec(i32, 2), spec(dtype, 5), spec(f32, 4))
        return mod.make_pass_call(arrays, dims6, d["chunk"], optional, optional, switches)
    if stage == "compute_out":
        from impls.cutile import compute_out as mod

        arrays = (spec(dtype, 4), spec(dtype, 4), spec(dtype, 4), spec(f32, 4), spec(f32, 4),
                  spec(dtype, 5), d_spec, spec(dtype, 4), spec(i32, 2), spec(f32, 5), spec(dtype, 4))
        return mod.make_call(arrays, dims6, d["chunk"], d_mode, optional, optional, tf32, switches, config)
    if stage == "compute_out_cb":
        from impls.cutile import compute_out as mod

        return mod.make_cb_call((spec(dtype, 4), spec(dtype, 4), spec(f32, 5)), dims6, d["chunk"], tf32, switches,
                                config)
    if stage == "fused":
        from impls.cutile import fused as mod

        arrays = (spec(dtype, 4), spec(dtype, 4), spec(dtype, 4), spec(f32, 4), spec(f32, 4), spec(f32, 4),
                  d_spec, spec(dtype, 4), spec(dtype, 4), spec(f32, 4))
        return mod.make_call(arrays, dims6, d["chunk"], optional, d_mode, optional, tf32, switches, config)
    if stage == "fused_chunk":
        from impls.cutile import fused_chunk as mod

        arrays = (spec(dtype, 4), spec(dtype, 4), spec(dtype, 4), spec(f32, 4), spec(f32, 4), spec(f32, 4),
                  d_spec, spec(dtype, 4), spec(dtype, 4), spec(dtype, 5), spec(f32, 4), spec(i32, 1))
        return mod.make_call(arrays, dims6, d["chunk"], optional, d_mode, optional, tf32, switches, config)
    raise ValueError(f"stage: expected one of {KERNELS + STATE_PASS_KERNELS + FUSED_PROGRAM_KERNELS}, got {stage!r}")


# --- SASS ------------------------------------------------------------------------------------------------------
def _nvidia_bin(name: str) -> str | None:
    site = Path(torch.__file__).resolve().parent.parent
    for candidate in (site / "nvidia" / "cu13" / "bin" / name, site / "triton" / "backends" / "nvidia" / "bin" / name):
        if candidate.exists():
            return str(candidate)
    return shutil.which(name)


def cuobjdump_path() -> str | None:
    return _nvidia_bin("cuobjdump")


def sass(cubin: bytes) -> str:
    """The disassembly of a cubin (cuobjdump -sass)."""
    tool = cuobjdump_path()
    if tool is None:
        raise RuntimeError("cuobjdump not found (install the nvidia-cuda-cuobjdump wheel)")
    env = dict(os.environ)
    nvdisasm = _nvidia_bin("nvdisasm")
    if nvdisasm:
        env["PATH"] = str(Path(nvdisasm).parent) + os.pathsep + env.get("PATH", "")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(cubin)
        fh.flush()
        res = subprocess.run([tool, "-sass", fh.name], capture_output=True, text=True, env=env)
    if res.returncode != 0:
        raise RuntimeError(f"cuobjdump failed: {res.stderr.strip()}")
    return res.stdout


def resource_usage(cubin: bytes) -> dict:
    """Registers per thread, stack and local memory (bytes per thread), shared memory (bytes per CTA) of the cubin's
    kernel (cuobjdump -res-usage)."""
    tool = cuobjdump_path()
    if tool is None:
        raise RuntimeError("cuobjdump not found (install the nvidia-cuda-cuobjdump wheel)")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(cubin)
        fh.flush()
        res = subprocess.run([tool, "-res-usage", fh.name], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"cuobjdump failed: {res.stderr.strip()}")
    return {k: int(v) for k, v in re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", res.stdout)}


_OPCODE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_x]+)*)")


def opcode_sequence(sass_text: str) -> list[str]:
    """The full opcodes (with modifiers) in the listing's order."""
    return _OPCODE.findall(sass_text)


def opcodes(sass_text: str) -> collections.Counter:
    """Full opcode (with modifiers) -> count."""
    return collections.Counter(opcode_sequence(sass_text))


def facts(sass_text: str) -> dict:
    """The machine-code facts the tests check: TMA bulk copies, warpgroup / tcgen05 MMAs, instruction count."""
    ops = opcodes(sass_text)

    def count(prefix):
        return sum(n for op, n in ops.items() if op.split(".")[0] == prefix)

    return {
        "UTMALDG": count("UTMALDG"),
        "UTMASTG": count("UTMASTG"),
        "HGMMA": count("HGMMA"),
        "UTCMMA": sum(n for op, n in ops.items() if re.match(r"UTC\w*MMA", op.split(".")[0])),
        "MUFU.EX2": sum(n for op, n in ops.items() if op.startswith("MUFU.EX2")),
        "instructions": sum(ops.values()),
    }


@dataclasses.dataclass(frozen=True)
class TmaLoop:
    start: int  # address of the loop's first instruction (its back-edge's target)
    end: int  # address of the back-edge
    loads: int  # UTMALDG instructions in [start, end]


def tma_loops(sass_text: str) -> list[TmaLoop]:
    """The loops of a listing that issue TMA loads: every backward branch before the kernel's last EXIT (the
    mbarrier-retry stubs after it jump back into the code and are left out) whose range holds a UTMALDG, in address
    order. The spin loops of mbarrier waits hold no load and are not listed."""
    code = sass_instructions(sass_text)
    last_exit = max(ins.addr for ins in code if ins.base == "EXIT")
    loads = [ins.addr for ins in code if ins.base == "UTMALDG"]
    out = []
    for ins in code:
        if ins.base != "BRA" or ins.addr >= last_exit:
            continue
        target = int(ins.args.split(",")[-1].strip(), 16)
        inside = sum(1 for a in loads if target <= a <= ins.addr)
        if target < ins.addr and inside:
            out.append(TmaLoop(target, ins.addr, inside))
    return sorted(out, key=lambda loop: loop.start)


def normalized(sass_text: str) -> str:
    """SASS without addresses/encodings/symbol names, for 'identical code' comparisons."""
    lines = []
    for line in sass_text.splitlines():
        m = re.search(r"/\*[0-9a-f]{4,}\*/\s+(.*?);", line)
        if m:
            lines.append(m.group(1))
    return "\n".join(lines)


# --- which guard every global-memory access of a programmatic dependent launch passes first ------------------------
# Global-memory opcodes (TMA tensor loads/stores, bulk copies, plain, generic and atomic accesses). UTMACCTL (the
# tensor-map prefetch) is left out: it reads the kernel's descriptor, a launch parameter, not a predecessor's output.
GLOBAL_MEMORY = ("LDG", "STG", "LDGSTS", "UTMALDG", "UTMASTG", "UTMAREDG", "UBLKCP", "UBLKRED", "ATOMG", "ATOM",
                 "RED", "LD", "ST")
# the opcode token may hold a lowercase x (HGMMA.64x64x16.F32.BF16), as in _OPCODE
_SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:(@!?U?P[T0-9]+)\s+)?([A-Z][A-Z0-9_.x]*)\s*([^;]*);")
_MBARRIER = re.compile(r"\[[^\]]*?(?:\+(0x[0-9a-f]+))?\]")


@dataclasses.dataclass(frozen=True)
class SassInstruction:
    addr: int
    pred: str  # '' when unpredicated, else e.g. '@!P0'
    op: str  # with modifiers: 'SYNCS.PHASECHK.TRANS64.TRYWAIT'
    args: str

    @property
    def base(self) -> str:
        return self.op.split(".")[0]

    def mbarrier(self) -> int:
        """The shared-memory offset naming the mbarrier of a SYNCS instruction (its base register left out)."""
        m = _MBARRIER.search(self.args)
        return int(m.group(1), 16) if m and m.group(1) else 0

    def __str__(self) -> str:
        return f"/*{self.addr:04x}*/ {self.pred + ' ' if self.pred else ''}{self.op} {self.args}".rstrip()


def sass_instructions(sass_text: str) -> list[SassInstruction]:
    """The instructions of a one-kernel listing, in address order."""
    return [SassInstruction(int(a, 16), p or "", op, args.strip())
            for a, p, op, args in _SASS_LINE.findall(sass_text)]


def sass_outline(code: list[SassInstruction]) -> str:
    """The control-flow, synchronisation and global-memory lines of a listing (what a refusal shows)."""
    keep = ("BRA", "CALL", "RET", "EXIT", "BRX", "JMP", "JMX", "ACQBULK", "PREEXIT", "SYNCS", "BAR") + GLOBAL_MEMORY
    return "\n".join(str(i) for i in code if i.base in keep)


def _successors(code: list[SassInstruction]) -> list[list[int]]:
    """Indices each instruction may pass control to. A call continues after itself as well as at its target (the
    subroutine's RET has no successor); an indirect jump refuses the listing."""
    index = {ins.addr: k for k, ins in enumerate(code)}
    out = []
    for k, ins in enumerate(code):
        nxt = [k + 1] if k + 1 < len(code) else []
        if ins.base in ("BRX", "JMX", "JMP") or (ins.base == "RET" and not ins.op.startswith("RET.REL")):
            raise ValueError(f"indirect control flow at {ins}; cannot follow it:\n{sass_outline(code)}")
        if ins.base in ("BRA", "CALL"):
            target = int(ins.args.split(",")[-1].strip(), 16)
            if target not in index:
                raise ValueError(f"branch target {target:#x} of {ins} is no instruction:\n{sass_outline(code)}")
            conditional = ins.base == "CALL" or ins.pred or "," in ins.args or ins.op not in ("BRA", "BRA.U")
            out.append([index[target]] + (nxt if conditional else []))
        elif ins.base in ("EXIT", "RET"):
            out.append(nxt if ins.pred else [])
        else:
            out.append(nxt)
    return out


def _passed(code, succ, guards) -> list[bool | None]:
    """For each instruction: True when every path from the kernel's entry to it passes an unpredicated instruction
    for which guards(ins) holds, False when one does not, None when no path reaches it."""
    state: list[bool | None] = [None] * len(code)
    state[0], work = False, [0]
    while work:
        k = work.pop()
        after = state[k] or (not code[k].pred and guards(code[k]))
        for j in succ[k]:
            merged = after if state[j] is None else (state[j] and after)
            if merged != state[j]:
                state[j] = merged
                work.append(j)
    return state


def pdl_access_guards(sass_text: str) -> dict[int, str]:
    """Address -> what every path to that global-memory access passes first in a kernel launched as a programmatic
    dependent: 'griddepcontrol.wait' (ACQBULK), 'mbarrier' (a wait on an mbarrier whose every arrive is itself
    guarded: the warp-specialised kernels' producer and store warps, which skip the ACQBULK), or 'none'.

    Follows the listing's control flow (role branches, loops, calls) instead of its file order; an mbarrier is named
    by its shared-memory offset. Raises ValueError, with the listing's outline, when the flow cannot be followed or
    the listing has no global-memory access. A wait is taken as blocking: whether its phase makes it pass at once is
    not read from the code."""
    code = sass_instructions(sass_text)
    if not code:
        raise ValueError("no SASS instructions in the listing")
    succ = _successors(code)
    accesses = [k for k, ins in enumerate(code) if ins.base in GLOBAL_MEMORY]
    if not accesses:
        raise ValueError(f"no global-memory access in the listing:\n{sass_outline(code)}")
    arrives = collections.defaultdict(list)
    for k, ins in enumerate(code):
        if ins.op.startswith("SYNCS.ARRIVE"):
            arrives[ins.mbarrier()].append(k)

    def flow(safe):
        return _passed(code, succ, lambda i: i.op == "ACQBULK" or (i.op.startswith("SYNCS.PHASECHK")
                                                                  and i.mbarrier() in safe))

    acq = flow(frozenset())
    safe, state = frozenset(), acq
    while True:  # the mbarriers arrived on only after a guard, grown until nothing changes
        grown = frozenset(b for b, ks in arrives.items() if all(state[k] for k in ks))
        if grown == safe:
            break
        safe, state = grown, flow(grown)
    unreached = [code[k] for k in accesses if state[k] is None]
    if unreached:
        raise ValueError(f"global-memory accesses no path reaches: {unreached[0]}\n{sass_outline(code)}")
    return {code[k].addr: "griddepcontrol.wait" if acq[k] else "mbarrier" if state[k] else "none" for k in accesses}


def pdl_unguarded(sass_text: str) -> list[str]:
    """The global-memory accesses some path reaches before a griddepcontrol.wait or a guarded mbarrier wait."""
    code = {ins.addr: ins for ins in sass_instructions(sass_text)}
    return [str(code[a]) for a, how in pdl_access_guards(sass_text).items() if how == "none"]


def main(argv=None) -> int:  # pragma: no cover - a convenience for looking at one variant
    import argparse

    from impls.cutile.switches import CutileSwitches

    p = argparse.ArgumentParser(description="AOT-compile one cuTile stage and print its SASS facts")
    p.add_argument("stage", choices=KERNELS + STATE_PASS_KERNELS + FUSED_PROGRAM_KERNELS)
    p.add_argument("--config", default="{}", help="JSON tile config, e.g. '{\"shared_cb\": true}'")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--arch", default="sm_90")
    p.add_argument("--off", nargs="*", default=[], help="switches to turn off")
    p.add_argument("--on", nargs="*", default=[], help="bool switches to turn on")
    p.add_argument("--switches", default="{}", help="JSON switch values, e.g. '{\"head_mma\": \"per_head\"}'")
    a = p.parse_args(argv)
    import json

    from impls.cutile.switch_effects import OFF_VALUE

    sw = dataclasses.replace(CutileSwitches(), **{k: OFF_VALUE.get(k, False) for k in a.off},
                             **{k: True for k in a.on}, **json.loads(a.switches))
    cubin = export(build_call(a.stage, getattr(torch, a.dtype), sw, config=json.loads(a.config)), a.arch)
    text = sass(cubin)
    ops = opcodes(text)
    mma_sync = {name: sum(n for op, n in ops.items() if op.split(".")[0] == name) for name in ("HMMA", "LDL", "STL")}
    print({**facts(text), **mma_sync, **resource_usage(cubin)})
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
