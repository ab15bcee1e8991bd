"""impls/triton/switch_launch_effects.json is current (the launches recorded again here agree with every row), and its
recorder would see a change: a switch known to change a stage's kernels (exp2 in chunk_cumsum) reads as one, and a
recorder that missed the launches would raise instead of calling every switch a no-op."""

from __future__ import annotations

import json

import pytest

from instruments.triton import switch_effects as se


def test_the_committed_table_is_current():
    committed = json.loads(se.PATH.read_text())
    assert committed == se.table()


def test_a_change_of_code_is_seen():
    assert se.effect("chunk_cumsum", "bfloat16", "exp2")["effect"] == "changes the launches"
    assert se.effect("chunk_cumsum", "bfloat16", "transposed_layout")["effect"].startswith("no-op")
    assert se.effect("compute_out", "bfloat16", "heads_first")["effect"] == "changes the launches"


def test_the_analysis_reads_it_as_a_no_op_table():
    from analysis.switches import noop_table

    noops = noop_table("triton")
    assert noops.reason("sm_90", "transposed_layout", "chunk_cumsum", "bfloat16")
    assert noops.reason("sm_90", "exp2", "chunk_cumsum", "bfloat16") is None
    assert noops.reason("sm_90", "tma", "compute_out", "bfloat16") is None


def test_a_recorder_that_sees_nothing_raises(monkeypatch):
    import contextlib

    monkeypatch.setattr(se, "recorded_launches", lambda into: contextlib.nullcontext(into))
    from impls.triton import launcher

    monkeypatch.setattr(launcher, "launch", lambda *a, **k: None)
    with pytest.raises(RuntimeError, match="launched nothing"):
        se.stage_launches("chunk_cumsum", "bfloat16")
