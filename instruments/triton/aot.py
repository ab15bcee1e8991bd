"""Ahead-of-time compilation of the Triton backend's kernels for a GPU architecture, on a machine without a GPU.

`triton.compile` runs the whole pipeline (Triton IR -> TTGIR -> LLVM IR -> PTX -> cubin via the bundled ptxas)
for a `GPUTarget`, so compile errors and the shared memory a configuration needs show up without a device. The
process must not run under the interpreter (TRITON_INTERPRET unset when impls.triton is imported); the CPU tests
call this module in a subprocess:

    python -m instruments.triton.aot --arch 90 --dtype bfloat16 [--all-variants]

It prints one line per kernel variant: name, switches, shared-memory bytes, whether the PTX has bulk tensor copies
(cp.async.bulk.tensor: TMA; a variant built with TMA must have them, one without must not), whether it builds
descriptors in the kernel (tensormap.cp_fenceproxy: with TMA, the in-kernel descriptors must, the host-built ones
of tma_descriptors='host' must not), whether it is warp-specialised (setmaxnreg: none of the backend's kernels
asks for it, so none may be) and, for the fused kernel, whether its PTX hands the state on as
impls/triton/fused.py says (`handoff`: one thread's ticket, acquire spin and release after a CTA barrier, the
published data read after the acquire); exit status 1 if any failed.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import sys

import triton

SHARED_MEMORY_LIMIT = {90: 232448, 100: 232448}  # bytes of dynamic shared memory per block (sm_90, sm_100)
POINTER = {"bfloat16": "*bf16", "float16": "*fp16", "float32": "*fp32"}


def _compile(kernel, pointers: dict[str, str], constexprs: dict, arch: int, num_warps: int,
             num_stages: int) -> tuple[int, bool, bool, bool, str | None]:
    """The variant's shared-memory bytes, whether its PTX has bulk tensor copies, whether it makes a tensor
    descriptor in the kernel (tensormap.cp_fenceproxy), whether it is warp-specialised (setmaxnreg) and, for the
    fused kernel (a sync array), `handoff`'s verdict on its PTX (None for the others)."""
    compiled = compile_variant(kernel, pointers, constexprs, arch, num_warps, num_stages)
    ptx = compiled.asm["ptx"]
    return (compiled.metadata.shared, "cp.async.bulk.tensor" in ptx, "tensormap.cp_fenceproxy" in ptx,
            "setmaxnreg" in ptx, handoff(ptx) if "sync_ptr" in pointers else None)


_PRED = re.compile(r"^@(%p\d+)\s")
_LABEL = re.compile(r"^(\$L__BB\w+):")
_BRANCH = re.compile(r"\bbra(?:\.uni)?\s+(\$L__BB\w+);")
_FILLER = ("//", ".loc", "mov.", "$L__tmp", "{", "}")  # what may sit between a barrier and the release


def handoff(ptx: str) -> str:
    """'ok' when the fused kernel's PTX has the hand-off impls/triton/fused.py describes, else the first thing that is
    not: the ticket is the kernel's first atomic (an add); every atomic and every acquire load is issued under one
    predicate (Triton's scalar atomics: one thread, the value broadcast through shared memory); each acquire load
    of a flag sits inside a loop (the spin); each release exchange comes right after a CTA barrier (every
    thread's stores issued); every load of published data (`.cg`: the hand-off slot and the states) comes after
    the first acquire; no non-coherent (`.nc`) load, whose cache would not see another program's stores."""
    lines = [line.strip() for line in ptx.splitlines()]
    atomics = [k for k, line in enumerate(lines) if " atom." in f" {line}"]
    acquires = [k for k, line in enumerate(lines) if "ld.global.gpu.acquire" in line]
    releases = [k for k, line in enumerate(lines) if "atom.global.gpu.release" in line]
    if not atomics or not acquires or not releases:
        return f"missing: {len(atomics)} atomics, {len(acquires)} acquire loads, {len(releases)} releases"
    if "atom.global.gpu.acq_rel.add" not in lines[atomics[0]]:
        return f"first atomic is not the ticket's add: {lines[atomics[0]]}"
    preds = {m.group(1) if (m := _PRED.match(lines[k])) else None for k in atomics + acquires}
    if len(preds) != 1 or None in preds:
        return f"atomics not under one predicate: {sorted(map(str, preds))}"
    labels = {m.group(1): k for k, line in enumerate(lines) if (m := _LABEL.match(line))}
    loops = [(labels[m.group(1)], k) for k, line in enumerate(lines)
             if (m := _BRANCH.search(line)) and labels.get(m.group(1), k) < k]
    if not all(any(lo < a < hi for lo, hi in loops) for a in acquires):
        return "an acquire load outside a loop"
    for r in releases:
        before = next(line for line in reversed(lines[:r]) if line and not line.startswith(_FILLER))
        if not before.startswith("bar.sync"):
            return f"release not after a CTA barrier: {before}"
    if any("ld.global.cg" in line for line in lines[:acquires[0]]):
        return "a .cg load before the first acquire"
    if any("ld.global.nc" in line for line in lines):
        return "a non-coherent load"
    return "ok"


