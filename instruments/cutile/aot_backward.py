"""Ahead-of-time compilation of the cuTile backward's kernels (impls/cutile/backward/) on a machine without a GPU, as
instruments/cutile/aot.py does the forward's stages: `build_call(kernel, dtype, switches, ...)` makes the launcher's
own `KernelCall` with `ArraySpec` placeholders, `aot.export` turns it into a cubin.
`python -m instruments.cutile.aot_backward [--ngroups 8] [--config JSON] [--switches JSON]` prints every kernel's
registers and spills."""

from __future__ import annotations

import sys

import torch

from impls.cutile.backward import chunk, cumsum, db, dcb, state_pass, tune
from impls.cutile.common import ArraySpec, KernelCall

KERNELS = tune.STAGES  # bwd_state_pass, bwd_chunk, bwd_dcb, bwd_db, bwd_cumsum
# S1's sizes (conf/shape/S1.yaml): batch 8, seqlen 4096, nheads 80, headdim 64, ngroups 1, dstate 128, chunk 256
S1 = dict(batch=8, seqlen=4096, nheads=80, headdim=64, ngroups=1, dstate=128, chunk=256)
HEADLINE = {"seq": False, "z": False, "init": False, "varlen": False, "d_mode": 1, "bias": True, "softplus": True,
            "limit": False}  # what a Mamba-2 layer calls (impls/README.md, "The headline problem")
EVERYTHING = {"seq": True, "z": True, "init": True, "varlen": True, "d_mode": 2, "bias": True, "softplus": True,
              "limit": True}  # every optional input of the contract


def build_call(kernel: str, dtype: torch.dtype, switches, dims: dict | None = None, config: dict | None = None,
               optional: dict | None = None, wide: bool = False, transposed: bool | None = None) -> KernelCall:
    """`kernel`'s KernelCall for `dtype` inputs with placeholders at `dims` (S1's by default), the config given over
    the sm_90 fallback for `dtype`, the optional inputs of `optional` (HEADLINE's by default), states stored (…,
    dstate, headdim) when `transposed` (default: switch transposed_layout) and int64-indexed arrays when `wide`."""
    d = dict(S1, **(dims or {}))
    on = dict(HEADLINE, **(optional or {}))
    config = dict(tune.fallback(kernel, 9, str(dtype).replace("torch.", "")), **(config or {}))
    trans = switches.transposed_layout if transposed is None else transposed
    f32, i32 = torch.float32, torch.int32
    tf32 = dtype == f32 and switches.cb_precision == "tf32"

    def a(dt, ndim):
        return ArraySpec(dt, ndim, wide=wide)

    dims6 = (d["batch"], d["seqlen"], d["nheads"], d["headdim"], d["ngroups"], d["dstate"])
    X, BC, Q, S5 = a(dtype, 4), a(dtype, 4), a(f32, 4), a(dtype, 5)
    seq = a(i32, 2)
    if kernel == tune.STATE_PASS:
        flags = {"dfinal": True, "seq": on["seq"], "z": on["z"], "ext": on["varlen"], "init": on["init"]}
        arrays = (BC, Q, seq, S5, Q, Q, X, X, a(f32, 5), S5, Q, Q, a(f32, 5))
        return state_pass.make_call(arrays, dims6, d["chunk"], flags, trans, tf32, switches, config)
    if kernel == tune.CHUNK:
        flags = {"seq": on["seq"], "z": on["z"], "xv": on["varlen"]}
        D = a(f32, 1 if on["d_mode"] == 1 else 2)
        arrays = (X, BC, BC, Q, Q, seq, S5, S5, X, X, X, D, Q, X, X, Q, Q, a(f32, 5), a(f32, 5), a(f32, 5))
        return chunk.make_call(arrays, dims6, d["chunk"], flags, on["d_mode"], trans, tf32, switches, config)
    out = a(f32, 4) if switches.bwd_group_split > 1 else BC  # dC's, dB's fp32 partials (or atomic buffer)
    if kernel == tune.DCB:
        arrays = (X, BC, Q, Q, seq, S5, X, X, a(f32, 5), out, BC, a(f32, 5))
        return dcb.make_call(arrays, dims6, d["chunk"], {"seq": on["seq"], "z": on["z"]}, trans, tf32, switches,
                             config)
    if kernel == tune.DB:
        arrays = (X, BC, Q, Q, seq, S5, a(f32, 5), a(f32, 4), out)
        bv = on["varlen"] and switches.bwd_group_split == 1  # with partials, added to their sum on the host
        return db.make_call(arrays, dims6, d["chunk"], {"seq": on["seq"], "bv": bv}, tf32, switches, config)
    if kernel == tune.CUMSUM:
        v = a(f32, 1)
        arrays = (a(dtype, 3), v, v, Q, Q, Q, a(f32, 5), Q, Q, Q, a(dtype, 3), a(f32, 3), a(f32, 3), a(f32, 5))
        flags = {"bias": on["bias"], "softplus": on["softplus"], "v": on["varlen"]}
        limit = (0.0, 0.1) if on["limit"] else (0.0, float("inf"))
        row_tile = chunk.blocks(d["chunk"], d["headdim"], d["dstate"], tune.FALLBACK[9][tune.CHUNK])[0]
        last_tiles = state_pass.tiles(d["headdim"], d["dstate"], tune.FALLBACK[9][tune.STATE_PASS])
        enter_tiles = {"state_pass": last_tiles, "dcb": 1}.get(switches.bwd_entry_term, 0)
        return cumsum.make_call(arrays, (d["batch"], d["seqlen"], d["nheads"]), d["chunk"], flags, limit, row_tile,
                                last_tiles, switches, config, enter_tiles)
    raise ValueError(f"kernel: expected one of {KERNELS}, got {kernel!r}")


def main(argv=None) -> int:  # pragma: no cover - a convenience for reading the kernels' spills
    import argparse
    import json

    from impls.cutile.switches import CutileSwitches
    from instruments.cutile.aot import export
    from instruments.sass import cubin_facts

    p = argparse.ArgumentParser(description="AOT-compile the cuTile backward's kernels and print registers/spills")
    p.add_argument("--kernels", nargs="*", default=list(KERNELS))
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--arch", default="sm_90")
    p.add_argument("--ngroups", type=int, default=S1["ngroups"])
    p.add_argument("--everything", action="store_true", help="every optional input (default: the headline's)")
    p.add_argument("--config", default="{}", help="JSON config for every kernel listed, e.g. '{\"block\": 32}'")
    p.add_argument("--switches", default="{}",
                   help="JSON switches over the defaults, e.g. '{\"bwd_state_split\": false}'")
    a = p.parse_args(argv)
    switches = CutileSwitches(**json.loads(a.switches))
    for kernel in a.kernels:
        call = build_call(kernel, getattr(torch, a.dtype), switches, {"ngroups": a.ngroups},
                          json.loads(a.config), EVERYTHING if a.everything else None)
        f = cubin_facts(export(call, a.arch))
        print(f"{kernel:16s} registers {f.registers:3d}  LDL {f.ldl:4d}  STL {f.stl:4d}  stack {f.stack_bytes}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
