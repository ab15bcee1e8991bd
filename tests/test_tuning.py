"""impls.tuning's modes on a scratch record directory: which source runs, when a search is called and stored."""

from __future__ import annotations

import pytest

from impls import tuning

GPU = "Test GPU"


@pytest.fixture(autouse=True)
def scratch_records(tmp_path, monkeypatch):
    monkeypatch.setenv("SSD_TUNING_DIR", str(tmp_path))


def _search_counting(calls: list):
    def search():
        calls.append(1)
        return {"block": 64}, {"search_space": [{"block": 32}, {"block": 64}], "versions": {"x": "1"}}
    return search


@pytest.mark.parametrize("mode, expect_source, expect_searches", [
    pytest.param("auto", "fallback", 0, id="auto-without-record-falls-back"),
    pytest.param("fallback", "fallback", 0, id="fallback"),
    pytest.param("search", "search", 1, id="search"),
    pytest.param("resume", "search", 1, id="resume-without-record-searches"),
])
def test_modes_without_a_record(mode, expect_source, expect_searches):
    calls = []
    config, source = tuning.resolve(mode, "b", "s", GPU, "k", {"block": 16}, _search_counting(calls))
    assert source == expect_source and len(calls) == expect_searches
    assert config == ({"block": 16} if source == "fallback" else {"block": 64})
    assert (tuning.lookup("b", "s", GPU, "k") is not None) == (expect_searches == 1)


def test_record_mode_without_a_record_raises_naming_the_file():
    with pytest.raises(ValueError, match="no record for b/s"):
        tuning.resolve("record", "b", "s", GPU, "k", {"block": 16})


@pytest.mark.parametrize("mode, expect_source, expect_searches", [
    pytest.param("auto", "record", 0, id="auto"),
    pytest.param("record", "record", 0, id="record"),
    pytest.param("resume", "record", 0, id="resume-reuses-the-record"),
    pytest.param("search", "search", 1, id="search-searches-again"),
    pytest.param("fallback", "fallback", 0, id="fallback-ignores-it"),
])
def test_modes_with_a_record(mode, expect_source, expect_searches):
    tuning.store("b", "s", GPU, "k", {"block": 128}, [], {})
    calls = []
    config, source = tuning.resolve(mode, "b", "s", GPU, "k", {"block": 16}, _search_counting(calls))
    assert source == expect_source and len(calls) == expect_searches
    assert config == {"record": {"block": 128}, "search": {"block": 64}, "fallback": {"block": 16}}[source]


def test_unknown_mode_names_the_choices():
    with pytest.raises(ValueError, match="tuning: expected one of"):
        tuning.resolve("sometimes", "b", "s", GPU, "k", {})


# --- cuTile's record keys ---------------------------------------------------------------------------------------
BASE = "S|bfloat16|cb_precision=tf32|operand_swap=False|transposed_layout=True"


@pytest.mark.parametrize("stage, switches, expect", [
    pytest.param("compute_out", {}, BASE, id="defaults-keep-the-stored-keys"),
    pytest.param("compute_out", {"decay_factor": True}, BASE.replace("|operand", "|decay_factor=True|operand"),
                 id="decay_factor"),
    pytest.param("compute_out", {"heads_per_tile": 2},
                 "S|bfloat16|cb_precision=tf32|heads_per_tile=2|operand_swap=False|transposed_layout=True",
                 id="two-heads-fixed"),
    pytest.param("compute_out", {"head_mma": "batched"},
                 "S|bfloat16|cb_precision=tf32|head_mma=batched|operand_swap=False|transposed_layout=True",
                 id="batched-lowering-searches-apart"),
    pytest.param("compute_out", {"head_mma": "batched", "heads_per_tile": 1},
                 BASE.replace("cb_precision=tf32|", "cb_precision=tf32|heads_per_tile=1|"),
                 id="one-head-either-lowering-is-the-same-kernel"),
    pytest.param("compute_out", {"block_rows": 32},
                 BASE.replace("cb_precision=tf32|", "block_rows=32|cb_precision=tf32|"),
                 id="fixed-size-switch"),
    pytest.param("chunk_cumsum", {"decay_factor": True, "block_rows": 32}, BASE, id="switches-the-stage-does-not-read"),
    pytest.param("compute_out", {"cb_mode": "inline"}, BASE.replace("|transposed", "|shared_cb=False|transposed"),
                 id="cb_mode-fixed"),
    pytest.param("fwd_pass_state", {"tma": False}, BASE.replace("|transposed", "|tma=False|transposed"),
                 id="code-trick-off"),
])
def test_cutile_record_key(stage, switches, expect):
    """A search with a switch that changes the winner stores under a key of its own, never over the full search's
    record; the defaults keep the keys the committed records were stored under."""
    from impls.cutile.switches import CutileSwitches
    from impls.cutile.tune import record_key

    assert record_key(stage, CutileSwitches(**switches), "S", "bfloat16") == expect


