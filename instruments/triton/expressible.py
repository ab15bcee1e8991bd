"""What Triton 3.6 cannot express of cuTile's tricks, shown by attempting it: minimal kernels compiled for sm_90
without a GPU (`python -m instruments.triton.expressible`), each printing what the compiler said or what the PTX holds.

- `latency_hints` (cuTile: `ct.load(..., latency=N)`): `tl.load` has no such argument; the compiler rejects it.
- `occupancy` (cuTile: `ct.kernel(occupancy=N)`): Triton has no CTAs-per-SM hint. An `occupancy=` compile option
  is silently dropped (no `.minnctapersm` in the PTX); what Triton does have is `maxnreg` (PTX `.maxnreg`), a
  register cap, which the backend's `occupancy` switch uses.
- `tma` (cuTile: the compiler picks TMA for any tile load, `allow_tma=None`): a Triton pointer load of a whole
  64x64 tile stays a plain load (no `cp.async.bulk.tensor`); TMA only comes through an explicit descriptor. Made
  in the kernel (`tl.make_tensor_descriptor`), every program writes a tensormap (`tensormap.cp_fenceproxy` in the
  PTX); built on the host (`TensorDescriptor` argument, the backend's `tma_descriptors='host'`), the kernel takes it
  as a 128-byte parameter (`.param .align 64 .b8`) and writes none.
- `head_mma='batched'` (cuTile: one rank-3 MMA for several heads): Triton expresses it (a 3-D `tl.dot`), but on
  sm_90 it becomes `mma.sync` where the same 2-D dot is a warpgroup `wgmma.mma_async`, as cuTile's batched form
  became HMMA; the backend builds only the per-head form (`heads_per_tile`).

And what Triton 3.6 can express only in part: warp specialisation (cuTile's compiler gives every kernel a producer
warpgroup for the copies and math warpgroups, unasked). `tl.range(..., warp_specialize=True)` does it on sm_90 for a
loop of descriptor loads at num_warps=4 (12 warps: setmaxnreg in the PTX), silently not at num_warps=8, and not at
all for pointer loads (the pass pipeline fails). The backend's kernels do not ask for it (its switch
`warp_specialize` was retired: docs/perf-notes.md, "Retired variants").

The output is what docs/triton-switches.md quotes; tests/backends/test_triton_interp.py runs it and checks each line.
"""

from __future__ import annotations

import argparse
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


