"""CPU tests of instruments/profile.py: the ncu command, the CSV parsing, the per-call sums and the cost model beside
them, for the forward and the backward directions."""

import math
from pathlib import Path

import pytest

from impls.problem import Problem, Shape
from instruments import profile

# the shape of `ncu --csv --page raw --print-units base` output: the target's own lines first, a header, a units
# line, then one line per kernel launch (values as ncu prints them, thousands separators included)
NCU_CSV = '''==PROF== Connected to process 123
PROFILED_CALL_DONE
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC",\
"dram__bytes_read.sum","dram__bytes_write.sum","gpu__time_duration.sum","l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum",\
"l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum","launch__occupancy_limit_registers","launch__registers_per_thread",\
"sm__warps_active.avg.pct_of_peak_sustained_active"
"","","","","","","","","","","","byte","byte","ns","byte","byte","block","register/thread","%"
"0","123","python","h","chunk_cumsum_kernel","1","7","(128, 1, 1)","(40, 1, 1)","0","9.0","26,214,400","1,000","14,700","0","0","4","40","60.0"
"1","123","python","h","compute_out_kernel","1","7","(256, 1, 1)","(960, 1, 1)","0","9.0","800,000,000","335,000,000","700,000","1,024","2,048","2","168","30.0"
'''


def test_ncu_csv_is_parsed_per_launch():
    launches = profile.parse_ncu_csv(NCU_CSV)
    assert [l["kernel"] for l in launches] == ["chunk_cumsum_kernel", "compute_out_kernel"]
    assert launches[1]["dram_read_bytes"] == 8e8 and launches[1]["registers_per_thread"] == 168
    assert launches[0]["duration_ns"] == 14_700 and launches[1]["local_store_bytes"] == 2048


def test_forward_totals_add_up_each_metric_by_its_rule():
    totals = profile.forward_totals(profile.parse_ncu_csv(NCU_CSV))
    assert totals["duration_ns"] == 714_700 and totals["dram_write_bytes"] == 335_001_000
    assert totals["registers_per_thread"] == 168 and totals["occupancy_limit_registers"] == 2
    weighted = (60.0 * 14_700 + 30.0 * 700_000) / 714_700
    assert math.isclose(totals["achieved_occupancy_pct"], weighted)


def test_rows_put_the_cost_model_beside_the_measurement():
    problem = Problem(Shape(8, 4096, 80, 64, 1, 128, 256))
    rows = profile.backend_rows("cutile", "S1", profile.parse_ncu_csv(NCU_CSV), problem)
    by = {(r["kernel"], r["metric"]): r["value"] for r in rows}
    assert by[("forward", "launches")] == 2
    assert 1.4e9 < by[("cost_model", "bytes")] < 1.5e9  # the staged minimum at S1, bf16 states
    assert math.isclose(by[("forward", "dram_bytes_over_model")],
                        (826_214_400 + 335_001_000) / by[("cost_model", "bytes")])


def test_no_csv_means_no_launches():
    assert profile.parse_ncu_csv("==ERROR== the profiler could not start\n") == []


def test_ncu_command_leaves_the_clocks_alone_and_profiles_one_range(monkeypatch):
    monkeypatch.setattr(profile, "ncu", lambda: "/opt/ncu")
    cmd = profile.ncu_command("cutile", "S1")
    assert cmd[:5] == ["/opt/ncu", "--clock-control", "none", "--profile-from-start", "off"]
    assert cmd[-5:] == ["--target", "cutile", "S1", "none", "forward"]


def test_unknown_shape_preset_is_refused():
    with pytest.raises(SystemExit, match="--shape"):
        profile.headline_problem("S9")


# --- the sm_90 metric set: spills, L2, DRAM, warp stalls, tensor pipe (a synthetic ncu raw CSV with ncu's layout) ---
SM90_CSV = (Path(__file__).parents[1] / "fixtures" / "ncu_raw_sm90.csv").read_text()


def test_every_requested_metric_is_read_from_the_csv():
    header = next(line for line in SM90_CSV.splitlines() if '"Kernel Name"' in line)
    assert all(f'"{metric}"' in header for metric in profile.METRICS)
    for launch in profile.parse_ncu_csv(SM90_CSV):
        missing = [name for name, _unit, _how in profile.METRICS.values() if math.isnan(launch[name])]
        assert not missing, f"{launch['kernel']}: {missing}"


def test_spills_l2_dram_and_tensor_pipe_per_launch():
    out = {l["kernel"]: l for l in profile.parse_ncu_csv(SM90_CSV)}["compute_out_kernel"]
    assert out["local_load_requests"] == 2_970_000 and out["local_store_requests"] == 2_150_000
    assert out["l2_throughput_pct"] == 79.0 and out["l2_hit_rate_pct"] == 62.0
    assert out["dram_throughput_pct"] == 42.0 and out["tensor_pipe_active_pct"] == 38.5
    assert out["registers_per_thread"] == 80 and out["achieved_occupancy_pct"] == 27.0


