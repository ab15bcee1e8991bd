"""The sanitizer driver's bookkeeping (the runs themselves need the GPU): a zero launch count or an unflagged
negative control fails the check; the sanitizer's summary line is read."""

from __future__ import annotations

import pytest

from instruments import sanitize


@pytest.mark.parametrize("row, expected", [
    pytest.param({"backend": "triton", "launches": 2, "errors": 0}, "ok", id="clean"),
    pytest.param({"backend": "triton", "launches": 0, "errors": 0}, "FAIL: no launch", id="nothing-launched"),
    pytest.param({"backend": "cutile", "launches": 1, "errors": 3}, "FAIL", id="errors"),
    pytest.param({"backend": "cutile", "launches": 1, "errors": -1}, "FAIL", id="process-died"),
    pytest.param({"backend": "oob-control", "launches": 1, "errors": 5}, "ok (flagged)", id="control-flagged"),
    pytest.param({"backend": "oob-control", "launches": 1, "errors": 0}, "FAIL: control not flagged",
                 id="control-missed"),
])
def test_verdict(row, expected):
    assert sanitize.verdict(row) == expected


def test_reads_the_summary_and_launch_lines():
    out = "LAUNCHES 3\n========= Invalid __global__ write of size 4 bytes\n========= ERROR SUMMARY: 12 errors\n"
    assert sanitize.SUMMARY.search(out).group(1) == "12"
    assert sanitize.LAUNCHES.search(out).group(1) == "3"
