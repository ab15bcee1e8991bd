"""One reader of NVIDIA machine code for both languages: a cubin disassembled (cuobjdump, from the venv's NVIDIA
wheels), its resource usage, opcode counts and the facts the tests and instruments check (spills, TMA, MMAs),
normalised listings for "same code" comparisons, and the control-flow analyses over a listing: which guard every
global-memory access of a programmatic dependent launch passes first, and register writes onto a running warpgroup
MMA's operand. cuTile's cubins come from instruments/cutile/aot.py, Triton's from its compiler (instruments/triton/).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch


def _nvidia_bin(name: str) -> str | None:
    site = Path(torch.__file__).resolve().parent.parent
    for candidate in (site / "nvidia" / "cu13" / "bin" / name, site / "triton" / "backends" / "nvidia" / "bin" / name):
        if candidate.exists():
            return str(candidate)
    return shutil.which(name)


def cuobjdump_path() -> str | None:
    return _nvidia_bin("cuobjdump")


def disassemble(cubin: bytes) -> str:
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


_BASE_OPCODE = re.compile(r"^\s*(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def base_opcode(instruction: str) -> str:
    """The opcode without modifiers of one instruction's text as a profiler shows it (no address: `@P0 LDG.E R2,
    ...` -> "LDG"); "" when the text holds none."""
    found = _BASE_OPCODE.match(instruction or "")
    return found.group(1) if found else ""


def count_spills(sass_text: str) -> tuple[int, int]:
    """(LDL, STL) instructions in a disassembly, modifiers included (LDL.64, STL.128, ...)."""
    ops = opcodes(sass_text)
    return tuple(sum(n for op, n in ops.items() if op.split(".")[0] == name) for name in ("LDL", "STL"))


@dataclasses.dataclass(frozen=True)
class CubinFacts:
    """What a kernel's cubin says of its registers and local memory, whatever language compiled it."""

    sass: str  # the disassembly
    registers: int  # per thread
    stack_bytes: int  # per thread
    ldl: int  # local-memory loads in the SASS (static count: the spill traffic)
    stl: int  # local-memory stores

    @property
    def warp_specialized(self) -> bool:
        """Whether the kernel sets its warpgroups' register counts apart (USETMAXREG: producer and math roles)."""
        return "USETMAXREG" in self.sass


def cubin_facts(cubin: bytes) -> CubinFacts:
    """The disassembly, registers, stack and spills of a one-kernel cubin."""
    text = disassemble(cubin)
    usage = resource_usage(cubin)
    ldl, stl = count_spills(text)
    return CubinFacts(text, usage["REG"], usage.get("STACK", 0), ldl, stl)


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


@dataclasses.dataclass(frozen=True)
class MmaLoop:
    start: int  # address of the loop's first instruction (its back-edge's target)
    end: int  # address of the back-edge
    instructions: int  # in [start, end]: one iteration's static count
    mmas: int  # HGMMA and HMMA instructions in [start, end]
    ex2: int  # MUFU.EX2 instructions in [start, end]


def mma_loops(sass_text: str) -> list[MmaLoop]:
    """The loops of a listing that issue MMAs (HGMMA, HMMA): every backward branch before the kernel's last EXIT
    whose range holds one, in address order, with its static instruction count (the math warps' source-block loop
    of stage 3, whose length per iteration docs/perf-notes.md compares between switches)."""
    code = sass_instructions(sass_text)
    last_exit = max(ins.addr for ins in code if ins.base == "EXIT")
    out = []
    for ins in code:
        if ins.base != "BRA" or ins.addr >= last_exit:
            continue
        target = int(ins.args.split(",")[-1].strip(), 16)
        body = [i for i in code if target <= i.addr <= ins.addr]
        mmas = sum(1 for i in body if i.base in ("HGMMA", "HMMA"))
        if target < ins.addr and mmas:
            out.append(MmaLoop(target, ins.addr, len(body), mmas, sum(1 for i in body if i.op.startswith("MUFU.EX2"))))
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


# --- register writes onto the operand of a running warpgroup MMA ---------------------------------------------------
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
    code = [(ins.addr, ins.op, ins.args) for ins in sass_instructions(sass_text)]
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