def compile_variant(kernel, pointers: dict[str, str | tuple[str, ...]], constexprs: dict, arch: int, num_warps: int,
                    num_stages: int):
    """`triton.compile` of one variant for sm_<arch> (the compiled kernel: .asm["ptx"], .metadata, ...). `pointers`:
    the types of the parameters that are not 32-bit integers (pointers, descriptors, and a tuple of types for a
    stride tuple: `stride_types`)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = kernel.arg_names
    # constexpr parameters left out take their defaults, as a launch does
    constexprs = {**{p.name: p.default for p in kernel.params if p.is_constexpr and p.has_default}, **constexprs}
    signature = {}
    for name in names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in pointers:
            signature[name] = pointers[name]
        elif name in ("dt_min", "dt_max"):
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
    source = ASTSource(kernel, signature, constexprs={(names.index(k),): v for k, v in constexprs.items()})
    return triton.compile(source, target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages})


def stride_types(ranks: dict[str, int]) -> dict[str, tuple[str, ...]]:
    """The signature types of a kernel's stride tuples (`STRIDE_RANKS`: name -> strides in it), 32-bit integers each
    as the other integer parameters, so that the PTX is the one of the same strides passed one by one."""
    return {name: ("i32",) * rank for name, rank in ranks.items()}


def _desc(dtype: str, box: tuple[int, ...]) -> str:
    """The signature type of a host-built TensorDescriptor argument (Triton's mangling of one)."""
    return f"tensordesc<{dtype}[{', '.join(map(str, box))}]>"


def host_descriptors(names: tuple[str, ...], boxes: tuple[tuple[int, ...], ...], dtypes: tuple[str, ...],
                     host: bool) -> tuple[dict[str, str], dict]:
    """(signature types, constexprs) of a kernel's host-descriptor arguments: descriptor types when `host`, else
    None (what the backend passes without tma_descriptors='host'), and HOST_DESC."""
    if not host:
        return {}, {**{n: None for n in names}, "HOST_DESC": False}
    return {n: _desc(d.lstrip("*"), b) for n, b, d in zip(names, boxes, dtypes)}, {"HOST_DESC": True}


def variants(dtype: str, all_variants: bool):
    """(kernel name, kernel, pointer types, constexprs, num_warps, num_stages) for the defaults and all-off (and,
    at the defaults, the tensor-descriptor builds and the fused kernel), or for every combination of the code
    switches and features when `all_variants`."""
    from impls.triton.chunk_cumsum import chunk_cumsum_kernel
    from impls.triton.compute_out import CB_BLOCK, STRIDE_RANKS, cb_kernel, compute_out_kernel
    from impls.triton.fallbacks import fallback
    from impls.triton.fused import STRIDE_RANKS as FUSED_STRIDE_RANKS
    from impls.triton.fused import fused_kernel
    from impls.triton.fwd_pass_state import chunk_state_kernel, serial_state_kernel, state_passing_kernel
    from impls.triton.smem import DTYPE_BYTES
    from impls.triton.stages import FUSED

    p = POINTER[dtype]
    dims = {"nheads": 80, "chunk": 256, "headdim": 64, "dstate": 128}
    itemsize = DTYPE_BYTES[dtype]
    flags = list(itertools.product((True, False), repeat=3)) if all_variants else [(True,) * 3, (False,) * 3]
    precisions = ("tf32", "ieee") if dtype == "float32" else ("tf32",)
    for swap, exp2, feature in flags:
        tmas = (False, True) if all_variants or (swap, exp2, feature) == flags[0] else (False,)
        base = fallback("sm90", "chunk_cumsum", dims, itemsize, {})
        yield ("chunk_cumsum", chunk_cumsum_kernel,
               {"dt_ptr": p, "A_ptr": "*fp32", "bias_ptr": "*fp32", "dt_out_ptr": "*fp32", "dA_ptr": "*fp32"},
               dict(CHUNK=256, BLOCK_H=base["block_heads"], HAS_BIAS=feature, SOFTPLUS=feature, HAS_LIMIT=feature,
                    EXP2=exp2), base["num_warps"], 1)
        # TMA: off, in-kernel descriptors, host-built descriptors (tma_descriptors='host')
        tma_modes = [(False, False)] + ([(True, False), (True, True)] if True in tmas else [])
        for precision, (tma, host) in itertools.product(precisions, tma_modes):
            c = fallback("sm90", "chunk_state", dims, itemsize, {})
            out_box = (1, 1, 1) + ((c["block_headdim"], c["block_dstate"]) if not swap else
                                   (c["block_dstate"], c["block_headdim"]))
            types, hd = host_descriptors(
                ("x_hd", "B_hd", "out_hd"), ((1, c["block_positions"], 1, c["block_headdim"]),
                                             (1, c["block_positions"], 1, c["block_dstate"]), out_box),
                (p, p, "*fp32"), host)
            yield ("chunk_state", chunk_state_kernel,
                   {"x_ptr": p, "B_ptr": p, "dt_ptr": "*fp32", "dA_ptr": "*fp32", "seq_ptr": "*i32",
                    "out_ptr": "*fp32", **types},
                   dict(CHUNK=256, BLOCK_P=c["block_headdim"], BLOCK_N=c["block_dstate"],
                        BLOCK_K=c["block_positions"], HAS_SEQ=feature, SWAP=swap, EXP2=exp2,
                        DOT_PRECISION=precision, TMA=tma, OUT_N_CONTIG=not swap, **hd), c["num_warps"],
                   c["num_stages"])
            for dstate, hb in itertools.product((128, 256), (1, 2) if not tma else (1,)):
                if hb == 2 and not (all_variants or (swap, exp2, feature) == flags[0]):
                    continue
                d = dict(dims, dstate=dstate)
                c = fallback("sm90", "compute_out", d, itemsize, {})
                m, k, hp = c["block_rows"], c["block_positions"], c["block_headdim"]
                types, hd = host_descriptors(
                    ("C_hd", "B_hd", "x_hd", "y_hd", "st_hd"),
                    ((1, m, 1, dstate), (1, k, 1, dstate), (1, k, 1, hp), (1, m, 1, hp),
                     (1, 1, 1) + ((hp, dstate) if not swap else (dstate, hp))), (p,) * 5, host)
                yield ("compute_out", compute_out_kernel,
                       {"C_ptr": p, "B_ptr": p, "x_ptr": p, "dt_ptr": "*fp32", "dA_ptr": "*fp32", "st_ptr": p,
                        "D_ptr": "*fp32", "z_ptr": p, "seq_ptr": "*i32", "cb_ptr": "*fp32", "y_ptr": p, **types,
                        **stride_types(STRIDE_RANKS)},
                       dict(CHUNK=256, BLOCK_M=m, BLOCK_K=k, BLOCK_P=hp, BLOCK_DSTATE=dstate, HAS_D=feature,
                            HAS_Z=feature, HAS_SEQ=feature, SWAP=swap, EXP2=exp2, DOT_PRECISION=precision,
                            SHARED_CB=feature, DECAY_FACTOR=feature, TMA=tma, ST_N_CONTIG=not swap, HB=hb,
                            HEADS_FIRST=False, **hd),
                       c["num_warps"], c["num_stages"])
            c = fallback("sm90", FUSED, dims, itemsize, {})
            m, k, hp = c["block_rows"], c["block_positions"], c["block_headdim"]
            types, hd = host_descriptors(("C_hd", "B_hd", "x_hd", "y_hd"),
                                         ((1, m, 1, 128), (1, k, 1, 128), (1, k, 1, hp), (1, m, 1, hp)), (p,) * 4,
                                         host)
            for whole_chunk in (False, True):  # fused_program 'row_tile', 'chunk'
                yield ("fused_state_out" + ("_chunk" if whole_chunk else ""), fused_kernel,
                       {"C_ptr": p, "B_ptr": p, "x_ptr": p, "dt_ptr": "*fp32", "dA_ptr": "*fp32",
                        "init_ptr": "*fp32", "D_ptr": "*fp32", "z_ptr": p, "seq_ptr": "*i32", "st_ptr": p,
                        "slot_ptr": "*fp32", "y_ptr": p, "sync_ptr": "*i32", "cb_ptr": "*fp32", **types,
                        **stride_types(FUSED_STRIDE_RANKS)},
                       dict(CHUNK=256, BLOCK_M=m, BLOCK_K=k, BLOCK_P=hp, BLOCK_DSTATE=128, HAS_INIT=feature,
                            HAS_D=feature, HAS_Z=feature, HAS_SEQ=feature, SWAP=swap, EXP2=exp2,
                            DOT_PRECISION=precision, DECAY_FACTOR=feature, TMA=tma, WHOLE_CHUNK=whole_chunk,
                            # C·Bᵀ from memory (cb_mode='shared') with the 'chunk' programs only
                            SHARED_CB=feature and whole_chunk, **hd),
                       c["num_warps"], c["num_stages"])
            if tma:
                continue
            yield ("cb", cb_kernel, {"C_ptr": p, "B_ptr": p, "cb_ptr": "*fp32"},
                   dict(CHUNK=256, BLOCK=CB_BLOCK, BLOCK_DSTATE=128, DOT_PRECISION=precision), 4, 1)
        s = fallback("sm90", "state_passing", dims, itemsize, {})
        yield ("state_passing", state_passing_kernel,
               {"local_ptr": "*fp32", "out_ptr": p, "final_ptr": "*fp32", "init_ptr": "*fp32", "dA_ptr": "*fp32",
                "seq_ptr": "*i64"},
               dict(CHUNK=256, BLOCK_S=s["block_state"], DSTATE_MAJOR=swap, HAS_INIT=feature, HAS_SEQ=feature,
                    EXP2=exp2), s["num_warps"], 1)
        c = fallback("sm90", "chunk_state", dims, itemsize, {})  # state_pass='serial' takes chunk_state's fields
        # pointer loads; at the defaults also host-built descriptors (the sm_90 defaults' stage 2,
        # impls/triton/defaults.py)
        for host in (False, True) if True in tmas else (False,):
            types, hd = host_descriptors(("x_hd", "B_hd"), ((1, c["block_positions"], 1, c["block_headdim"]),
                                                            (1, c["block_positions"], 1, c["block_dstate"])), (p, p),
                                         host)
            yield ("serial_state", serial_state_kernel,
                   {"x_ptr": p, "B_ptr": p, "dt_ptr": "*fp32", "dA_ptr": "*fp32", "seq_ptr": "*i32",
                    "init_ptr": "*fp32", "out_ptr": p, "final_ptr": "*fp32", **types},
                   dict(CHUNK=256, BLOCK_P=c["block_headdim"], BLOCK_N=c["block_dstate"],
                        BLOCK_K=c["block_positions"], HAS_INIT=feature, HAS_SEQ=feature, SWAP=swap, EXP2=exp2,
                        DOT_PRECISION=precisions[0], TMA=host, **hd),
                   c["num_warps"], c["num_stages"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(POINTER))
    parser.add_argument("--all-variants", action="store_true")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("TRITON_INTERPRET is set: unset it to compile for a GPU", file=sys.stderr)
        return 2
    failed = 0
    for name, kernel, pointers, constexprs, warps, stages in variants(args.dtype, args.all_variants):
        label = f"{name} sm_{args.arch} {args.dtype} " + " ".join(f"{k}={v}" for k, v in constexprs.items())
        try:
            shared, uses_tma, makes_desc, ws, hand = _compile(kernel, pointers, constexprs, args.arch, warps,
                                                              stages)
        except Exception as exc:  # report every failing variant, not only the first
            failed += 1
            print(f"FAIL {label}: {type(exc).__name__}: {str(exc)[:500]}")
            continue
        fits = shared <= SHARED_MEMORY_LIMIT.get(args.arch, 232448)
        tma = bool(constexprs.get("TMA", False))
        # descriptor loads compile to bulk tensor copies; descriptors are made in the kernel unless built on the host
        tma_ok = uses_tma == tma and makes_desc == (tma and not constexprs.get("HOST_DESC", False))
        ws_ok = not ws  # no kernel of the backend asks for warp specialisation
        hand_ok = hand in (None, "ok")  # the fused kernel's flags: handoff()
        failed += not (fits and tma_ok and ws_ok and hand_ok)
        status = next((s for s, ok in (("SMEM", fits), ("TMA?", tma_ok), ("WS? ", ws_ok), ("SYNC", hand_ok))
                       if not ok), "ok  ")
        print(f"{status} {label} shared={shared} bulk_tensor_copies={'yes' if uses_tma else 'no'} "
              f"descriptors_in_kernel={'yes' if makes_desc else 'no'} warp_specialized={'yes' if ws else 'no'}"
              + (f" handoff={hand}" if hand is not None else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
