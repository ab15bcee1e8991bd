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


# --- the backward (cost_model.backward_*): hand-computed at TINY, bounds at every variant, the forward pinned ----
S3_Z = Problem(Shape(8, 4096, 64, 64, 8, 128, 256), has_z=True, state_dtype="float32")
PINNED_FORWARD = {  # the forward's entries before the backward's were added (ssd-cost-v1)
    Problem(S1): {"chunk_cumsum": {"flops": 0.0, "bytes": 26215040.0},
                  "fwd_pass_state": {"flops": 43117445120.0, "bytes": 553648128.0},
                  "compute_out": {"flops": 130996502528.0, "bytes": 876609856.0},
                  "forward": {"flops": 174113947648.0, "bytes": 1456473024.0, "bytes_fused": 714081216.0}},
    S3_Z: {"chunk_cumsum": {"flops": 0.0, "bytes": 20972032.0},
           "fwd_pass_state": {"flops": 34493956096.0, "bytes": 637534208.0},
           "compute_out": {"flops": 120259084288.0, "bytes": 1224737024.0},
           "forward": {"flops": 154753040384.0, "bytes": 1883243264.0, "bytes_fused": 960496384.0}},
}


@pytest.mark.parametrize("problem", list(PINNED_FORWARD), ids=["S1", "S3-z-fp32-states"])
def test_the_forwards_entries_are_unchanged_beside_the_backwards(problem):
    got = cost_model.costs(problem)
    assert {k: got[k] for k in PINNED_FORWARD[problem]} == PINNED_FORWARD[problem]
    assert {"backward", "forward_backward", *cost_model.BACKWARD_KERNELS} <= set(got)
    assert cost_model.MODEL_VERSION == "ssd-cost-v1"


def test_backward_flops_by_hand_tiny():
    # b=2, 3 chunks, H=4, G=2: 24 (batch, chunk, head), 12 (batch, chunk, group); QNP 8192, Q²N = Q²P 16384, NP 256
    p = Problem(TINY, dtype="float32")
    assert cost_model.backward_kernel_flops(p) == {
        "bwd_state_pass": 24 * (2 * 8192 + 4 * 256),
        "bwd_chunk": 24 * (4 * 8192 + 2 * 16384 + 4 * 16384),
        "bwd_dcb": 24 * (2 * 16384 + 2 * 8192) + 12 * 2 * 16384,
        "bwd_db": 24 * 2 * 8192 + 12 * 2 * 16384,
        "bwd_cumsum": 0.0,
    }
    assert cost_model.backward_flops(p) == 24 * (10 * 8192 + 4 * 256 + 4 * 16384) + 12 * 6 * 16384
    state2 = 24 * (2 * 8192 + 2 * 256)
    assert cost_model.backward_flops(p, recompute_states=True) == cost_model.backward_flops(p) + state2
    assert cost_model.backward_kernel_flops(p, recompute_states=True)["bwd_recompute_states"] == state2


