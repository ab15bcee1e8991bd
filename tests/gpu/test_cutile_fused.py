"""GPU correctness of the cuTile fused forward (switch fuse_state_out: chunk_cumsum, then stages 2 and 3 in one
kernel, impls/cutile/fused.py) against the float64 reference, y and the final state; the stage calls of the same
backend keep the three-stage contract and are checked too (tests.common.forward_errors).

Cases: the contract's GPU cases without packed sequences (the fused kernel refuses seq_idx / cu_seqlens), the
headline S1 shape (heavy), and a shape whose last chunk is partial with the full set of optional inputs. Variants:
the fallback tiles, 64-column blocks (more registers: the compiler spills), 32-row blocks, every code switch off.
"""

from __future__ import annotations

import dataclasses

import pytest

from impls.problem import Shape
from tests.common import GPU_CONTRACT_CASES, assert_matches_float64, switch_variant_params

pytestmark = pytest.mark.gpu

OFF = {"latency_hints": False, "tma": False, "exp2": False, "cb_precision": "fp32"}  # what the fused kernel reads
CASES = {name: p for name, p in GPU_CONTRACT_CASES.items() if not p.has_seq_idx}
CASES["partial-chunk-init-z-Dchannel"] = dataclasses.replace(
    GPU_CONTRACT_CASES["init-z-Dchannel-fp32states"], shape=Shape(2, 1000, 8, 64, 2, 64, 128))
VARIANTS = {"defaults": {"fuse_state_out": True}, "p64": {"fuse_state_out": True, "block_headdim": 64},
            "rows32": {"fuse_state_out": True, "block_rows": 32}, "all-off": {"fuse_state_out": True, **OFF}}


@pytest.mark.parametrize(
    "case,variant,dtype",
    switch_variant_params(CASES, VARIANTS, skip=lambda case, variant: case == "S1" and variant != "defaults"),
)
def test_fused_matches_float64(case, variant, dtype):
    from impls.cutile import CutileBackend

    ok, reason = CutileBackend.available()
    if not ok:
        pytest.skip(reason)
    backend = CutileBackend(**VARIANTS[variant])
    assert_matches_float64(backend, CASES[case], dtype, f"cutile-fused {case} {variant} {dtype}",
                           fused_views=case.startswith("Dhead-noncontig"))
