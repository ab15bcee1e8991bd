"""The planted faults of tests/faults.py at full size on the GPU: the headline S1 in bf16 (where one zeroed token
per row stays under the whole-tensor tolerance) must fail the gate, block-wise; packed-sequence faults at a
medium size with seq_idx drawn per row."""

from __future__ import annotations

import pytest
import torch

from harness import correctness
from impls.inputs import make_inputs
from impls.problem import Problem, Shape
from impls.reference.backend import ReferenceBackend
from tests.common import S1
from tests.faults import LOCAL_FAULTS, SEQ_IDX_FAULTS, ZeroesOneTokenPerRow, whole_tensor_passes

S1_PARTIAL = Shape(8, 4000, 80, 64, 1, 128, 256)  # S1 with a partial last chunk
PACKED = Problem(Shape(4, 2000, 16, 64, 2, 64, 256), nseqs=4, has_initial_states=True)


def _gate(backend, problem: Problem, seed: int = 1) -> dict:
    inputs = make_inputs(problem, device="cuda", seed=seed)
    ref = correctness.reference_forward(inputs, "float64")
    return correctness.check(backend, inputs, ref, problem.torch_dtype, device=torch.device("cuda"))


@pytest.mark.heavy
@pytest.mark.parametrize("fault", list(LOCAL_FAULTS), ids=list(LOCAL_FAULTS))
def test_local_fault_fails_at_full_size(fault):
    broken = LOCAL_FAULTS[fault]()
    report = _gate(broken, Problem(S1_PARTIAL))
    print(f"[{fault}]", {s: (r["rel_err"], r["block_err"], r["block_where"]) for s, r in report.items()})
    assert not report[broken.stage]["ok"], report[broken.stage]


@pytest.mark.heavy
def test_zeroed_token_hides_from_the_whole_tensor_at_s1():
    report = _gate(ZeroesOneTokenPerRow(), Problem(S1))
    assert whole_tensor_passes(report, torch.bfloat16) and not report["compute_out"]["ok"], report["compute_out"]


@pytest.mark.heavy
def test_reference_passes_at_full_size():
    report = _gate(ReferenceBackend(), Problem(S1_PARTIAL))
    assert all(r["ok"] for r in report.values()), report


@pytest.mark.parametrize("fault", list(SEQ_IDX_FAULTS), ids=list(SEQ_IDX_FAULTS))
def test_seq_idx_fault_fails_on_gpu(fault):
    assert all(r["ok"] for r in _gate(ReferenceBackend(), PACKED).values())
    report = _gate(SEQ_IDX_FAULTS[fault](), PACKED)
    assert not report["fwd_pass_state"]["ok"] and not report["forward"]["ok"], report
