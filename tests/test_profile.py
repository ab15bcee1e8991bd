"""CPU tests of experiments/profile.py: the ncu command, the CSV parsing and the per-forward sums."""

import math

import pytest

from experiments import profile
from impls.problem import Problem, Shape

# the shape of `ncu --csv --page raw --print-units base` output: the target's own lines first, a header, a units
# line, then one line per kernel launch (values as ncu prints them, thousands separators included)
NCU_CSV = '''==PROF== Connected to process 123
PROFILED_FORWARD_DONE
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
    assert cmd[-3:] == ["--target", "cutile", "S1"]


def test_unknown_shape_preset_is_refused():
    with pytest.raises(SystemExit, match="--shape"):
        profile.headline_problem("S9")
