"""Ahead-of-time compilation of the cuTile stages on a machine without a GPU.

`build_call(stage, dtype, switches, ...)` makes the same `KernelCall` the launcher makes, with `ArraySpec`
placeholders for the tensors; `export(call, arch)` turns it into a cubin with
`cuda.tile.compilation.export_kernel`; instruments/sass.py reads the cubin (`disassemble`, `facts`, ...).
`python -m instruments.cutile.aot STAGE [--switches JSON] [--config JSON]` prints one variant's SASS facts.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import sys

import torch

from impls.cutile.common import ArraySpec, KernelCall, ct_dtype

STAGES = ("chunk_cumsum", "fwd_pass_state", "compute_out")
# compute_out_cb: stage 3's C·Bᵀ kernel, launched when shared_cb; fused: stages 2 and 3 in one (fuse_state_out)
KERNELS = (*STAGES, "compute_out_cb", "fused")
# stage 2 with state_pass='chunk_parallel': the local states, then the pass across chunks (not in the SASS fixture)
STATE_PASS_KERNELS = ("fwd_pass_state_local", "fwd_pass_state_pass")
# the fused kernel with fused_program='chunk' (impls/cutile/fused_chunk.py; not in the SASS fixture)
FUSED_PROGRAM_KERNELS = ("fused_chunk",)
# compute_out's q = dA_cumsum·log2(e) − log2(dt) kernel, launched with switch exp_fold (not in the SASS fixture)
FOLD_KERNELS = ("compute_out_fold",)
# A small problem with every optional piece present: the shape does not enter the code (all sizes are runtime
# values), only the tile sizes derived from it do.
AOT_DIMS = dict(batch=2, seqlen=512, nheads=8, headdim=64, ngroups=2, dstate=128, chunk=128)


def array_constraint(spec: ArraySpec):
    import cuda.tile as ct
    from cuda.tile.compilation import ArrayConstraint

    elem = torch.empty((), dtype=spec.dtype).element_size()
    per16 = max(1, 16 // elem)
    stride_div = [per16] * (spec.ndim - 1) + [1 if spec.unit_last_stride else per16]
    index = ct.int64 if spec.wide else ct.int32
    return ArrayConstraint(ct_dtype(spec.dtype), spec.ndim, index_dtype=index, stride_lower_bound_incl=0,
                           alias_groups=(), may_alias_internally=False,
                           stride_constant=[None] * (spec.ndim - 1) + [1 if spec.unit_last_stride else None],
                           stride_divisible_by=stride_div, base_addr_divisible_by=16)


def signature(call: KernelCall):
    """The KernelSignature of `call`: arrays from their specs, runtime scalars int32/fp32, constants as given."""
    import cuda.tile as ct
    from cuda.tile.compilation import CallingConvention, KernelSignature, ScalarConstraint

    pyfunc = call.kernel._annotated_function.pyfunc
    params = list(inspect.signature(pyfunc).parameters.values())
    out = []
    for param, arg in zip(params, call.args):
        constant = "Constant" in str(param.annotation)
        if isinstance(arg, ArraySpec):
            out.append(array_constraint(arg))
        elif constant:
            out.append(arg)
        elif isinstance(arg, float):
            out.append(ScalarConstraint(ct.float32))
        else:
            out.append(ScalarConstraint(ct.int32))
    return KernelSignature(out, CallingConvention.cutile_python_v1()).with_mangled_symbol(pyfunc.__name__)


def export(call: KernelCall, arch: str) -> bytes:
    from cuda.tile.compilation import export_kernel

    buf = io.BytesIO()
    export_kernel(call.kernel, [signature(call)], buf, gpu_code=arch, output_format="cubin")
    return buf.getvalue()


def build_call(stage: str, dtype: torch.dtype, switches, dims: dict | None = None, config: dict | None = None,
               optional: bool = True, wide: bool = False, d_mode: int | None = None) -> KernelCall:
    """The stage's KernelCall for `dtype` with placeholders; `optional` turns on every optional input; `wide`
    builds the int64-indexed kernel (arrays whose offsets pass 2^31); `d_mode` (compute_out, fused) overrides
    the skip term's form: 0 none, 1 D per head (a 1-d D), 2 D per channel."""
    d = dict(AOT_DIMS, **(dims or {}))
    config = dict(config or {})
    f32, i32 = torch.float32, torch.int32

    def spec(dt, ndim):  # every placeholder of this call, int32- or int64-indexed
        return ArraySpec(dt, ndim, wide=wide)

    dims6 = (d["batch"], d["seqlen"], d["nheads"], d["headdim"], d["ngroups"], d["dstate"])
    tf32 = dtype == f32 and switches.cb_precision == "tf32"
    d_mode = (2 if optional else 0) if d_mode is None else d_mode
    d_spec = spec(f32, 1 if d_mode == 1 else 2)
    if stage == "chunk_cumsum":
        from impls.cutile import chunk_cumsum as mod

        arrays = (spec(dtype, 3), spec(f32, 1), spec(f32, 1), spec(f32, 4), spec(f32, 4))
        return mod.make_call(arrays, (d["batch"], d["seqlen"], d["nheads"]), d["chunk"], optional, optional,
                             (0.0, 0.1) if optional else (0.0, float("inf")), switches, config)
    if stage == "fwd_pass_state":
        from impls.cutile import fwd_pass_state as mod

        arrays = (spec(dtype, 4), spec(dtype, 4), spec(f32, 4), spec(f32, 4), spec(f32, 4),
                  spec(i32, 2), spec(dtype, 5), spec(f32, 4))
        return mod.make_call(arrays, dims6, d["chunk"], optional, optional, tf32, switches, config)
    if stage == "fwd_pass_state_local":
        from impls.cutile import fwd_pass_state as mod

        arrays = (spec(dtype, 4), spec(dtype, 4), spec(f32, 4), spec(f32, 4), spec(i32, 2), spec(f32, 5))
        return mod.make_local_call(arrays, dims6, d["chunk"], optional, tf32, switches, config)
    if stage == "fwd_pass_state_pass":
        from impls.cutile import fwd_pass_state as mod

        arrays = (spec(f32, 5), spec(f32, 4), spec(f32, 4), spec(i32, 2), spec(dtype, 5), spec(f32, 4))
        return mod.make_pass_call(arrays, dims6, d["chunk"], optional, optional, switches)
    if stage == "compute_out":
        from impls.cutile import compute_out as mod

        arrays = (spec(dtype, 4), spec(dtype, 4), spec(dtype, 4), spec(f32, 4), spec(f32, 4),
                  spec(dtype, 5), d_spec, spec(dtype, 4), spec(i32, 2), spec(f32, 5), spec(dtype, 4))
        return mod.make_call(arrays, dims6, d["chunk"], d_mode, optional, optional, tf32, switches, config)
    if stage == "compute_out_cb":
        from impls.cutile import compute_out as mod

        return mod.make_cb_call((spec(dtype, 4), spec(dtype, 4), spec(f32, 5)), dims6, d["chunk"], tf32, switches,
                                config)
    if stage == "compute_out_fold":
        from impls.cutile import compute_out as mod

        return mod.make_fold_call((spec(f32, 4), spec(f32, 4), spec(f32, 4)),
                                  (d["batch"], d["nheads"], -(-d["seqlen"] // d["chunk"])), d["chunk"], switches)
    if stage == "fused":
        from impls.cutile import fused as mod

        arrays = (spec(dtype, 4), spec(dtype, 4), spec(dtype, 4), spec(f32, 4), spec(f32, 4), spec(f32, 4),
                  d_spec, spec(dtype, 4), spec(dtype, 4), spec(f32, 4))
        return mod.make_call(arrays, dims6, d["chunk"], optional, d_mode, optional, tf32, switches, config)
    if stage == "fused_chunk":
        from impls.cutile import fused_chunk as mod

        arrays = (spec(dtype, 4), spec(dtype, 4), spec(dtype, 4), spec(f32, 4), spec(f32, 4), spec(f32, 4),
                  d_spec, spec(dtype, 4), spec(dtype, 4), spec(dtype, 5), spec(f32, 4), spec(i32, 1))
        return mod.make_call(arrays, dims6, d["chunk"], optional, d_mode, optional, tf32, switches, config)
    raise ValueError(f"stage: expected one of {KERNELS + STATE_PASS_KERNELS + FUSED_PROGRAM_KERNELS + FOLD_KERNELS}, "
                     f"got {stage!r}")


def main(argv=None) -> int:  # pragma: no cover - a convenience for looking at one variant
    import argparse

    from impls.cutile.switches import CutileSwitches
    from instruments.sass import disassemble, facts, opcodes, resource_usage

    p = argparse.ArgumentParser(description="AOT-compile one cuTile stage and print its SASS facts")
    p.add_argument("stage", choices=KERNELS + STATE_PASS_KERNELS + FUSED_PROGRAM_KERNELS + FOLD_KERNELS)
    p.add_argument("--config", default="{}", help="JSON tile config, e.g. '{\"shared_cb\": true}'")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--arch", default="sm_90")
    p.add_argument("--off", nargs="*", default=[], help="switches to turn off")
    p.add_argument("--on", nargs="*", default=[], help="bool switches to turn on")
    p.add_argument("--switches", default="{}", help="JSON switch values, e.g. '{\"head_mma\": \"per_head\"}'")
    a = p.parse_args(argv)
    import json

    from impls.cutile.tune import OFF_VALUE

    sw = dataclasses.replace(CutileSwitches(), **{k: OFF_VALUE.get(k, False) for k in a.off},
                             **{k: True for k in a.on}, **json.loads(a.switches))
    cubin = export(build_call(a.stage, getattr(torch, a.dtype), sw, config=json.loads(a.config)), a.arch)
    text = disassemble(cubin)
    ops = opcodes(text)
    mma_sync = {name: sum(n for op, n in ops.items() if op.split(".")[0] == name) for name in ("HMMA", "LDL", "STL")}
    print({**facts(text), **mma_sync, **resource_usage(cubin)})
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
