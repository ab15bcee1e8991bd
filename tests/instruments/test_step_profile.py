"""The step profile: the SSD's share of a language-model step (instruments/step_profile.py) and the end-to-end
speedup it predicts (analysis/end_to_end.py)."""

from __future__ import annotations

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


def test_split_on_the_host_clock_takes_the_step_ranges_as_the_whole():
    step = _event("step", 1000.0, 0.0)
    got = split([step, _event(SSD_RANGE, 250.0, 0.0, parent=step)], "host", steps=1, step_range="step")
    assert got.total_ms == pytest.approx(1.0) and got.share == pytest.approx(0.25)


@pytest.mark.parametrize("direction", ["forward", "train_step"])
def test_a_tiny_step_on_the_cpu_has_an_ssd_share_between_zero_and_one(direction):
    step, device, _ = lm_step("reference", "tiny", direction, dtype="float32", n_layer=1, device="cpu")
    got = profile_step(step, device, steps=1, warmup=1)
    assert got.clock == "host" and 0.0 < got.share < 1.0
    assert (got.ssd_backward_ms > 0.0) == (direction == "train_step")


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="direction"):
        lm_step("reference", "tiny", "backward")
    with pytest.raises(ValueError, match="shape"):
        lm_step("reference", "no_such_shape", "forward")
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