def test_stall_breakdown_names_the_rest_and_shares_add_to_100():
    out = {l["kernel"]: l for l in profile.parse_ncu_csv(SM90_CSV)}["compute_out_kernel"]
    assert out["stall_long_scoreboard"] == 10.0 and out["warp_cycles_per_issue"] == 20.0
    assert math.isclose(out["stall_other"], 20.0 - 18.4 - 0.6)
    assert math.isclose(out["stall_long_scoreboard_share_pct"], 50.0)
    shares = [out[f"stall_{r}_share_pct"] for r in (*profile.STALL_REASONS, "other")]
    assert math.isclose(sum(shares), 100.0)
    assert profile.stall_summary(out).startswith("long_scoreboard 50 %")


def test_stall_shares_are_nan_without_a_total():
    assert math.isnan(profile.derived({"stall_long_scoreboard": 1.0})["stall_long_scoreboard_share_pct"])


def test_sm90_rows_are_one_metric_per_row_with_units():
    problem = Problem(Shape(8, 4096, 80, 64, 1, 128, 256))
    launches = profile.parse_ncu_csv(SM90_CSV)
    rows = profile.backend_rows("cutile", "S1", launches, problem)
    columns = {"backend", "shape_name", "kernel", "launch", "metric", "value", "unit", "ablation", "direction"}
    assert all(set(r) == columns for r in rows)
    by = {(r["kernel"], r["metric"]): r for r in rows}
    spill = by[("compute_out_kernel", "local_store_requests")]
    assert spill["value"] == 2_150_000 and spill["unit"] == "request"
    assert by[("compute_out_kernel", "stall_other")]["unit"] == "cycle/inst"
    assert by[("compute_out_kernel", "stall_barrier_share_pct")]["value"] == 10.0
    # the forward: spill requests add up, percentages weighted by time, the stall shares recomputed from the totals
    assert by[("forward", "local_load_requests")]["value"] == 140_000 + 2_970_000
    time = 13_216 + 212_032 + 654_112
    l2 = (35.0 * 13_216 + 61.7 * 212_032 + 79.0 * 654_112) / time
    assert math.isclose(by[("forward", "l2_throughput_pct")]["value"], l2)
    total = (8.0 * 13_216 + 25.0 * 212_032 + 20.0 * 654_112) / time
    long_sb = (4.0 * 13_216 + 13.5 * 212_032 + 10.0 * 654_112) / time
    assert math.isclose(by[("forward", "stall_long_scoreboard_share_pct")]["value"], 100 * long_sb / total)


def test_ncu_command_asks_for_every_metric(monkeypatch):
    monkeypatch.setattr(profile, "ncu", lambda: "/opt/ncu")
    cmd = profile.ncu_command("cutile", "S1")
    assert cmd[cmd.index("--metrics") + 1].split(",") == list(profile.METRICS)


def test_every_metric_is_one_nsight_compute_knows_on_gh100():
    """The hardware metrics asked for exist on the H200's chip: their base names (before the .sum/.avg/.pct/.ratio
    roll-up) appear in `ncu --query-metrics --chip gh100` as run on the GPU machine (2026-12-04; gpu__, dram__,
    lts__, sm__, smsp__ and l1tex__ names kept). One unknown name makes ncu refuse the whole profile."""
    import gzip
    import re

    known = set(gzip.decompress((Path(__file__).parents[1] / "fixtures" / "ncu_metrics_gh100.txt.gz").read_bytes())
                .decode().split())
    base = {m: re.sub(r"\.(sum|avg|max|min|pct|ratio)(\..*)?$", "", m) for m in profile.METRICS}
    unknown = [m for m, b in base.items() if not m.startswith("launch__") and b not in known]
    assert not unknown, unknown


def test_ablation_points_reach_the_target_and_the_rows(monkeypatch):
    monkeypatch.setattr(profile, "ncu", lambda: "ncu")
    cmd = profile.ncu_command("cutile", "S1", "heads_first:True+pdl:True")
    assert cmd[-5:] == ["--target", "cutile", "S1", "heads_first:True+pdl:True", "forward"]
    assert profile.ablation_switches("cutile", "heads_first:True+pdl:True") == {"heads_first": True, "pdl": True}
    problem = profile.headline_problem("S1")
    rows = profile.backend_rows("cutile", "S1", profile.parse_ncu_csv(NCU_CSV), problem, "pdl:True")
    assert {row["ablation"] for row in rows} == {"pdl:True"}


def test_a_bad_ablation_point_is_refused_before_any_profile(monkeypatch, capsys):
    monkeypatch.setattr(profile, "profile_backend", lambda *a, **k: pytest.fail("profiled despite a bad point"))
    with pytest.raises(SystemExit):
        profile.main(["--backends", "cutile", "--ablations", "none", "no_such_switch:True"])
    assert "no_such_switch" in capsys.readouterr().err


