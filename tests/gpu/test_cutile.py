"""GPU correctness of the cuTile backend: every stage and the full forward against the float64 reference.

Variants: the defaults, each code switch off alone, all off. Cases: the headline S1 shape and shapes covering the
contract (seqlen not a multiple of chunk, ngroups 8, seq_idx with 3 sequences, cu_seqlens, initial states + z +
per-channel D + fp32 states, per-head D with x and z as strided views of one fused projection, headdim/dstate not
powers of two). Outputs are NaN-poisoned (tests.common uses impls.tolerance.poisoned_allocations).

Compilation dominates the run time; CUTILE_TEST_SHARD="i/n" runs every n-th test so n processes can share the GPU
and compile in parallel (e.g. `for i in 0..7: CUTILE_TEST_SHARD=$i/8 pytest tests/gpu/test_cutile.py &`).
"""

from __future__ import annotations

import dataclasses
import os
import zlib

import pytest
import torch

from impls.inputs import make_inputs
from impls.problem import Problem, Shape
from tests.common import failures, float64_forward, forward_errors

pytestmark = pytest.mark.gpu

S1 = Shape(batch=8, seqlen=4096, nheads=80, headdim=64, ngroups=1, dstate=128, chunk_size=256)
SMALL = Shape(batch=2, seqlen=1000, nheads=8, headdim=64, ngroups=2, dstate=64, chunk_size=256)

CASES = {
    "S1": Problem(S1),
    "seqlen1000-chunk256": Problem(SMALL),
    "ngroups8": Problem(Shape(2, 512, 16, 64, 8, 128, 128)),
    "seq_idx-3-seqs": Problem(dataclasses.replace(SMALL, seqlen=700, chunk_size=128), nseqs=3),
    "cu_seqlens-4-seqs": Problem(dataclasses.replace(SMALL, batch=1, seqlen=900, chunk_size=64), varlen=True,
                                 nseqs=4),
    "init-z-Dchannel-fp32states": Problem(SMALL, has_initial_states=True, has_z=True, D_per_channel=True,
                                          state_dtype="float32", dt_limit=(0.001, 0.08)),
    "Dhead-noncontig-x-z": Problem(SMALL, has_z=True),  # x and z made strided views below
    "p80-n48": Problem(Shape(1, 300, 4, 80, 2, 48, 64), has_z=True, nseqs=2),
}
OFF = {"transposed_layout": False, "operand_swap": False, "latency_hints": False, "tma": False, "exp2": False,
       "cb_precision": "fp32"}
VARIANTS = {"defaults": {}, **{f"no-{k}": {k: v} for k, v in OFF.items()}, "all-off": dict(OFF)}


def _params():
    out = []
    for case in CASES:
        for variant in VARIANTS:
            dtypes = ["bfloat16"]
            if variant in ("defaults", "all-off", "no-cb_precision"):
                dtypes += ["float16", "float32"]
            if case == "S1" and variant not in ("defaults", "all-off"):
                continue  # the big shape: defaults and all-off only (the reference is heavy)
            for dt in dtypes:
                marks = pytest.mark.heavy if case == "S1" else ()
                out.append(pytest.param(case, variant, dt, id=f"{case}-{variant}-{dt}", marks=marks))
    return out


def _in_shard(test_id: str) -> bool:
    shard = os.environ.get("CUTILE_TEST_SHARD")
    if not shard:
        return True
    i, n = (int(v) for v in shard.split("/"))
    return zlib.crc32(test_id.encode()) % n == i


def _strided_views(inputs):
    """x and z as column slices of one (batch, seqlen, 2·nheads·headdim + 8) projection, as in Mamba-2's in_proj."""
    b, l, h, p = inputs.x.shape
    proj = torch.randn(b, l, 2 * h * p + 8, device=inputs.x.device, dtype=inputs.x.dtype)
    x = proj[..., : h * p].view(b, l, h, p)
    z = proj[..., h * p + 8:].view(b, l, h, p)
    x.copy_(inputs.x)
    z.copy_(inputs.z)
    assert not x.is_contiguous() and not z.is_contiguous()
    inputs.x, inputs.z = x, z
    return inputs


@pytest.mark.parametrize("case,variant,dtype", _params())
def test_cutile_matches_float64(case, variant, dtype, request):
    if not _in_shard(request.node.callspec.id):
        pytest.skip("other shard")
    from impls.cutile import CutileBackend

    ok, reason = CutileBackend.available()
    if not ok:
        pytest.skip(reason)
    backend = CutileBackend(**VARIANTS[variant])
    problem = CASES[case]
    torch_dtype = getattr(torch, dtype)
    inputs = make_inputs(problem, device="cuda", seed=1, dtype=torch_dtype)
    if case.startswith("Dhead-noncontig"):
        inputs = _strided_views(inputs)
    ref = float64_forward(inputs)
    errors = forward_errors(backend, inputs, ref)
    tf32 = torch_dtype == torch.float32 and backend.switches.cb_precision == "tf32"
    bad = failures(errors, torch_dtype, tf32)
    worst = max(errors, key=errors.get)
    print(f"[cutile] {case} {variant} {dtype}: worst {worst}={errors[worst]:.2e} {backend.describe()['stages']}")
    assert not bad, f"over tolerance: {bad} (all: {errors})"
