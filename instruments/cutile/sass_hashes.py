"""Hashes of the normalised sm_90 SASS of every cuTile kernel, to show that a change of the Python source left the
machine code as it was.

A variant is (kernel, dtype, switches, tile config): every kernel of `aot.KERNELS` at the declared values
(`CutileSwitches()`, named "defaults": a fixed set, so that a target's defaults can be re-decided without moving
the fixture) and with every code switch off (`impls.cutile.tune.OFF_VALUE`), in bf16 and fp32; the kernels the sm_90
defaults change (impls/cutile/defaults.py, `best_sm90`) with those switches (tests/backends/test_cutile_sass_same.py
fails when sm_90's set moves away from SM90_DEFAULTS); and compute_out also with two heads per tile
(head_mma per_head and batched), with C·Bᵀ shared (`shared_cb`), and compute_out's head loop (`head_loop` 4, one
and two heads per step). The hash is the SHA-256 of `normalized(disassemble(cubin))` of instruments/sass.py
(addresses, encodings and symbol names stripped); where nvdisasm cannot decode a cubin, of the cubin itself, marked
`cubin:`.

Run `python -m instruments.cutile.sass_hashes [--write PATH] [ID ...]` (CPU only, a few seconds per compile); with IDs,
`--write` re-records those entries of PATH and keeps the others. tests/backends/test_cutile_sass_same.py compares
against tests/fixtures/cutile_sass_before.json and, where they differ, fails naming the command that re-records them.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.metadata
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from impls.cutile.switches import CODE_SWITCHES, CutileSwitches
from impls.cutile.tune import OFF_VALUE
from instruments import golden
from instruments.cutile.aot import KERNELS, build_call, export
from instruments.sass import disassemble, normalized

FIXTURE = golden.Fixture(Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "cutile_sass_before.json",
                         "instruments.cutile.sass_hashes", "python -m instruments.cutile.aot")
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
ALL_OFF = {k: OFF_VALUE.get(k, False) for k in CODE_SWITCHES}
# what turns the Python source into the hashed text: the front end, the compiler, the disassembler
TOOLCHAIN = ("cuda-tile", "nvidia-cuda-tileiras", "nvidia-cuda-cuobjdump", "nvidia-cuda-nvdisasm")
# the switches the sm_90 defaults set over the declared values (impls/cutile/defaults.py, preset best_sm90), and
# the kernels they change (heads_first, skip_first, exp_fold: compute_out; pdl: chunk_cumsum, fwd_pass_state,
# compute_out; exp2_ftz: fwd_pass_state, compute_out; cb_occupancy, cb_lower_triangle: compute_out_cb)
SM90_DEFAULTS = {"heads_first": True, "skip_first": True, "pdl": True, "exp2_ftz": True, "exp_fold": True,
                 "cb_occupancy": 4, "cb_lower_triangle": True,
                 # the backward's own (its kernels are not among the hashed ones)
                 "bwd_dcb_sources": "chunk", "bwd_exp2_ftz": True, "bwd_decay_factor": True}
SM90_KERNELS = ("chunk_cumsum", "fwd_pass_state", "compute_out", "compute_out_cb")


@dataclass(frozen=True)
class Variant:
    kernel: str
    dtype: str  # a key of DTYPES
    name: str  # what the switches/config are: defaults, all-off, hb2-per_head, ...
    switches: dict = field(default_factory=dict)  # changes from CutileSwitches()
    config: dict = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.kernel}-{self.dtype}-{self.name}"


def variants() -> list[Variant]:
    out = []
    for kernel in KERNELS:
        for dtype in DTYPES:
            out.append(Variant(kernel, dtype, "defaults"))
            out.append(Variant(kernel, dtype, "all-off", ALL_OFF))
    for kernel in SM90_KERNELS:
        for dtype in DTYPES:
            out.append(Variant(kernel, dtype, "best_sm90", SM90_DEFAULTS))
    for dtype in DTYPES:
        out.append(Variant("compute_out", dtype, "hb2-per_head", {"head_mma": "per_head"}, {"heads_per_tile": 2}))
        out.append(Variant("compute_out", dtype, "hb2-batched", {"head_mma": "batched"}, {"heads_per_tile": 2}))
        out.append(Variant("compute_out", dtype, "shared_cb", {}, {"shared_cb": True}))
        out.append(Variant("compute_out", dtype, "head_loop4", {"head_loop": 4}))
        out.append(Variant("compute_out", dtype, "hb2-per_head-head_loop4", {"head_loop": 4, "head_mma": "per_head"},
                           {"heads_per_tile": 2}))
    return out


def digest(v: Variant, arch: str = "sm_90") -> str:
    sw = dataclasses.replace(CutileSwitches(), **v.switches)
    cubin = export(build_call(v.kernel, DTYPES[v.dtype], sw, config=v.config), arch)
    try:
        text = normalized(disassemble(cubin))
    except RuntimeError:  # nvdisasm could not decode it: the machine code itself
        return "cubin:" + hashlib.sha256(cubin).hexdigest()
    return hashlib.sha256(text.encode()).hexdigest()


def toolchain() -> dict[str, str | None]:
    """The installed versions of TOOLCHAIN (None where absent): hashes compare only under the same ones."""
    out = {}
    for dist in TOOLCHAIN:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def hashes(ids: list[str] | None = None) -> dict[str, str]:
    chosen = [v for v in variants() if ids is None or v.id in ids]
    if ids is not None and len(chosen) != len(set(ids)):
        unknown = sorted(set(ids) - {v.id for v in chosen})
        raise ValueError(f"ids: unknown variants {unknown}; known: {[v.id for v in variants()]}")
    return {v.id: digest(v) for v in chosen}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("ids", nargs="*", help="variant ids (default: all)")
    p.add_argument("--write", type=Path, help="write the hashes to this JSON file")
    a = p.parse_args(argv)
    out = hashes(a.ids or None)
    for k, h in out.items():
        print(f"{k:32s} {h}")
    if a.write:
        old = json.loads(a.write.read_text()) if a.ids and a.write.exists() else None
        known = {v.id for v in variants()}
        new = golden.merged(old, toolchain(), out, keep=lambda k: k in known)
        record = {"generated_by": "python -m instruments.cutile.sass_hashes --write", "arch": "sm_90", **new}
        record.pop("sources", None)  # files' digests, no longer read: the hashes alone are compared
        a.write.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