@triton.jit
def tile_copy(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    tl.store(y_ptr + offs, tl.load(x_ptr + offs))


@triton.jit
def tile_copy_descriptor_in_kernel(x_ptr, y_ptr, BLOCK: tl.constexpr):
    desc = tl.make_tensor_descriptor(x_ptr, shape=[BLOCK, BLOCK], strides=[BLOCK, 1], block_shape=[BLOCK, BLOCK])
    offs = tl.arange(0, BLOCK)[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    tl.store(y_ptr + offs, desc.load([0, 0]))


@triton.jit
def tile_copy_descriptor_argument(x_desc, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    tl.store(y_ptr + offs, x_desc.load([0, 0]))


@triton.jit
def dot_2d(a_ptr, b_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    tl.store(y_ptr + offs, tl.dot(tl.load(a_ptr + offs), tl.load(b_ptr + offs)))


@triton.jit
def dot_batched(a_ptr, b_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = (tl.arange(0, 2)[:, None, None] * BLOCK * BLOCK + tl.arange(0, BLOCK)[None, :, None] * BLOCK
            + tl.arange(0, BLOCK)[None, None, :])
    tl.store(y_ptr + offs, tl.dot(tl.load(a_ptr + offs), tl.load(b_ptr + offs)))


@triton.jit
def loop_dot_descriptors(a_desc, b_desc, y_ptr, n, BLOCK: tl.constexpr):
    acc = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
    for k in tl.range(0, n, BLOCK, warp_specialize=True):
        acc = tl.dot(a_desc.load([0, k]), b_desc.load([k, 0]), acc)
    offs = tl.arange(0, BLOCK)[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    tl.store(y_ptr + offs, acc)


@triton.jit
def loop_dot_pointers(a_ptr, b_ptr, y_ptr, n, BLOCK: tl.constexpr):
    acc = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
    offs = tl.arange(0, BLOCK)[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    for k in tl.range(0, n, BLOCK, warp_specialize=True):
        acc = tl.dot(tl.load(a_ptr + k + offs), tl.load(b_ptr + k * BLOCK + offs), acc)
    tl.store(y_ptr + offs, acc)


def _build(kernel, signature=None, block=128, **options):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = signature or {"x_ptr": "*fp32", "y_ptr": "*fp32", "BLOCK": "constexpr"}
    source = ASTSource(kernel, signature, constexprs={(list(signature).index("BLOCK"),): block})
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def _has(ptx: str, *needles: str) -> str:
    return ", ".join(f"{n} {'yes' if n in ptx else 'no'}" for n in needles)


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
    bf16 = {"x_ptr": "*bf16", "y_ptr": "*bf16", "BLOCK": "constexpr"}
    tma = ("cp.async.bulk.tensor", "tensormap.cp_fenceproxy")
    ptx = _build(tile_copy, bf16, 64).asm["ptx"]
    lines.append(f"tma by pointer load (64x64 bf16 tile): {_has(ptx, *tma)}")
    ptx = _build(tile_copy_descriptor_in_kernel, bf16, 64).asm["ptx"]
    lines.append(f"tma, descriptor made in the kernel: {_has(ptx, *tma)}")
    signature = {"x_desc": "tensordesc<bf16[64, 64]>", "y_ptr": "*bf16", "BLOCK": "constexpr"}
    ptx = _build(tile_copy_descriptor_argument, signature, 64).asm["ptx"]
    lines.append(f"tma, descriptor built on the host: {_has(ptx, *tma, '.param .align 64 .b8')}")
    dots = {"a_ptr": "*bf16", "b_ptr": "*bf16", "y_ptr": "*fp32", "BLOCK": "constexpr"}
    for name, kernel in (("2-D", dot_2d), ("batched 3-D", dot_batched)):
        ptx = _build(kernel, dots, 64).asm["ptx"]
        lines.append(f"head_mma, {name} tl.dot (bf16, 64x64 per head): {_has(ptx, 'wgmma.mma_async', 'mma.sync')}")
    descs = {"a_desc": "tensordesc<bf16[64, 64]>", "b_desc": "tensordesc<bf16[64, 64]>", "y_ptr": "*fp32",
             "n": "i32", "BLOCK": "constexpr"}
    for warps in (4, 8):
        compiled = _build(loop_dot_descriptors, descs, 64, num_warps=warps)
        found = _has(compiled.asm["ptx"], "setmaxnreg")
        warps_run = compiled.metadata.num_warps
        lines.append(f"warp_specialize, descriptor loads, num_warps={warps}: {found}, {warps_run} warps")
    pointers = {"a_ptr": "*bf16", "b_ptr": "*bf16", "y_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}
    try:
        _build(loop_dot_pointers, pointers, 64, num_warps=4)
        lines.append("warp_specialize, pointer loads: compiled (unexpected)")
    except Exception as exc:  # RuntimeError from the MLIR pass pipeline
        lines.append(f"warp_specialize, pointer loads: {type(exc).__name__}: {str(exc).strip().splitlines()[-1]}")
    return lines


def main(argv=None) -> int:
    argparse.ArgumentParser(prog="python -m instruments.triton.expressible",
                            description="Compiles minimal Triton kernels for sm_90 (no GPU needed) and prints what "
                                        "Triton 3.6 cannot express of cuTile's tricks.").parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("TRITON_INTERPRET is set: unset it to compile for a GPU", file=sys.stderr)
        return 2
    print("\n".join(attempts()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
