"""Hashes of the normalised sm_90 PTX of every Triton kernel, to show that a change of the Python source left the
generated code as it was.

The variants are those `python -m instruments.triton.aot` compiles (`aot.variants`): every kernel at the defaults and
all-off, and at the defaults also the tensor-descriptor builds, compute_out at dstate 128 and 256 and with two heads
per program; block sizes, num_warps and num_stages from the sm_90 fallback configurations, so a change of those
changes a hash too. The hash is the SHA-256 of `normalized(ptx)`: the PTX without its debug sections, `.loc`/`.file`
directives, comments and debug-range labels (they name source files and lines, which move when imports move).

Run `python -m instruments.triton.ptx_hashes [--dtype bf16|fp32] [--write PATH]` without TRITON_INTERPRET (CPU only;
on a busy 2-core machine bf16 takes about two minutes cold, fp32 about four, seconds from Triton's cache); with
--dtype, `--write` re-records that dtype's entries of PATH and keeps the others. tests/backends/test_triton_ptx_same.py
compares against tests/fixtures/triton_ptx_before.json and, where they differ, fails naming the command that
re-records them.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import re
import sys
from pathlib import Path

from instruments import golden

FIXTURE = golden.Fixture(Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "triton_ptx_before.json",
                         "instruments.triton.ptx_hashes", "python -m instruments.triton.aot")
DTYPES = {"bf16": "bfloat16", "fp32": "float32"}
_DEBUG_LABEL = re.compile(r"^\$L__(tmp|func_begin|func_end)\d+:$")


def normalized(ptx: str) -> str:
    """The PTX's code: up to the first `.file` directive (the debug sections follow it), without `.loc` lines,
    comments, blank lines and the labels that only delimit debug ranges."""
    out = []
    for line in ptx.split("\n.file", 1)[0].split("\t.file", 1)[0].splitlines():
        line = line.split("//", 1)[0].rstrip()
        if not line.strip() or line.lstrip().startswith(".loc") or _DEBUG_LABEL.match(line.strip()):
            continue
        out.append(line)
    return "\n".join(out) + "\n"


def variant_id(name: str, dtype: str, constexprs: dict) -> str:
    """kernel-dtype[-defaults|-all-off][-tma[-host]][-ieee][-dstate256][-hb2]; aot.variants' flags are all on or all
    off."""
    if "EXP2" in constexprs:
        parts = [name, dtype, "defaults" if constexprs["EXP2"] else "all-off"]
    else:  # cb_kernel has no switch of its own; aot.variants builds it in both passes, identically
        parts = [name, dtype]
    if constexprs.get("TMA"):
        parts.append("tma")
    if constexprs.get("HOST_DESC"):
        parts.append("host")
    if constexprs.get("DOT_PRECISION") == "ieee":
        parts.append("ieee")
    if name == "compute_out" and constexprs.get("BLOCK_DSTATE") == 256:
        parts.append("dstate256")
    if constexprs.get("HB", 1) == 2:
        parts.append("hb2")
    return "-".join(parts)


def hashes(dtypes=tuple(DTYPES), arch: int = 90) -> dict[str, str]:
    """{variant id: SHA-256 of the normalised PTX} for every variant of `aot.variants` in `dtypes` (keys of DTYPES)."""
    from instruments.triton.aot import compile_variant, variants

    out = {}
    for short in dtypes:
        dtype = DTYPES[short]
        for name, kernel, pointers, constexprs, warps, stages in variants(dtype, all_variants=False):
            ptx = compile_variant(kernel, pointers, constexprs, arch, warps, stages).asm["ptx"]
            vid = variant_id(name, short, constexprs)
            digest = hashlib.sha256(normalized(ptx).encode()).hexdigest()
            if out.get(vid, digest) != digest:
                raise RuntimeError(f"two variants named {vid!r}")
            out[vid] = digest
    return out


def variant_dtype(variant_id: str) -> str:
    """The dtype of a variant id ("compute_out-bf16-defaults" -> "bf16")."""
    return variant_id.split("-")[1]


def toolchain() -> dict[str, str]:
    """What turns the Python source into the hashed PTX: hashes compare only under the same versions."""
    return {"triton": importlib.metadata.version("triton")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, help="write the record (toolchain and hashes) to this JSON file")
    parser.add_argument("--dtype", action="append", choices=sorted(DTYPES), help="only these (default: all)")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("TRITON_INTERPRET is set: unset it to compile for a GPU", file=sys.stderr)
        return 2
    dtypes = tuple(args.dtype or DTYPES)
    record = {"toolchain": toolchain(), "hashes": hashes(dtypes)}
    text = json.dumps(record, indent=1, sort_keys=True) + "\n"
    if args.write:
        old = json.loads(args.write.read_text()) if args.dtype and args.write.exists() else None
        new = golden.merged(old, record["toolchain"], record["hashes"], keep=lambda k: variant_dtype(k) not in dtypes)
        args.write.write_text(json.dumps(new, indent=1, sort_keys=True) + "\n")
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
