"""The gate's error measure (impls.tolerance.blockwise_err) and the mamba-ssm x2 rule's bookkeeping
(harness.correctness.mamba_ssm_rule): what each judges, and that a skipped rule says why."""

from __future__ import annotations

import math

import pytest
import torch

from harness import correctness
from impls.inputs import make_inputs
from impls.problem import Problem, Shape
from impls.reference.backend import ReferenceBackend
from impls.registry import get_backend
from impls.tolerance import NEAR_ZERO, blockwise_err, output_blocks, rel_err


def test_block_ratio_is_the_worst_blocks_relative_error():
    ref = torch.randn(2, 100, 4, 8, dtype=torch.float64)
    out = ref.clone()
    out[1, 40:64, 2] *= 1.1  # chunk 1 (of 32 tokens), head 2, row 1: 24 of its 32 tokens 10% off
    found = blockwise_err(out, ref, output_blocks("y", 32)[0])
    block = (out - ref)[1, 32:64, 2].norm() / ref[1, 32:64, 2].norm()
    assert found.where == (1, 1, 2, 0) and found.ratio == pytest.approx(float(block)) and not found.near_zero
    assert rel_err(out, ref) < found.ratio / 2


def test_partial_last_chunk_is_a_block_of_its_own():
    ref = torch.randn(1, 70, 2, 4, dtype=torch.float64)
    out = ref.clone()
    out[0, 64:] = 0  # the last, 6-token chunk
    found = blockwise_err(out, ref, output_blocks("y", 32)[0])
    assert found.where[:2] == (0, 2) and found.ratio == pytest.approx(1.0)


def test_near_zero_block_is_held_to_the_absolute_bound():
    """A zero reference block (the state entering chunk 0 without initial states): an error there is measured
    against NEAR_ZERO x the average block's norm, so a rounding-sized error passes and a real one does not."""
    ref = torch.randn(1, 4, 2, 8, 8, dtype=torch.float64)
    ref[:, 0] = 0
    average = math.sqrt(float(ref.square().sum()) / (4 * 2))
    out = ref.clone()
    out[0, 0, 1, 0, 0] = 1e-3 * NEAR_ZERO * average
    small = blockwise_err(out, ref, output_blocks("states", 32)[0])
    assert small.near_zero and small.where[:3] == (0, 0, 1) and small.ratio == pytest.approx(1e-3)
    out[0, 0, 1, 0, 0] = NEAR_ZERO * average
    assert blockwise_err(out, ref, output_blocks("states", 32)[0]).ratio == pytest.approx(1.0)


def test_nan_anywhere_is_an_infinite_block_error_located():
    ref = torch.randn(2, 3, 4, 4, dtype=torch.float64)
    out = ref.clone()
    out[1, 2, 0, 3] = float("nan")
    found = blockwise_err(out, ref, output_blocks("final_states", 32)[0])
    assert found.ratio == math.inf and found.where[:2] == (1, 2)


def test_gate_rows_name_the_worst_block():
    problem = Problem(Shape(1, 96, 2, 8, 1, 8, 32), dtype="float32")
    inputs = make_inputs(problem, seed=1)
    ref = correctness.reference_forward(inputs, "float64")
    report = correctness.check(ReferenceBackend(), inputs, ref, torch.float32)
    assert all(r["ok"] and r["block_err"] < 1e-6 for r in report.values()), report
    assert report["compute_out"]["block_where"].startswith("y: batch 0, chunk ")


@pytest.mark.parametrize("state_dtype", ["bfloat16", "float16"])
def test_states_stored_coarser_than_the_inputs_are_bounded_at_the_state_dtype(state_dtype):
    """fp32 inputs with states stored in fp16/bf16: no computation can be closer than the state dtype allows, and
    the same-precision computation stores them so too: the stages that store or read states get bounds of the state
    dtype's scale, chunk_cumsum one of fp32's."""
    problem = Problem(Shape(1, 40, 2, 16, 1, 16, 16), dtype="float32", state_dtype=state_dtype,
                      has_initial_states=True)
    inputs = make_inputs(problem, seed=0)
    report = correctness.check(ReferenceBackend(), inputs, correctness.reference_forward(inputs, "float64"),
                               torch.float32)
    assert all(r["ok"] for r in report.values()), report
    unit = torch.finfo(problem.torch_state_dtype).eps
    assert report["chunk_cumsum"]["tol"] < 1e-5
    assert all(unit / 8 < report[s]["tol"] < 8 * unit for s in ("fwd_pass_state", "compute_out", "forward")), report


class _Fake:
    """A stand-in backend name for the rule's bookkeeping (nothing runs)."""

    def __init__(self, name):
        self.name = name


CPU, CUDA = torch.device("cpu"), torch.device("cuda")
SMALL = Problem(Shape(1, 96, 2, 8, 1, 8, 32))


