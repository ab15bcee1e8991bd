"""What a faster SSD should buy end to end (Amdahl): with the SSD a share `s` of a step's time under one backend and
another backend's SSD `k` times faster, the step gets 1 / ((1 − s) + s / k) times faster; `explained` compares a
measured end-to-end speedup with that prediction (issue: within 20 %, else the gap is explained from the profile)."""

from __future__ import annotations

import math
from dataclasses import dataclass


def predicted_speedup(share: float, ssd_speedup: float) -> float:
    """The step's speedup when its SSD part (`share` of its time, 0..1) runs `ssd_speedup` times faster."""
    if not 0.0 <= share <= 1.0 or math.isnan(share):
        raise ValueError(f"share: expected a fraction in [0, 1], got {share!r}")
    if not ssd_speedup > 0.0:
        raise ValueError(f"ssd_speedup: expected > 0, got {ssd_speedup!r}")
    return 1.0 / ((1.0 - share) + share / ssd_speedup)


@dataclass(frozen=True)
class EndToEnd:
    """One comparison: the measured step speedup, the predicted one and their ratio (measured / predicted)."""

    measured: float
    predicted: float
    ratio: float
    within: bool


def explained(step_ms_base: float, step_ms_new: float, share_base: float, ssd_ms_base: float, ssd_ms_new: float,
              tolerance: float = 0.20) -> EndToEnd:
    """The base backend's step and SSD times and share against the new backend's step and SSD times: is the measured
    speedup within `tolerance` (relative) of what the base's share predicts? The speedups are compared as speedups
    minus one (the gain), so that a 2 % gain predicted and 2.3 % measured counts as 15 % off, not 0.3 %."""
    for name, value in (("step_ms_base", step_ms_base), ("step_ms_new", step_ms_new), ("ssd_ms_base", ssd_ms_base),
                        ("ssd_ms_new", ssd_ms_new)):
        if not value > 0.0:
            raise ValueError(f"{name}: expected > 0, got {value!r}")
    measured = step_ms_base / step_ms_new
    predicted = predicted_speedup(share_base, ssd_ms_base / ssd_ms_new)
    gain_measured, gain_predicted = measured - 1.0, predicted - 1.0
    if abs(gain_predicted) < 1e-12:
        within = abs(gain_measured) < 1e-3
        ratio = math.inf if not within else 1.0
    else:
        ratio = gain_measured / gain_predicted
        within = abs(ratio - 1.0) <= tolerance
    return EndToEnd(measured, predicted, ratio, within)