@pytest.mark.parametrize("switches, heads_per_group, expect", [
    pytest.param({}, 80, [1, 2], id="default"),
    pytest.param({}, 1, [1], id="one-head-per-group"),
    pytest.param({}, 3, [1], id="odd-heads-per-group"),
    pytest.param({"operand_swap": True}, 80, [1], id="per-head-not-built-with-swap"),
    pytest.param({"operand_swap": True, "head_mma": "batched"}, 80, [1, 2], id="batched-with-swap"),
])
def test_cutile_search_space_heads(switches, heads_per_group, expect):
    """The searched head blocks are those the problem and the switches can take; the rest of the space is kept."""
    from impls.cutile.switches import CutileSwitches
    from impls.cutile.tune import SPACE, configs, search_space

    space = search_space("compute_out", CutileSwitches(**switches), heads_per_group)
    assert space["heads_per_tile"] == expect
    assert {k: v for k, v in space.items() if k != "heads_per_tile"} == {
        k: v for k, v in SPACE["compute_out"].items() if k != "heads_per_tile"}
    found = configs("compute_out", CutileSwitches(**switches), heads_per_group)
    assert {c["heads_per_tile"] for c in found} == set(expect)


def test_cutile_confirm_picks_the_fastest_whole_stage():
    """The search's kernel-only ranking is re-timed as whole stages: a config whose extra kernel makes the stage
    slow loses to one the kernel-only search ranked second."""
    from impls.cutile.tune import confirm

    stage_us = {"shared": 789.0, "inline": 530.0}
    runs = []
    timed = confirm([{"cb": "shared"}, {"cb": "inline"}], lambda cfg: runs.append(cfg["cb"]),
                    timer=lambda fn: (fn(), stage_us[runs[-1]] / 1000.0)[1])
    assert [t["config"]["cb"] for t in timed] == ["inline", "shared"]
    assert [t["stage_median_us"] for t in timed] == [530.0, 789.0]
    assert runs.count("shared") == 2 and runs.count("inline") == 2  # one settling call, one timed


@pytest.mark.parametrize("mode, stored_space, expect", [
    pytest.param("resume", "current", "resume", id="resume-current-record"),
    pytest.param("resume", "older", "search", id="resume-record-of-an-older-space-searches"),
    pytest.param("resume", None, "resume", id="resume-without-record"),
    pytest.param("auto", "older", "auto", id="auto-keeps-an-older-record"),
    pytest.param("record", "older", "record", id="record-keeps-an-older-record"),
])
def test_cutile_resume_searches_a_record_of_another_space(mode, stored_space, expect):
    from impls.cutile.switches import CutileSwitches
    from impls.cutile.tune import resume_mode, search_space

    space = search_space("compute_out", CutileSwitches(), 80)
    older = {k: v for k, v in space.items() if k != "heads_per_tile"}
    if stored_space is not None:
        tuning.store("cutile", "compute_out", GPU, "k", {"block_rows": 64},
                     space if stored_space == "current" else older, {})
    assert resume_mode(mode, "compute_out", GPU, "k", space) == expect


def test_cutile_confirm_candidates_include_each_cb_arrangement():
    """The kernel-only ranking favours the shared C·Bᵀ (its kernel is not timed): the best inline config is
    confirmed too even when the top CONFIRM_TOP are all shared."""
    from impls.cutile.tune import CONFIRM_TOP, confirm_candidates

    ranked = [{"occupancy": i, "shared_cb": True} for i in range(CONFIRM_TOP + 1)] + [
        {"occupancy": 9, "shared_cb": False}, {"occupancy": 8, "shared_cb": False}]
    picked = confirm_candidates(ranked)
    assert picked == ranked[:CONFIRM_TOP] + [{"occupancy": 9, "shared_cb": False}]
    assert confirm_candidates(ranked[-2:]) == ranked[-2:]  # fewer than CONFIRM_TOP: all of them


def test_cutile_resume_searches_an_unconfirmed_record():
    from impls.cutile.switches import CutileSwitches
    from impls.cutile.tune import resume_mode, search_space

    space = search_space("compute_out", CutileSwitches(), 80)
    tuning.store("cutile", "compute_out", GPU, "k", {"block_rows": 64}, space, {})
    assert resume_mode("resume", "compute_out", GPU, "k", space, confirms=True) == "search"
    assert resume_mode("resume", "compute_out", GPU, "k", space, confirms=False) == "resume"
    tuning.store("cutile", "compute_out", GPU, "k", {"block_rows": 64}, space, {},
                 confirmed=[{"config": {"block_rows": 64}, "stage_median_us": 1.0}])
    assert resume_mode("resume", "compute_out", GPU, "k", space, confirms=True) == "resume"


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the CPU path of resolve (gpu name 'cpu')")
def test_cutile_trick_off_borrows_the_default_codes_record():
    """auto with a code trick off and no record of its own: the default code's record (same tiles as the default
    point of an ablation); a record of its own wins when there is one."""
    from impls.cutile import tune
    from impls.cutile.switches import CutileSwitches

    sw = CutileSwitches(tma=False)
    key, base = (tune.record_key("chunk_cumsum", sw, "S", "bfloat16", code_tricks=t) for t in (True, False))
    assert key != base
    tuning.store("cutile", "chunk_cumsum", "cpu", base, {"block_heads": 16, "occupancy": 8}, {}, {})
    assert tune.resolve("chunk_cumsum", sw, None, key, None, base_key=base) == (
        {"block_heads": 16, "occupancy": 8}, "record")
    tuning.store("cutile", "chunk_cumsum", "cpu", key, {"block_heads": 4, "occupancy": 4}, {}, {})
    assert tune.resolve("chunk_cumsum", sw, None, key, None, base_key=base)[0] == {"block_heads": 4, "occupancy": 4}
