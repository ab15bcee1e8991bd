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

import pytest

from impls.problem import Problem, Shape
from tests.common import assert_matches_float64, switch_variant_params

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





@pytest.mark.parametrize(
    "case,variant,dtype",
    # the big shape: defaults and all-off only (its float64 reference is heavy)
    switch_variant_params(CASES, VARIANTS, skip=lambda case, variant: case == "S1" and variant not in ("defaults", "all-off")),
)
def test_cutile_matches_float64(case, variant, dtype, request):
    from impls.cutile import CutileBackend

    ok, reason = CutileBackend.available()
    if not ok:
        pytest.skip(reason)
    backend = CutileBackend(**VARIANTS[variant])
    assert_matches_float64(backend, CASES[case], dtype, f"cutile {case} {variant} {dtype}",
                           fused_views=case.startswith("Dhead-noncontig"))