def test_backward_bytes_by_hand_tiny():
    p = Problem(TINY, dtype="float32")  # dt_bias, softplus, D per head; no z, no initial states
    x = 2 * 96 * 4 * 16 * 4  # also dy, dx
    bc = 2 * 96 * 2 * 16 * 4
    dt_in = 2 * 96 * 4 * 4
    chunked = 2 * 4 * 3 * 32 * 4  # dt, dA_cumsum, ddt's and dΛ's parts, the row-sum partials
    states = 2 * 3 * 4 * 16 * 16 * 4  # also R (x's dtype)
    states_read = 2 * 2 * 4 * 16 * 16 * 4  # S_1, S_2
    final = 2 * 4 * 16 * 16 * 4
    per_chunk = 2 * 4 * 3 * 4
    dcb = 2 * 3 * 2 * (32 * 33 // 2) * 4
    dD_part = 2 * 3 * 4 * 16 * 4
    params, D = 2 * 4 * 4, 4 * 4
    assert cost_model.backward_kernel_bytes(p) == {
        "bwd_state_pass": bc + chunked + states_read + 2 * final + x + states + per_chunk,
        "bwd_chunk": x + 2 * bc + 2 * chunked + states + states + x + D + x + 3 * chunked + dD_part,
        "bwd_dcb": x + bc + 2 * chunked + states + x + dcb + bc,
        "bwd_db": x + bc + 2 * chunked + states + dcb + bc,
        "bwd_cumsum": dt_in + params + 4 * chunked + per_chunk + dt_in + 2 * per_chunk,
    }
    reads = x + 2 * bc + dt_in + params + D + 2 * chunked + final + x + final
    writes = x + 2 * bc + dt_in + params + D
    assert cost_model.backward_floor_bytes(p) == reads + states + writes
    assert cost_model.backward_floor_bytes(p, recompute_states=True) == reads + writes
    fwd = cost_model.costs(p)["forward"]
    both = cost_model.costs(p)["forward_backward"]
    assert both["bytes_fused"] == fwd["bytes_fused"] + 2 * chunked + states + reads + states + writes
    assert both["flops_recompute"] == fwd["flops"] + cost_model.backward_flops(p, recompute_states=True)


VARIANTS = [Problem(S1), S3_Z, Problem(TINY, dtype="float32", has_initial_states=True, D_per_channel=True),
            Problem(TINY, dtype="float16", nseqs=3, varlen=True, has_z=True, dt_limit=(0.0, 0.1)),
            Problem(TINY, nseqs=2, has_dt_bias=False, has_D=False)]


@pytest.mark.parametrize("problem", VARIANTS, ids=["S1", "S3-z", "init-Dchannel", "varlen-z", "seq_idx-bare"])
@pytest.mark.parametrize("recompute", [False, True], ids=["saved", "recomputed"])
def test_the_whole_floor_is_at_most_the_sum_of_the_kernels(problem, recompute):
    kernels_flops = cost_model.backward_kernel_flops(problem, recompute)
    kernels_bytes = cost_model.backward_kernel_bytes(problem, recompute)
    assert set(kernels_flops) == set(kernels_bytes)
    assert 0 < cost_model.backward_flops(problem, recompute) <= sum(kernels_flops.values())
    assert 0 < cost_model.backward_floor_bytes(problem, recompute) <= sum(kernels_bytes.values())
    suffix = "_recompute" if recompute else ""
    for stage in ("backward", "forward_backward"):
        cost = cost_model.costs(problem)[stage]
        assert cost[f"bytes_fused{suffix}"] <= cost[f"bytes{suffix}"]
    assert cost_model.costs(problem)["backward"][f"bytes{suffix}"] == sum(kernels_bytes.values())


def test_s1_backward_floor():
    c = cost_model.costs(Problem(S1))
    assert c["backward"]["flops"] / 1e9 == pytest.approx(393.3, rel=1e-3)
    assert sum(cost_model.backward_kernel_flops(Problem(S1)).values()) / 1e9 == pytest.approx(648.9, rel=1e-3)
    assert c["backward"]["bytes_fused"] / 1e9 == pytest.approx(1.281, rel=1e-3)
    assert c["backward"]["bytes_fused_recompute"] / 1e9 == pytest.approx(1.114, rel=1e-3)


def test_derived_metrics_of_the_recomputed_variant():
    cost = {"flops": 2e12, "bytes": 1e9, "bytes_fused": 0.5e9, "flops_recompute": 8e12, "bytes_recompute": 1e9,
            "bytes_fused_recompute": 0.25e9}
    d = cost_model.derived(cost, median_ms=1000.0, matmul_tflops=4.0, copy_gbps=1.0)
    assert d["frac_floor"] == pytest.approx(1.0) and d["frac_floor_fused"] == pytest.approx(0.5)
    assert d["frac_floor_recompute"] == pytest.approx(2.0)  # max(2 s, 1 s) / 1 s
    assert d["frac_floor_fused_recompute"] == pytest.approx(2.0)
