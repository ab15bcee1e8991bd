"""Writes impls/cutile/switch_sass_effects.json: for every stage, dtype and code switch, whether turning the switch
away from its default alone changes the sm_90 machine code (SASS, addresses and encodings stripped) compared
with the defaults (with the switches it needs set as it needs them: `impls.cutile.tune.baseline`).

"no-op on sm_90" means the SASS is identical: such a switch must never be reported as having a measured effect
on the H200. Run: `python -m instruments.cutile.switch_effects` (CPU only, about 2-3 minutes on 2 cores);
`--switch NAME ...` recompiles only those switches' rows and keeps the others of the committed file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import torch

from impls.cutile.switches import CODE_SWITCHES
from impls.cutile.tune import SASS_EFFECTS as PATH
from impls.cutile.tune import baseline, off
from instruments.cutile.aot import STAGES, build_call, export
from instruments.sass import disassemble, facts, normalized

DTYPES = ("bfloat16", "float32")


def effect(stage: str, dtype: str, name: str, arch: str = "sm_90", cache: dict | None = None) -> dict:
    cache = {} if cache is None else cache

    def compiled(sw):
        """(cubin, SASS or None when nvdisasm cannot decode the cubin)."""
        key = (stage, dtype, arch, dataclasses.astuple(sw))
        if key not in cache:
            cubin = export(build_call(stage, getattr(torch, dtype), sw), arch)
            try:
                cache[key] = (cubin, disassemble(cubin))
            except RuntimeError:  # seen: nvdisasm 13.4 on one fp32 fwd_pass_state variant ("Opclass 'nop_'")
                cache[key] = (cubin, None)
        return cache[key]

    (base_bin, base), (off_bin, changed) = compiled(baseline(name)), compiled(off(name))
    if base is None or changed is None:  # compare the machine code itself
        same = base_bin == off_bin
        effect = "no-op on sm_90" if same else "changes sm_90 cubin (SASS not decodable by nvdisasm)"
        return {"stage": stage, "dtype": dtype, "switch": name, "arch": arch, "effect": effect,
                "default": facts(base) if base else None, "off": facts(changed) if changed else None}
    same = normalized(base) == normalized(changed)
    return {"stage": stage, "dtype": dtype, "switch": name, "arch": arch,
            "effect": "no-op on sm_90" if same else "changes sm_90 SASS",
            "default": facts(base), "off": facts(changed)}


def build(names=CODE_SWITCHES, old: list[dict] | None = None) -> list[dict]:
    """Every row, in stage x dtype x CODE_SWITCHES order: those of `names` compiled, the others taken from `old`
    (the committed rows)."""
    cache: dict = {}
    kept = {(r["stage"], r["dtype"], r["switch"]): r for r in old or ()}
    return [effect(stage, dtype, name, cache=cache) if name in names else kept[(stage, dtype, name)]
            for stage in STAGES for dtype in DTYPES for name in CODE_SWITCHES]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m instruments.cutile.switch_effects",
                                     description="Compiles every stage for sm_90 with each code switch turned away "
                                                 f"from its default and rewrites {PATH.name} (about 2-3 minutes on "
                                                 "2 cores).")
    parser.add_argument("--switch", nargs="+", default=list(CODE_SWITCHES), choices=CODE_SWITCHES,
                        help="recompile only these switches' rows (the others are kept from the committed file)")
    args = parser.parse_args(argv)
    old = json.loads(PATH.read_text())["rows"] if set(args.switch) != set(CODE_SWITCHES) else None
    rows = build(args.switch, old)
    PATH.write_text(json.dumps({"generated_by": "python -m instruments.cutile.switch_effects", "rows": rows}, indent=1))
    for r in rows:
        print(f"{r['stage']:15s} {r['dtype']:9s} {r['switch']:18s} {r['effect']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
