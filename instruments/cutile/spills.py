"""Register spills of the tuned cuTile kernels, read from sm_90 machine code compiled on the CPU.

    python -m instruments.cutile.spills [--shapes S1 S2 S3 S4] [--stages compute_out fwd_pass_state fused]
                                        [--arch sm_90] [--set heads_per_tile=2 block_headdim=32 ...]
                                        [--switch skip_first=True ...]

For each headline shape (conf/shape/) and stage, the committed tuning record of one NVIDIA H200
(tuning/NVIDIA_H200/cutile_<stage>.json, bf16; the record the switches key, else the one they borrow, else the
default switches': `tuned_config`) is compiled ahead of time
(instruments/cutile/aot.py) at the shape's sizes, as the headline problem calls it (D per head, no z, no initial states,
no sequence index), and its SASS is read: local loads and stores (LDL/STL: the spill traffic), registers per thread
and stack bytes per thread (cuobjdump -res-usage). Printed as a table, one row per kernel. `--set` changes entries
of the record's config and `--switch` the switches (default CutileSwitches()), to read a candidate arrangement's
spills before it is measured (docs/perf-notes.md, version 8). What the switches pin on top of the record (`tune.pins`:
size switches) is applied as the launcher applies it.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import torch

from instruments.assignments import parse_assignments
from instruments.cutile import aot
from instruments.sass import cubin_facts

HEADLINE_SHAPES = ("S1", "S2", "S3", "S4")
STAGES = ("compute_out", "fwd_pass_state", "fused")
GPU = "NVIDIA H200"  # the card whose records are committed (tuning/NVIDIA_H200/)
HEADLINE_D_MODE = 1  # the headline problem's D: one per head (conf/problem/headline.yaml)


@dataclasses.dataclass(frozen=True)
class KernelSpills:
    shape: str
    stage: str
    kernel: str  # the stage's kernel compiled (compute_out_cb beside compute_out when the record shares C·Bᵀ)
    config: dict
    ldl: int  # local-memory loads in the SASS (static count)
    stl: int  # local-memory stores
    registers: int  # per thread
    stack_bytes: int  # per thread

    @property
    def spills(self) -> bool:
        return self.ldl + self.stl > 0


def tuned_config(stage: str, shape_name: str, dtype: str = "bfloat16", switches=None) -> dict:
    """The committed record's config for `stage` at a conf/shape/ preset: the key the switches give (default:
    CutileSwitches()), else the record that key borrows (the key without the code tricks and launch options) — the
    launcher's first two steps (impls/tuning.py, modes auto and record) — else the default
    switches' record, where the launcher would run its fallback tiles (an arrangement with no record of its own,
    state_pass or fused_program, compiles at the default arrangement's tiles: `report`). Unlike the launcher it
    ignores the tuning mode and the stack a record was searched on (a compile-only reading of the committed tiles).
    Raises LookupError naming the file and keys when there is none."""
    from impls import tuning
    from impls.cli import load_shape
    from impls.cutile import tune
    from impls.cutile.switches import CutileSwitches

    sw = CutileSwitches() if switches is None else switches
    label = load_shape(shape_name).label()
    keys = dict.fromkeys((tune.record_key(stage, sw, label, dtype),
                          tune.record_key(stage, sw, label, dtype, code_tricks=False),
                          tune.record_key(stage, CutileSwitches(), label, dtype)))
    for key in keys:
        record = tuning.lookup("cutile", stage, GPU, key)
        if record is not None:
            return dict(record["config"])
    raise LookupError(f"no record for {shape_name} ({' or '.join(keys)}) in {tuning.record_path('cutile', stage, GPU)}")


def resolved_config(stage: str, shape_name: str, dtype: str = "bfloat16", switches=None) -> dict:
    """`tuned_config` with what the switches pin on top of any record (`tune.pins`: size switches, compute_out's
    cb_mode), as the launcher resolves it."""
    from impls.cutile import tune
    from impls.cutile.switches import CutileSwitches

    sw = CutileSwitches() if switches is None else switches
    return dict(tuned_config(stage, shape_name, dtype, sw), **tune.pins(stage, sw))


def kernels_of(stage: str, config: dict, state_pass: str = "serial", fused_program: str = "serial") -> tuple[str, ...]:
    """The kernels one stage launches under `config`, stage 2's arrangement `state_pass` and the fused kernel's
    `fused_program` (aot.KERNELS, aot.STATE_PASS_KERNELS and aot.FUSED_PROGRAM_KERNELS names)."""
    if stage == "compute_out" and config.get("shared_cb"):
        return ("compute_out", "compute_out_cb")
    if stage == "fwd_pass_state" and state_pass == "chunk_parallel":
        return aot.STATE_PASS_KERNELS
    if stage == "fused" and fused_program == "chunk":
        return aot.FUSED_PROGRAM_KERNELS
    return (stage,)


def shape_dims(shape_name: str) -> dict:
    """A conf/shape/ preset's sizes as instruments.cutile.aot.build_call takes them (`dims`)."""
    from impls.cli import load_shape

    s = load_shape(shape_name)
    return dict(batch=s.batch, seqlen=s.seqlen, nheads=s.nheads, headdim=s.headdim, ngroups=s.ngroups,
                dstate=s.dstate, chunk=s.chunk_size)