# --- the backward directions: what is profiled, and each of our backward kernels beside its own cost ---
BACKWARD_CSV = NCU_CSV.replace("chunk_cumsum_kernel", "bwd_state_pass_kernel").replace("compute_out_kernel",
                                                                                       "bwd_chunk_kernel")


def test_the_direction_reaches_the_target(monkeypatch):
    monkeypatch.setattr(profile, "ncu", lambda: "ncu")
    assert profile.ncu_command("triton", "S3", "none", "backward")[-5:] == ["--target", "triton", "S3", "none",
                                                                           "backward"]


def test_a_bad_direction_is_refused(capsys):
    with pytest.raises(SystemExit):
        profile.main(["--backends", "triton", "--direction", "sideways"])
    assert "--direction" in capsys.readouterr().err
    with pytest.raises(ValueError, match="direction"):
        profile.profiled_call(None, None, "sideways")


@pytest.mark.parametrize("kernel, priced", [
    ("bwd_chunk_kernel", "bwd_chunk"), ("bwd_state_pass_kernel", "bwd_state_pass"), ("bwd_db", "bwd_db"),
    ("compute_out_kernel", "compute_out"), ("cb_kernel", None), ("_chunk_scan_bwd_dx", None),
    ("bwd_chunk_kernel_2", None), ("backward", None), ("forward_kernel", None),
    # cuTile's names carry the kernel's specialisation (as the H100's torch profiler saw them on 2026-12-07)
    ("bwd_chunk_kernel_Kt2_A4bf16_7v8l0_8t1_ei16_p16_Si32_B0_A5f32_1fs1t1_p16", "bwd_chunk"),
    ("bwd_cumsum_kernel_Kt2_A3bf16_3v8l0_4t1_6i16_p16_B1", "bwd_cumsum"), ("cb_kernel_Kt2_A4bf16", None),
    ("compute_out_kernel_Kt2_A4bf16_I256", "compute_out"),
    ("forward_kernel_Kt2_A4bf16", None)], ids=lambda v: str(v)[:40])
def test_a_kernel_is_priced_only_by_its_own_name(kernel, priced):
    """Our backends' kernels only: TileGym's cuTile kernels carry our forward stages' names, and are its own."""
    from harness import cost_model

    costs = cost_model.costs(Problem(Shape(8, 4096, 80, 64, 1, 128, 256)))
    for backend in ("triton", "cutile"):
        assert cost_model.priced_kernel(kernel, costs, backend) == priced
    for peer in ("tilegym", "mamba_ssm"):
        assert cost_model.priced_kernel(kernel, costs, peer) is None


def test_backward_rows_put_each_kernel_and_the_whole_backward_beside_the_model():
    from harness import cost_model

    problem = Problem(Shape(8, 4096, 80, 64, 1, 128, 256), dtype="bfloat16")
    rows = profile.backend_rows("triton", "S1", profile.parse_ncu_csv(BACKWARD_CSV), problem, "none", "backward")
    by = {(r["kernel"], r["metric"]): r["value"] for r in rows}
    assert {r["direction"] for r in rows} == {"backward"}
    costs = cost_model.costs(problem)
    assert by[("backward", "launches")] == 2 and ("forward", "launches") not in by
    assert by[("cost_model", "flops")] == costs["backward"]["flops"]
    assert by[("bwd_chunk_kernel", "model_bytes")] == costs["bwd_chunk"]["bytes"]
    assert by[("bwd_chunk_kernel", "model_flops")] == costs["bwd_chunk"]["flops"] > 0
    assert math.isclose(by[("bwd_chunk_kernel", "dram_bytes_over_model")],
                        (800_000_000 + 335_000_000) / costs["bwd_chunk"]["bytes"])
    assert math.isclose(by[("backward", "dram_bytes_over_model")],
                        (826_214_400 + 335_001_000) / costs["backward"]["bytes"])


def test_the_backward_call_is_the_timed_rows_backward(monkeypatch):
    """The profiled backward is harness/measure_time.py's: torch.autograd.grad over one kept forward graph, every
    differentiable input's gradient returned (here the reference backend on the CPU at a tiny size)."""
    import torch

    import impls
    from impls.inputs import make_inputs

    problem = Problem(Shape(1, 32, 2, 4, 1, 4, 16), dtype="float32")
    inputs = make_inputs(problem, device="cpu", seed=0)
    backend = impls.get_backend("reference")
    grads = profile.profiled_call(backend, inputs, "backward")()
    assert all(g is None or torch.isfinite(g).all() for g in grads)
    dx = grads[0]
    assert dx is not None and dx.shape == inputs.x.shape and dx.abs().sum() > 0
    y = profile.profiled_call(backend, inputs, "forward")()
    assert y.y.shape == inputs.x.shape


def test_the_profilers_directions_are_the_workloads():
    from harness.workloads import DIRECTIONS

    assert profile.DIRECTIONS == DIRECTIONS