@pytest.mark.parametrize("backend, problem, device, words", [
    pytest.param("triton", SMALL, CPU, "not on a GPU", id="cpu"),
    pytest.param("mamba_ssm", SMALL, CUDA, "mamba_ssm itself", id="mamba_ssm-itself"),
    pytest.param("reference", SMALL, CUDA, "reference", id="reference"),
    pytest.param("triton", Problem(Shape(1, 1 << 20, 80, 64, 1, 128, 256)), CUDA, "2^31", id="2^20-tokens"),
    pytest.param("triton", Problem(Shape(1, 96, 2, 8, 1, 8, 32), varlen=True, nseqs=2, has_initial_states=True),
                 CUDA, "cannot run the problem", id="unsupported-by-mamba_ssm"),
])
def test_mamba_ssm_rule_skip_reasons(backend, problem, device, words, monkeypatch):
    # the rule's GPU runs are compiled (bf16 is refused interpreted): say "not interpreting" without setting
    # TRITON_INTERPRET=0, which would leave any kernel module first imported here compiled for the rest of the run
    monkeypatch.setattr("impls.mamba_ssm.upstream.interpreting", lambda: False)
    monkeypatch.setattr("impls.triton.backend.interpreting", lambda: False)
    reason = correctness.mamba_ssm_skip_reason(_Fake(backend), problem, device)
    assert reason is not None and words in reason


def _rule(monkeypatch, theirs: dict, ours: float) -> dict:
    monkeypatch.setattr(correctness, "mamba_ssm_skip_reason", lambda *args: None)
    monkeypatch.setattr(correctness, "check", lambda *args, **kw: {"forward": theirs})
    return correctness.mamba_ssm_rule(_Fake("triton"), None, None, SMALL, torch.bfloat16, CUDA,
                                      {"forward": {"rel_err": ours}})


def test_mamba_ssm_rule_applied(monkeypatch):
    theirs = {"ok": True, "rel_err": 4e-3, "error": None}
    assert _rule(monkeypatch, theirs, 7e-3)["ok"]
    failed = _rule(monkeypatch, theirs, 9e-3)
    assert failed["applied"] and not failed["ok"] and "2 x mamba_ssm's" in failed["error"]


def test_mamba_ssm_rule_skipped_when_mamba_ssm_fails_its_own_gate(monkeypatch):
    rule = _rule(monkeypatch, {"ok": False, "rel_err": 0.5, "error": "forward: rel_err ..."}, 0.9)
    assert not rule["applied"] and rule["ok"] and "fails its own gate" in rule["why"]


def test_mamba_ssm_rule_on_a_real_cpu_check_is_skipped_with_the_reason():
    inputs = make_inputs(Problem(Shape(1, 64, 2, 8, 1, 8, 32), dtype="float32"), seed=1)
    ref = correctness.reference_forward(inputs, "float64")
    backend = get_backend("reference")
    report = correctness.check(backend, inputs, ref, torch.float32)
    rule = correctness.mamba_ssm_rule(backend, inputs, ref, SMALL, torch.float32, CPU, report)
    assert not rule["applied"] and rule["ok"] and "skipped" in rule["why"]


def test_slabs_change_nothing_and_inputs_stay_untouched(monkeypatch):
    """blockwise_err works through slabs of whole blocks (bounded float64 copies): any slab size gives the same
    worst block, and float64 inputs (which it could alias) are left as they were."""
    import impls.tolerance as tolerance

    ref = torch.randn(2, 1000, 4, 16, dtype=torch.float64)
    out = ref + 1e-3 * torch.randn_like(ref)
    out[1, 700, 3] *= 2
    kept = (out.clone(), ref.clone())
    whole = blockwise_err(out, ref, output_blocks("y", 64)[0])
    monkeypatch.setattr(tolerance, "SLAB_ELEMENTS", 1000)
    assert blockwise_err(out, ref, output_blocks("y", 64)[0]) == whole and whole.where[:3] == (1, 10, 3)
    assert torch.equal(out, kept[0]) and torch.equal(ref, kept[1])


@pytest.mark.quick
@pytest.mark.parametrize("dtype, poison", [
    pytest.param(torch.float32, "nan", id="float"),
    pytest.param(torch.int32, -2**31, id="int"),
    pytest.param(torch.bool, True, id="bool"),
])
def test_poisoned_allocations_poison_every_dtype_and_leave_fake_tensors(dtype, poison):
    """Every real allocation in the block is poisoned (a bool as True: iinfo has no bool); a compiler's fake tensors,
    traced inside the block (torch.compile of a gated model), are not touched."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from impls.tolerance import poisoned_allocations

    with poisoned_allocations():
        t = torch.empty(4, dtype=dtype)
        with FakeTensorMode():
            fake = torch.empty(4, dtype=dtype)
    assert t.isnan().all() if poison == "nan" else (t == poison).all()
    assert fake.shape == (4,)
