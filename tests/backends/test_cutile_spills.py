"""CPU tests of instruments/cutile/spills.py: spills, registers and stack of the tuned cuTile kernels, read from the
sm_90 SASS compiled ahead of time at the committed NVIDIA H200 records (one compile, shared by the tests)."""

from __future__ import annotations

import functools

import pytest

pytest.importorskip("cuda.tile")

from instruments.assignments import parse_assignments  # noqa: E402
from instruments.cutile import spills  # noqa: E402
from instruments.sass import count_spills, cuobjdump_path  # noqa: E402

pytestmark = pytest.mark.skipif(cuobjdump_path() is None, reason="cuobjdump not installed")


@functools.cache
def s1_compute_out() -> spills.KernelSpills:
    return spills.kernel_spills("compute_out", "S1")


def test_counts_are_read_from_the_tuned_s1_compute_out():
    row = s1_compute_out()
    assert row.config == spills.tuned_config("compute_out", "S1")
    for value in (row.ldl, row.stl, row.registers, row.stack_bytes):
        assert isinstance(value, int) and value >= 0
    assert row.registers > 0
    assert "S1    compute_out" in spills.format_table([row])


@pytest.mark.xfail(strict=True, reason="the tuned S1 compute_out spills on sm_90 today (18 LDL, 13 STL, 56 bytes "
                   "of stack, 80 registers, cuda-tile 1.7): remove this mark once the default compiles without "
                   "spills")
def test_tuned_s1_compute_out_does_not_spill():
    row = s1_compute_out()
    assert (row.ldl, row.stl) == (0, 0)


def test_spill_instructions_are_counted_with_their_widths():
    text = """
        /*0100*/                   STL.64 [R1+0x8], R4 ;
        /*0110*/                   LDL.LU R2, [R1+0x4] ;
        /*0120*/              @!P0 LDL.128 R8, [R1+0x10] ;
        /*0130*/                   LDG.E R6, desc[UR4][R2.64] ;
    """
    assert count_spills(text) == (2, 1)


def test_a_shape_without_a_record_is_named():
    with pytest.raises(LookupError, match=r"no record for tiny .*cutile_compute_out\.json"):
        spills.tuned_config("compute_out", "tiny")
    [(shape, stage, reason)] = spills.report(["tiny"], ["compute_out"])  # no compile: the reason is the row
    assert (shape, stage) == ("tiny", "compute_out") and reason.startswith("no record for tiny")
    assert "no record for tiny" in spills.format_table(spills.report(["tiny"], ["compute_out"]))


def test_a_shared_cb_record_reports_the_cb_kernel_too():
    assert spills.kernels_of("compute_out", {"shared_cb": True}) == ("compute_out", "compute_out_cb")
    assert spills.kernels_of("compute_out", {"shared_cb": False}) == ("compute_out",)
    assert spills.kernels_of("fused", {}) == ("fused",)


def test_assignments_are_parsed_with_their_types():
    assert parse_assignments(["heads_per_tile=2", "skip_first=True", "head_mma=batched"], "--set") == {
        "heads_per_tile": 2, "skip_first": True, "head_mma": "batched"}
    with pytest.raises(ValueError, match="--switch: 'skip_first' is not name=value"):
        parse_assignments(["skip_first"], "--switch")


def test_report_compiles_a_candidate_config_and_switches():
    from impls.cutile.switches import CutileSwitches

    (row,) = spills.report(("S1",), ("compute_out",), overrides={"block_headdim": 32},
                           switches=CutileSwitches(skip_first=True))
    assert row.config == dict(spills.tuned_config("compute_out", "S1"), block_headdim=32)
    assert row.registers > 0 and row.ldl >= 0 and row.stl >= 0


def test_chunk_parallel_stage_2_kernels_do_not_spill_at_s1():
    """state_pass='chunk_parallel': the local-state kernel and the pass kernel at the S1 record's tiles (the default
    arrangement's: no record of their own yet) compile without local-memory traffic (cuda-tile 1.7, sm_90)."""
    from impls.cutile.switches import CutileSwitches

    rows = spills.report(["S1"], ["fwd_pass_state"], switches=CutileSwitches(state_pass="chunk_parallel"))
    assert [row.kernel for row in rows] == ["fwd_pass_state_local", "fwd_pass_state_pass"]
    assert all((row.ldl, row.stl, row.stack_bytes) == (0, 0, 0) for row in rows), spills.format_table(rows)


def test_switches_with_a_record_of_their_own_read_it_and_others_borrow():
    """As the launcher resolves records (impls/tuning.py): version 13's switches have their own S1 record (two heads
    with C·Bᵀ shared, searched under them), heads_first alone borrows the record of the key without it."""
    from impls import tuning
    from impls.cli import load_shape
    from impls.cutile import tune
    from impls.cutile.switches import CutileSwitches

    v13 = CutileSwitches(heads_first=True, skip_first=True, pdl=True)
    label = load_shape("S1").label()
    own = tuning.lookup("cutile", "compute_out", spills.GPU, tune.record_key("compute_out", v13, label, "bfloat16"))
    assert own is not None
    assert spills.tuned_config("compute_out", "S1", switches=v13) == own["config"]
    assert own["config"] != spills.tuned_config("compute_out", "S1")  # a test of the lookup, not of equal records
    borrowed = spills.tuned_config("compute_out", "S1", switches=CutileSwitches(heads_first=True))
    assert borrowed == spills.tuned_config("compute_out", "S1")
    # decay_factor keys its own record and heads_first borrows it: the borrowed key, not the default switches' one
    decay = CutileSwitches(decay_factor=True)
    base = tuning.lookup("cutile", "compute_out", spills.GPU, tune.record_key("compute_out", decay, label, "bfloat16"))
    assert base is not None and base["config"] != spills.tuned_config("compute_out", "S1")
    assert spills.tuned_config("compute_out", "S1", switches=CutileSwitches(decay_factor=True, heads_first=True)) \
        == base["config"]
