"""The step profile: the SSD's share of a language-model step (instruments/step_profile.py) and the end-to-end
speedup it predicts (analysis/end_to_end.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from analysis.end_to_end import explained, predicted_speedup
from instruments.step_profile import SSD_BACKWARD_NODE, SSD_RANGE, lm_step, profile_step, split


def _event(name, cpu_us, device_us, parent=None):
    return SimpleNamespace(name=name, cpu_time_total=cpu_us, device_time_total=device_us, cpu_parent=parent)


def test_split_counts_the_ssd_ranges_and_the_autograd_thread_on_the_device_clock():
    step = _event("step", 900.0, 600.0)
    events = [step, _event(SSD_RANGE, 100.0, 150.0, parent=step),
              _event(f"autograd::engine::evaluate_function: {SSD_BACKWARD_NODE}", 80.0, 250.0),  # top level
              _event("autograd::engine::evaluate_function: MmBackward0", 50.0, 150.0)]
    got = split(events, "device", steps=2, step_range="step")
    assert got.total_ms == pytest.approx((600 + 250 + 150) * 1e-3 / 2)
    assert got.ssd_forward_ms == pytest.approx(0.075) and got.ssd_backward_ms == pytest.approx(0.125)
    assert got.share == pytest.approx(400 / 1000)


def test_a_backward_node_recorded_twice_nested_counts_once():
    step = _event("step", 1000.0, 0.0)
    engine = _event(f"autograd::engine::evaluate_function: {SSD_BACKWARD_NODE}", 400.0, 0.0, parent=step)
    got = split([step, engine, _event(SSD_BACKWARD_NODE, 390.0, 0.0, parent=engine)], "host", steps=1,
                step_range="step")
    assert got.ssd_backward_ms == pytest.approx(0.4) and got.share == pytest.approx(0.4)


def test_split_on_the_host_clock_takes_the_step_ranges_as_the_whole():
    step = _event("step", 1000.0, 0.0)
    got = split([step, _event(SSD_RANGE, 250.0, 0.0, parent=step)], "host", steps=1, step_range="step")
    assert got.total_ms == pytest.approx(1.0) and got.share == pytest.approx(0.25)


@pytest.mark.parametrize("direction, dtype, autocast", [("forward", "float32", False), ("train_step", "float32", False),
                                                       ("train_step", "bfloat16", True)],
                         ids=["forward", "train_step", "train_step-autocast"])
def test_a_tiny_step_on_the_cpu_has_an_ssd_share_between_zero_and_one(direction, dtype, autocast):
    step, device, _ = lm_step("reference", "tiny", direction, dtype=dtype, n_layer=1, device="cpu", autocast=autocast)
    got = profile_step(step, device, steps=1, warmup=1)
    assert got.clock == "host" and 0.0 < got.share < 1.0
    assert (got.ssd_backward_ms > 0.0) == (direction == "train_step")


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="direction"):
        lm_step("reference", "tiny", "backward")
    with pytest.raises(ValueError, match="shape"):
        lm_step("reference", "no_such_shape", "forward")
    with pytest.raises(ValueError, match="^workload.options.compile"):
        lm_step("reference", "tiny", "forward", compile="fastest")
    with pytest.raises(ValueError, match="^workload.options.autocast"):
        lm_step("reference", "tiny", "forward", dtype="float32", autocast=True)
    with pytest.raises(ValueError, match="share"):
        predicted_speedup(1.5, 2.0)
    with pytest.raises(ValueError, match="ssd_speedup"):
        predicted_speedup(0.5, 0.0)


def test_the_prediction_is_amdahls_law():
    assert predicted_speedup(0.0, 10.0) == 1.0
    assert predicted_speedup(1.0, 4.0) == pytest.approx(4.0)
    assert predicted_speedup(0.5, 2.0) == pytest.approx(1 / 0.75)


def test_a_measured_speedup_far_from_the_prediction_is_not_explained():
    # SSD 10 % of the step, 2x faster: 1/(0.9 + 0.05) = 1.0526 predicted
    assert explained(10.0, 10.0 / 1.0526, 0.10, 1.0, 0.5).within
    assert not explained(10.0, 10.0 / 1.10, 0.10, 1.0, 0.5).within  # a 10 % gain where 5.3 % was predicted


def _lm_rows(tmp_path):
    """Real rows of the language model's prefill on the CPU (the reference backend), and the same rows relabelled
    as a second backend 1.25 times slower: one run, two backends."""
    import pandas as pd

    from analysis.load import wide
    from experiments import bench
    from harness import plan
    from impls.problem import Problem, Shape

    point = plan.point("reference", Problem(Shape(2, 96, 4, 16, 2, 16, 32), dtype="float32"), workload="mamba2_lm",
                       direction="forward", bench=plan.BenchSettings(stages=("forward",), cpu_warmup=0, cpu_reps=1))
    rows = bench.measure(point)
    assert rows.status == "ok", rows.error
    ours = rows.frame()
    slower = ours.assign(backend="mamba_ssm", run_id=ours["run_id"] + "-b")
    timing = slower["metric"].isin(["median_ms", "p20_ms", "p80_ms"])
    slower.loc[timing, "value"] *= 1.25
    slower.loc[slower["metric"] == "tokens_per_s", "value"] /= 1.25
    return wide(pd.concat([ours, slower], ignore_index=True))


def test_the_language_model_table_gives_tokens_per_second_and_the_speedup_over_the_base(tmp_path):
    from analysis.end_to_end import lm_table

    table = lm_table(_lm_rows(tmp_path)).set_index("backend")
    assert table.loc["reference", "speedup_vs_mamba_ssm"] == pytest.approx(1.25)
    assert table.loc["mamba_ssm", "speedup_vs_mamba_ssm"] == pytest.approx(1.0)
    tokens_per_ms = 2 * 96 / table.loc["reference", "median_ms"]
    assert table.loc["reference", "tokens_per_s"] == pytest.approx(tokens_per_ms * 1e3)


def test_the_share_table_sets_the_measured_speedup_beside_the_predicted_one(tmp_path):
    import pandas as pd

    from analysis.end_to_end import lm_table, share_table

    lm = lm_table(_lm_rows(tmp_path))
    # base: the SSD half the step; the other backend's SSD twice as fast -> 1 / (0.5 + 0.25) = 1.333 predicted
    profile = pd.DataFrame([
        {"backend": "mamba_ssm", "direction": "forward", "share": 0.5, "ssd_forward_ms": 2.0, "ssd_backward_ms": 0.0},
        {"backend": "reference", "direction": "forward", "share": 0.4, "ssd_forward_ms": 1.0, "ssd_backward_ms": 0.0},
    ])
    got = share_table(profile, lm).iloc[0]
    assert (got["backend"], got["ssd_speedup"]) == ("reference", 2.0)
    assert got["measured"] == pytest.approx(1.25) and got["predicted"] == pytest.approx(4 / 3)
    assert got["gain_ratio"] == pytest.approx(0.25 / (1 / 3)) and not got["within"]
    assert share_table(profile[profile["backend"] == "reference"], lm).empty  # no base profile: no row


def test_the_rows_file_must_carry_the_tables_suffix(capsys):
    """--out names a table of its own beside result rows: a name the results store would read as rows is refused
    before anything runs."""
    from instruments import step_profile

    with pytest.raises(SystemExit):
        step_profile.main(["--backends", "reference", "--out", "results/x/step_profile.parquet"])
    err = capsys.readouterr().err
    assert "--out" in err and step_profile.SUFFIX in err


# --- the layer's parts and the tables beside the rows (analysis/end_to_end.py), on the CPU fixture's rows ---
END_TO_END_CPU = Path(__file__).resolve().parents[1] / "fixtures" / "end_to_end_cpu"


def test_the_layer_parts_table_puts_the_non_ssd_part_beside_its_floor():
    from analysis.end_to_end import layer_parts_table
    from analysis.load import load_results, wide

    w = wide(load_results(END_TO_END_CPU / "end_to_end.parquet"))
    cpu = layer_parts_table(w)
    assert cpu["floor_ms"].isna().all()  # no ceilings measured on the CPU: no floor, no ratio
    w.loc[w["workload"] == "mamba2_layer", "frac_floor"] = 0.25  # as a GPU run's rows carry it
    table = layer_parts_table(w).set_index(["backend", "part"])
    parts = table.loc["reference"]
    assert list(parts.index) == ["in_proj_conv", "ssd", "norm_out_proj", "forward", "non_ssd"]
    non_ssd = parts.loc["non_ssd"]
    assert non_ssd["median_ms"] == pytest.approx(parts.loc["in_proj_conv", "median_ms"]
                                                 + parts.loc["norm_out_proj", "median_ms"])
    assert non_ssd["x_floor"] == pytest.approx(4.0) and parts.loc["ssd", "x_floor"] == pytest.approx(4.0)
    assert parts.loc["forward", "share_of_layer"] == 1.0


def test_tables_beside_the_rows_are_found_or_named_missing(tmp_path):
    from analysis.end_to_end import beside, load_step_profiles

    profile = load_step_profiles([str(END_TO_END_CPU / "end_to_end.parquet")])
    assert set(profile["backend"]) == {"reference", "mamba_ssm"} and set(profile["source"]) == {
        "lm.step_profile.parquet"}
    with pytest.raises(FileNotFoundError, match=r"no \*\.step_profile\.parquet beside the rows .*" + tmp_path.name):
        beside([str(tmp_path)], ".step_profile.parquet")
