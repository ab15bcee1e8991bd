"""How a point's kernels were lowered (registers, stack, local loads/stores, warp specialisation in the sm_90 SASS),
read from the lowering file beside a results file (`<name>.lowering.json`, written by `python -m
experiments.lowering`), so that a trick table can say where a switch changes the lowering. Nothing is compiled here.

A file: {"generated_by", "points": [{"backend", "shape", "dtype", "arch", "switches", "stage", "configs",
"kernels": [{"kernel", "registers", "stack_bytes", "ldl", "stl", "warp_specialized"}]}]}: one entry per point (its
resolved switches) and stage at the configs its row's describe() recorded for the stage (`stage_configs`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

SUFFIX = ".lowering.json"
NOT_INSPECTED = "lowering not inspected"
SAME = "same lowering"
# the entries of a row's describe() that hold a stage's configs (our Triton tunes stage 2 as two kernels)
DESCRIBE_STAGES = {"fwd_pass_state": ("fwd_pass_state", "chunk_state", "state_passing")}


@dataclass(frozen=True)
class KernelLowering:
    """One kernel's lowering, read from its sm_90 cubin."""

    kernel: str
    registers: int  # per thread
    stack_bytes: int  # per thread
    ldl: int  # local-memory loads in the SASS (static count: the spill traffic with stl)
    stl: int
    warp_specialized: bool  # USETMAXREG in the SASS: warpgroups that hand registers to one another


def path_for(results_file: str | Path) -> Path:
    """The lowering file of a results file: results/<run>/<name>.parquet -> results/<run>/<name>.lowering.json."""
    path = Path(results_file)
    return path.with_name(path.name.removesuffix(".parquet") + SUFFIX)


def entry_key(backend: str, shape: str, dtype: str, arch: str, switches: dict, stage: str, configs) -> str:
    return json.dumps({"backend": backend, "shape": shape, "dtype": dtype, "arch": arch, "switches": switches,
                       "stage": stage, "configs": list(configs)}, sort_keys=True, default=str)


def stage_configs(describe, stage: str) -> tuple:
    """The configs a row's describe() (JSON) records for `stage`: one per entry of DESCRIBE_STAGES (None where
    absent); () when describe() records no stages."""
    try:
        info = json.loads(describe) if isinstance(describe, str) else {}
    except ValueError:
        return ()
    stages = (info.get("stages") or {}) if isinstance(info, dict) else {}
    if not isinstance(stages, dict):
        return ()
    entries = [stages.get(name) for name in DESCRIBE_STAGES.get(stage, (stage,))]
    return tuple(e.get("config") if isinstance(e, dict) else None for e in entries)


class Lowerings:
    """The lowering entries of some files; `of(rows, stage)` finds a point's."""

    def __init__(self, entries: dict[str, tuple[KernelLowering, ...]] | None = None):
        self.entries = dict(entries or {})

    def __bool__(self) -> bool:
        return bool(self.entries)

    def of(self, rows: pd.DataFrame, stage: str) -> tuple[KernelLowering, ...] | None:
        """The kernels of `stage` at the point of `rows` (its first row's backend, shape, dtype, arch, switches and
        recorded configs), or None where no file holds them."""
        if rows.empty or stage == "forward":
            return None
        r = rows.iloc[0]
        configs = stage_configs(r.get("describe"), stage)
        if not configs or all(c is None for c in configs):
            return None
        switches = json.loads(r["switches"]) if isinstance(r.get("switches"), str) else {}
        return self.entries.get(entry_key(r["backend"], r["shape_name"], r["dtype"], r["arch"], switches, stage,
                                          configs))


def load(files) -> Lowerings:
    """The entries of the lowering files beside `files` (results files); a results file without one adds none."""
    entries = {}
    for results_file in files:
        path = path_for(results_file)
        if not path.is_file():
            continue
        for p in json.loads(path.read_text())["points"]:
            key = entry_key(p["backend"], p["shape"], p["dtype"], p["arch"], p["switches"], p["stage"], p["configs"])
            entries[key] = tuple(KernelLowering(**k) for k in p["kernels"])
    return Lowerings(entries)


def change(baseline: tuple[KernelLowering, ...] | None, point: tuple[KernelLowering, ...] | None) -> str:
    """What the point's lowering of a stage changes against the baseline's, kernel by kernel ("compute_out: warp
    specialisation lost; 80 -> 168 registers; stack 0 -> 392 B; LDL/STL 18/13 -> 163/142"), SAME where nothing
    does, NOT_INSPECTED where either point has no entry."""
    if baseline is None or point is None:
        return NOT_INSPECTED
    before = {k.kernel: k for k in baseline}
    after = {k.kernel: k for k in point}
    parts = [f"{name}: only at the baseline" for name in before if name not in after]
    parts += [f"{name}: only at the point" for name in after if name not in before]
    for name in (n for n in after if n in before):
        text = kernel_change(before[name], after[name])
        if text:
            parts.append(f"{name}: {text}")
    return "; ".join(parts) if parts else SAME


def kernel_change(a: KernelLowering, b: KernelLowering) -> str:
    """One kernel's differences, "" when none."""
    out = []
    if a.warp_specialized != b.warp_specialized:
        out.append("warp specialisation " + ("gained" if b.warp_specialized else "lost"))
    if a.registers != b.registers:
        out.append(f"{a.registers} -> {b.registers} registers")
    if a.stack_bytes != b.stack_bytes:
        out.append(f"stack {a.stack_bytes} -> {b.stack_bytes} B")
    if (a.ldl, a.stl) != (b.ldl, b.stl):
        out.append(f"LDL/STL {a.ldl}/{a.stl} -> {b.ldl}/{b.stl}")
    return ", ".join(out)
