"""The cost model against hand-computed flops and bytes (two shapes) and the performance issue's figures."""

import pytest

from harness import cost_model
from impls.problem import Problem, Shape

S1 = Shape(8, 4096, 80, 64, 1, 128, 256)
TINY = Shape(2, 96, 4, 16, 2, 16, 32)


def test_flops_by_hand_tiny():
    # b=2, L=96 -> 3 chunks of 32, H=4, P=16, G=2, N=16, Q=32
    per_head = 2 * 3 * 4
    state = per_head * (2 * 32 * 16 * 16 + 2 * 16 * 16)
    out = 2 * 3 * 2 * (2 * 32 * 32 * 16) + per_head * (2 * 32 * 32 * 16 + 2 * 32 * 16 * 16)
    flops = cost_model.stage_flops(Problem(TINY, dtype="float32"))
    assert flops == {"chunk_cumsum": 0.0, "fwd_pass_state": state, "compute_out": out}


def test_bytes_by_hand_tiny():
    p = Problem(TINY, dtype="float32")  # dt_bias, softplus, D per head; no z, no initial states
    x = 2 * 96 * 4 * 16 * 4
    bc = 2 * 96 * 2 * 16 * 4
    dt_in = 2 * 96 * 4 * 4
    chunked = 2 * 4 * 3 * 32 * 4
    states = 2 * 3 * 4 * 16 * 16 * 4
    final = 2 * 4 * 16 * 16 * 4
    nbytes = cost_model.stage_bytes(p)
    assert nbytes["chunk_cumsum"] == dt_in + 2 * 4 * 4 + 2 * chunked
    assert nbytes["fwd_pass_state"] == bc + x + 2 * chunked + states + final
    assert nbytes["compute_out"] == 2 * bc + x + 2 * chunked + states + 4 * 4 + x
    assert cost_model.fused_bytes(p) == x + dt_in + 2 * 4 * 4 + 2 * bc + 4 * 4 + x + final


def test_s1_matches_the_issue():
    bf16 = cost_model.costs(Problem(S1, dtype="bfloat16"))["forward"]
    fp32_states = cost_model.costs(Problem(S1, dtype="bfloat16", state_dtype="float32"))["forward"]
    # hand: chunk states 2QNP + C·state 2QNP + scores·x 2Q²P per (b, chunk, head), C·Bᵀ 2Q²N per group
    dense = 8 * 16 * 80 * (2 * 256 * 128 * 64 * 2 + 2 * 256 * 256 * 64) + 8 * 16 * 1 * 2 * 256 * 256 * 128
    assert bf16["flops"] == dense + 8 * 16 * 80 * 2 * 128 * 64
    assert bf16["flops"] / 1e9 == pytest.approx(174, rel=0.01)
    assert bf16["bytes"] / 1e9 == pytest.approx(1.44, rel=0.03)
    assert fp32_states["bytes"] / 1e9 == pytest.approx(1.78, rel=0.03)
    assert bf16["bytes_fused"] / 1e9 == pytest.approx(0.70, rel=0.03)


def test_optional_inputs_add_their_traffic():
    base = cost_model.costs(Problem(S1))["forward"]
    with_z = cost_model.costs(Problem(S1, has_z=True))["forward"]
    z = 8 * 4096 * 80 * 64 * 2
    assert with_z["bytes"] - base["bytes"] == z
    assert with_z["bytes_fused"] - base["bytes_fused"] == z


def test_derived_metrics():
    cost = {"flops": 2e12, "bytes": 1e9, "bytes_fused": 0.5e9}
    d = cost_model.derived(cost, median_ms=1000.0, matmul_tflops=4.0, copy_gbps=1.0)
    assert d["tflops"] == pytest.approx(2.0)
    assert d["gbps"] == pytest.approx(1.0)
    assert d["frac_floor"] == pytest.approx(1.0)  # max(0.5 s, 1.0 s) / 1 s
    assert d["frac_floor_fused"] == pytest.approx(0.5)
    assert "tflops" not in cost_model.derived({"flops": 0.0, "bytes": 1.0}, 1.0)