def kernel_spills(stage: str, shape_name: str, config: dict | None = None, kernel: str | None = None,
                  dtype: str = "bfloat16", arch: str = "sm_90", switches=None) -> KernelSpills:
    """Compiles one kernel of `stage` at the shape's sizes with `config` (default: the committed record) and
    `switches` (default: CutileSwitches()) and reads its spills, registers and stack from the cubin; the default
    config is the record with the switches' pins (`resolved_config`)."""
    from impls.cutile.switches import CutileSwitches

    sw = CutileSwitches() if switches is None else switches
    config = resolved_config(stage, shape_name, dtype, sw) if config is None else config
    kernel = kernel or stage
    call = aot.build_call(kernel, getattr(torch, dtype), sw, dims=shape_dims(shape_name), config=config,
                          optional=False, d_mode=HEADLINE_D_MODE)
    facts = cubin_facts(aot.export(call, arch))
    return KernelSpills(shape_name, stage, kernel, config, facts.ldl, facts.stl, facts.registers, facts.stack_bytes)


def report(shapes=HEADLINE_SHAPES, stages=STAGES, dtype: str = "bfloat16", arch: str = "sm_90",
           overrides: dict | None = None, switches=None):
    """Every kernel of `stages` at `shapes` with its committed record (its config updated by `overrides`) and
    `switches`: KernelSpills, or the reason there is none. With state_pass='chunk_parallel' stage 2's two kernels
    are compiled at the tiles of the default arrangement's record, and with fused_program='chunk' the fused kernel
    at those of the serial one's."""
    state_pass = getattr(switches, "state_pass", "serial")
    fused_program = getattr(switches, "fused_program", "serial")
    rows = []
    for shape_name in shapes:
        for stage in stages:
            try:
                config = dict(resolved_config(stage, shape_name, dtype, switches), **(overrides or {}))
            except LookupError as exc:
                rows.append((shape_name, stage, str(exc)))
                continue
            rows += [kernel_spills(stage, shape_name, config, kernel, dtype, arch, switches)
                     for kernel in kernels_of(stage, config, state_pass, fused_program)]
    return rows


def format_table(rows) -> str:
    lines = [f"{'shape':5} {'kernel':20} {'LDL':>4} {'STL':>4} {'regs':>4} {'stack B':>7}  config",
             "-" * 100]
    for row in rows:
        if isinstance(row, KernelSpills):
            config = ", ".join(f"{k}={v}" for k, v in sorted(row.config.items()))
            lines.append(f"{row.shape:5} {row.kernel:20} {row.ldl:4d} {row.stl:4d} {row.registers:4d} "
                         f"{row.stack_bytes:7d}  {config}")
        else:
            shape_name, stage, reason = row
            lines.append(f"{shape_name:5} {stage:20} {reason}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(HEADLINE_SHAPES))
    parser.add_argument("--stages", nargs="+", default=list(STAGES), choices=STAGES)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                        help="change these entries of each record's config")
    parser.add_argument("--switch", nargs="+", default=[], metavar="NAME=VALUE",
                        help="cuTile switches away from their defaults")
    args = parser.parse_args(argv)
    from impls.cutile.switches import CutileSwitches

    switches = CutileSwitches(**parse_assignments(args.switch, "--switch"))
    overrides = parse_assignments(args.set, "--set")
    rows = report(args.shapes, args.stages, args.dtype, args.arch, overrides, switches)
    changed = ", ".join(args.set + args.switch)
    print(f"cuTile kernels at the committed {GPU} records ({args.dtype}, {args.arch}"
          f"{'; ' + changed if changed else ''}): spills in the SASS")
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
