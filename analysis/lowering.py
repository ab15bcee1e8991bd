"""How a point's kernels were lowered (registers, stack, local loads/stores, warp specialisation in the sm_90 SASS),
read from the lowering file beside a results file (`<name>.lowering.json`, written by `python -m
instruments.lowering`, which says its layout), so that a trick table can say where a switch changes the lowering.
Nothing is compiled here.
"""

from __future__ import annotations

import json

import pandas as pd

from instruments.lowering import KernelLowering, entry_key, path_for, stage_configs

NOT_INSPECTED = "lowering not inspected"
SAME = "same"  # the same registers, stack, local loads/stores and warp specialisation (the SASS may differ elsewhere)


class Lowerings:
    """The lowering entries of some files; `of(rows, stage)` finds a point's."""

    def __init__(self, entries: dict[str, tuple[KernelLowering, ...]] | None = None):
        self.entries = dict(entries or {})

    def __bool__(self) -> bool:
        return bool(self.entries)

    def of(self, rows: pd.DataFrame, stage: str) -> tuple[KernelLowering, ...] | None:
        """The kernels of `stage` at the point of `rows` (the backend, shape, dtype, arch, switches and recorded
        configs of its first row with a describe()), or None where no file holds them."""
        described = rows[rows["describe"].notna()] if "describe" in rows else rows.iloc[:0]
        if described.empty or stage == "forward":
            return None
        r = described.iloc[0]
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
    specialisation lost, 80 -> 168 registers, stack 56 -> 392 B, LDL/STL 18/13 -> 163/142"; a kernel of one point
    only: its `summary`), SAME where nothing does, NOT_INSPECTED where either point has no entry."""
    if baseline is None or point is None:
        return NOT_INSPECTED
    before = {k.kernel: k for k in baseline}
    after = {k.kernel: k for k in point}
    parts = [f"{name} (baseline only): {summary(k)}" for name, k in before.items() if name not in after]
    parts += [f"{name} (point only): {summary(k)}" for name, k in after.items() if name not in before]
    for name in (n for n in after if n in before):
        text = kernel_change(before[name], after[name])
        if text:
            parts.append(f"{name}: {text}")
    return "; ".join(parts) if parts else SAME


def summary(k: KernelLowering) -> str:
    """One kernel's lowering in a phrase ("168 registers, stack 392 B, LDL/STL 163/142")."""
    shown = f"{k.registers} registers, stack {k.stack_bytes} B, LDL/STL {k.ldl}/{k.stl}"
    return shown + (", warp-specialised" if k.warp_specialized else "")


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
