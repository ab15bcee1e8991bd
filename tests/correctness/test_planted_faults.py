"""The gate (harness.correctness.check, whole-tensor and block-wise) fails every planted fault of
tests/faults.py at a scaled-down size on the CPU, and passes the reference itself on the same inputs."""

from __future__ import annotations

import pytest
import torch

from harness import correctness
from impls.inputs import make_inputs
from impls.problem import Problem, Shape
from impls.reference.backend import ReferenceBackend
from impls.tolerance import REL_TOL, SAME_PRECISION_K, blockwise_err, output_blocks, rel_err
from tests.faults import LOCAL_FAULTS, SEQ_IDX_FAULTS, SUBTLE_FAULTS, CorrectBf16, ZeroesOneTokenPerRow

# long rows of few heads in bf16 (the headline's dtype): one wrong token or chunk is a small part of the tensor
LONG = Shape(batch=2, seqlen=4000, nheads=4, headdim=16, ngroups=1, dstate=16, chunk_size=64)
PACKED = Problem(Shape(2, 300, 4, 16, 2, 16, 32), dtype="float32", nseqs=3, has_initial_states=True)


def gate(backend, problem: Problem, seed: int = 2) -> dict:
    inputs = make_inputs(problem, seed=seed)
    ref = correctness.reference_forward(inputs, "float64")
    return correctness.check(backend, inputs, ref, problem.torch_dtype)


@pytest.fixture(scope="module")
def long_inputs():
    inputs = make_inputs(Problem(LONG), seed=2)
    return inputs, correctness.reference_forward(inputs, "float64")


def test_reference_passes_the_gate(long_inputs):
    inputs, ref = long_inputs
    report = correctness.check(ReferenceBackend(), inputs, ref, torch.bfloat16)
    assert all(r["ok"] for r in report.values()), report


@pytest.mark.parametrize("fault", list(LOCAL_FAULTS), ids=list(LOCAL_FAULTS))
def test_local_fault_fails_the_gate(fault, long_inputs):
    inputs, ref = long_inputs
    broken = LOCAL_FAULTS[fault]()
    report = correctness.check(broken, inputs, ref, torch.bfloat16)
    assert not report[broken.stage]["ok"], report[broken.stage]
    assert report["chunk_cumsum"]["ok"]  # the fault is where it was planted, not everywhere


def test_one_zeroed_token_hides_under_a_flat_whole_tensor_bound_but_not_block_wise(long_inputs):
    """Why the gate judges blocks: one zero token in 4000 is ~1.6% of y's norm, under bf16's flat 2e-2; its block
    (token 2000 of 64-token chunks) is named."""
    inputs, ref = long_inputs
    report = correctness.check(ZeroesOneTokenPerRow(), inputs, ref, torch.bfloat16)
    assert report["compute_out"]["rel_err"] < REL_TOL[torch.bfloat16], report
    assert not report["compute_out"]["ok"] and report["compute_out"]["block_err"] > 0.02
    assert "chunk 31" in report["compute_out"]["block_where"] and "chunk 31" in report["compute_out"]["bound_where"]


@pytest.mark.parametrize("fault", list(SEQ_IDX_FAULTS), ids=list(SEQ_IDX_FAULTS))
def test_seq_idx_fault_fails_the_gate(fault):
    assert all(r["ok"] for r in gate(ReferenceBackend(), PACKED).values())
    report = gate(SEQ_IDX_FAULTS[fault](), PACKED)
    assert not report["fwd_pass_state"]["ok"] and not report["forward"]["ok"], report


# --- faults a flat bf16 bound misses, at S1's block size (chunk 256 x headdim 64, dstate 128) ----------------------
S1_BLOCKS = Problem(Shape(batch=1, seqlen=1024, nheads=6, headdim=64, ngroups=1, dstate=128, chunk_size=256),
                    dtype="bfloat16")


@pytest.fixture(scope="module")
def s1_block_inputs():
    inputs = make_inputs(S1_BLOCKS, seed=5)
    return inputs, correctness.reference_forward(inputs, "float64")


def _flat_worst(stage_outputs: dict, ref) -> float:
    """The worst whole-tensor or block error of the outputs against the float64 reference (what a flat bound reads)."""
    worst = 0.0
    for name, out in stage_outputs.items():
        if out is None or getattr(ref, name) is None:
            continue
        block, _ = output_blocks(name, S1_BLOCKS.shape.chunk_size)
        worst = max(worst, rel_err(out, getattr(ref, name)), blockwise_err(out, getattr(ref, name), block).ratio)
    return worst


def test_a_correct_bf16_computation_passes_with_room(s1_block_inputs):
    inputs, ref = s1_block_inputs
    report = correctness.check(CorrectBf16(), inputs, ref, torch.bfloat16)
    assert all(r["ok"] for r in report.values()), report
    assert max(r["bound_ratio"] for r in report.values()) <= 1.05 / SAME_PRECISION_K, report


@pytest.mark.parametrize("fault", list(SUBTLE_FAULTS), ids=list(SUBTLE_FAULTS))
def test_subtle_fault_passes_a_flat_bound_and_fails_the_same_precision_bound(fault, s1_block_inputs):
    inputs, ref = s1_block_inputs
    broken = SUBTLE_FAULTS[fault]()
    outputs = correctness.run_stages(broken, inputs)
    assert _flat_worst(outputs[broken.stage], ref) < REL_TOL[torch.bfloat16]  # what the flat bound let through
    report = correctness.check(broken, inputs, ref, torch.bfloat16)
    assert not report[broken.stage]["ok"], report[broken.stage]
    assert report["chunk_cumsum"]["ok"], report["chunk_cumsum"]
