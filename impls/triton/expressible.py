"""What Triton 3.6 cannot express of cuTile's tricks, shown by attempting it: minimal kernels compiled for sm_90
without a GPU (`python -m impls.triton.expressible`), each printing what the compiler said or what the PTX holds.

- `latency_hints` (cuTile: `ct.load(..., latency=N)`): `tl.load` has no such argument; the compiler rejects it.
- `occupancy` (cuTile: `ct.kernel(occupancy=N)`): Triton has no CTAs-per-SM hint. An `occupancy=` compile option
  is silently dropped (no `.minnctapersm` in the PTX); what Triton does have is `maxnreg` (PTX `.maxnreg`), a
  register cap, which the backend's `occupancy` switch uses.

The output is what docs/triton-switches.md quotes; tests/test_triton_interp.py runs it and checks each line.
"""

from __future__ import annotations

import os
import sys

import triton
import triton.language as tl


@triton.jit
def load_with_latency_hint(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, latency=4))


@triton.jit
def copy(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs))


def _build(kernel, **options):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    source = ASTSource(kernel, {"x_ptr": "*fp32", "y_ptr": "*fp32", "BLOCK": "constexpr"}, constexprs={(2,): 128})
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def _directives(ptx: str) -> str:
    found = [d for d in (".maxnreg", ".minnctapersm", ".maxntid") if d in ptx]
    return ", ".join(found) or "none"


def attempts() -> list[str]:
    lines = []
    try:
        _build(load_with_latency_hint)
        lines.append("latency_hints: compiled (unexpected)")
    except Exception as exc:  # triton.compiler.errors.CompilationError
        lines.append(f"latency_hints: {type(exc).__name__}: {str(exc).strip().splitlines()[-1]}")
    ptx = _build(copy, occupancy=2).asm["ptx"]
    lines.append(f"occupancy: compile option occupancy=2 accepted; PTX directives: {_directives(ptx)}")
    ptx = _build(copy, maxnreg=168).asm["ptx"]
    lines.append(f"occupancy via maxnreg=168: PTX directives: {_directives(ptx)}")
    return lines


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("TRITON_INTERPRET is set: unset it to compile for a GPU", file=sys.stderr)
        sys.exit(2)
    print("\n".join(attempts()))
