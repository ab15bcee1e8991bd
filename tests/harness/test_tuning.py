"""impls.tuning's protocol on a scratch record directory, with fake timers: which source runs, when a search runs,
what it stores, how it resumes, when a record is bound to another stack; and the cuTile and Triton declarations."""

from __future__ import annotations

import dataclasses
import io
import json

import pytest

from impls import tuning

GPU = "Test GPU"
STACK = {"cuda-tile": "1.7.0", "driver": "580"}
SPACE = {"block": [32, 64, 128]}
CONFIGS = [{"block": b} for b in SPACE["block"]]
KERNEL_US = {32: 30.0, 64: 10.0, 128: 20.0}  # what the fake kernel-only timer says
REAL_STACK_VERSIONS = tuning.stack_versions


@pytest.fixture(autouse=True)
def scratch_records(tmp_path, monkeypatch):
    monkeypatch.setenv("SSD_TUNING_DIR", str(tmp_path))
    monkeypatch.setattr(tuning, "stack_versions", lambda names: {n: STACK.get(n) for n in names})


class Fake:
    """A backend's stage: a kernel-only timer and a whole-stage run, counting what was timed."""

    def __init__(self, stage_ms=None):
        self.timed, self.runs = [], []
        self.stage_ms = stage_ms or {32: 0.031, 64: 0.05, 128: 0.021}

    def timer(self, cfg):
        self.timed.append(cfg["block"])
        return KERNEL_US[cfg["block"]]

    def run(self, cfg):
        self.runs.append(cfg["block"])

    def stage_timer(self, fn):
        fn()
        return self.stage_ms[self.runs[-1]]


def _tunable(mode="auto", fake=None, **kw) -> tuning.Tunable:
    fake = fake or Fake()
    args = dict(backend="b", stage="s", key="k", gpu=GPU, mode=mode, fallback={"block": 16}, space=SPACE,
                configs=list(CONFIGS), timer=fake.timer, run=fake.run, stage_timer=fake.stage_timer,
                stack=("cuda-tile", "driver"))
    return tuning.Tunable(**{**args, **kw})


def _store(config=None, versions=None, **extra):
    extra.setdefault("confirmed", [{"config": config or {"block": 128}, "stage_median_us": 1.0}])
    tuning.store("b", "s", GPU, "k", config or {"block": 128}, SPACE, STACK if versions is None else versions,
                 **extra)


# --- modes ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode, expect_source, searches", [
    pytest.param("auto", "fallback", False, id="auto-without-record-falls-back"),
    pytest.param("fallback", "fallback", False, id="fallback"),
    pytest.param("search", "search", True, id="search"),
    pytest.param("resume", "search", True, id="resume-without-record-searches"),
])
def test_modes_without_a_record(mode, expect_source, searches):
    fake = Fake()
    res = tuning.resolve(_tunable(mode, fake))
    assert res.source == expect_source and bool(fake.timed) == searches
    assert (tuning.lookup("b", "s", GPU, "k") is not None) == searches
    if res.source == "fallback":
        assert res.config == {"block": 16}
    if mode == "auto":
        assert res.reason == "no record"


def test_record_mode_without_a_record_raises_naming_the_file():
    with pytest.raises(ValueError, match="no usable record for b/s key 'k' in .*b_s.json: no record"):
        tuning.resolve(_tunable("record"))


@pytest.mark.parametrize("mode, expect_source, searches", [
    pytest.param("auto", "record", False, id="auto"),
    pytest.param("record", "record", False, id="record"),
    pytest.param("resume", "record", False, id="resume-reuses-the-record"),
    pytest.param("search", "search", True, id="search-searches-again"),
    pytest.param("fallback", "fallback", False, id="fallback-ignores-it"),
])
def test_modes_with_a_record(mode, expect_source, searches):
    _store({"block": 64})
    fake = Fake()
    res = tuning.resolve(_tunable(mode, fake))
    assert res.source == expect_source and bool(fake.timed) == searches
    assert res.config == {"record": {"block": 64}, "search": {"block": 128}, "fallback": {"block": 16}}[res.source]


def test_unknown_mode_names_the_choices():
    with pytest.raises(ValueError, match="tuning: expected one of"):
        tuning.resolve(_tunable("sometimes"))


def test_pins_win_and_all_pinned_is_switches():
    _store({"block": 64, "warps": 4})
    assert tuning.resolve(_tunable(pins={"warps": 8})).config == {"block": 64, "warps": 8}
    res = tuning.resolve(_tunable(pins={"block": 32}, pinned_all=True))
    assert (res.config, res.source) == ({"block": 32}, "switches")


# --- the search ---------------------------------------------------------------------------------------------------
def test_search_times_every_config_then_confirms_the_best_as_whole_stages():
    """The kernel-only ranking (64 < 128 < 32) is re-timed as whole stages: 128 is the fastest stage and wins; the
    record keeps every measurement, the confirmation, the space's hash and the versions."""
    fake = Fake()
    res = tuning.resolve(_tunable("search", fake))
    assert res.config == {"block": 128} and fake.timed == [32, 64, 128]
    record = tuning.lookup("b", "s", GPU, "k")
    assert [c["config"]["block"] for c in record["confirmed"]] == [128, 32, 64]
    assert [m["us"] for m in record["measurements"]] == [30.0, 10.0, 20.0]
    assert record["space_hash"] == tuning.space_hash(SPACE) and record["versions"]["cuda-tile"] == "1.7.0"
    assert record["search_us"] == 20.0 and record["search_space"] == SPACE
    assert not tuning.partial_path("b", "s", GPU).exists()


def test_confirmation_takes_confirm_top_plus_the_backends_extras():
    ranked = [{"block": b} for b in range(tuning.CONFIRM_TOP + 3)]
    assert tuning.confirm_candidates(ranked) == ranked[:tuning.CONFIRM_TOP]
    extra = tuning.confirm_candidates(ranked, lambda r: [r[-1], r[0]])
    assert extra == ranked[:tuning.CONFIRM_TOP] + [ranked[-1]]


def test_without_a_kernel_timer_the_whole_stage_is_timed():
    fake = Fake()
    res = tuning.resolve(_tunable("search", fake, timer=None))
    assert res.config == {"block": 128}
    assert tuning.lookup("b", "s", GPU, "k")["measurements"][2]["us"] == 21.0


def test_failing_configs_are_recorded_and_the_rest_searched():
    fake = Fake()

    def timer(cfg):
        if cfg["block"] == 64:
            raise RuntimeError("out of shared memory")
        return fake.timer(cfg)

    tuning.resolve(_tunable("search", fake, timer=timer))
    record = tuning.lookup("b", "s", GPU, "k")
    assert record["failures"] == [{"config": {"block": 64}, "error": "RuntimeError: out of shared memory"}]
    assert {m["config"]["block"] for m in record["measurements"]} == {32, 128}


def test_a_config_that_writes_nan_cannot_win_the_search():
    """The fastest config (64 by the kernel timer) returns NaN rows from the whole stage (a miscompile): it is
    recorded as a failure, the search picks among the others."""
    import torch

    class NanAt64(Fake):
        def run(self, cfg):
            super().run(cfg)
            y = torch.ones(4, 8)
            if cfg["block"] == 64:
                y[1] = float("nan")
            return (torch.zeros(2), {"y": [y]})

    fake = NanAt64()
    res = tuning.resolve(_tunable("search", fake))
    record = tuning.lookup("b", "s", GPU, "k")
    assert [f["config"] for f in record["failures"]] == [{"block": 64}]
    assert "ArithmeticError: non-finite values in the stage's output, shape (4, 8)" in record["failures"][0]["error"]
    assert res.config == {"block": 128} and {m["config"]["block"] for m in record["measurements"]} == {32, 128}


def test_without_a_whole_stage_run_the_outputs_are_asked_for_nan():
    """A stage whose search confirms nothing (run None) hands its outputs to the guard through Tunable.output."""
    import torch

    fake = Fake()
    res = tuning.resolve(_tunable("search", fake, run=None, stage_timer=None,
                                  output=lambda cfg: torch.full((2,), float("inf") if cfg["block"] == 64 else 1.0)))
    record = tuning.lookup("b", "s", GPU, "k")
    assert [f["config"] for f in record["failures"]] == [{"block": 64}] and res.config != {"block": 64}


def test_where_both_are_given_the_guard_reads_output_not_run():
    """A stage whose buffers are written in part by design hands the guard only what it writes (Tunable.output):
    NaN in run's unwritten elements passes, NaN in output's fails the config."""
    import torch

    fake = Fake()
    run_nan = lambda cfg: (fake.run(cfg), torch.full((2,), float("nan")))[1]  # noqa: E731
    res = tuning.resolve(_tunable("search", fake, run=run_nan,
                                  output=lambda cfg: torch.full((2,), float("nan") if cfg["block"] == 64 else 1.0)))
    record = tuning.lookup("b", "s", GPU, "k")
    assert [f["config"] for f in record["failures"]] == [{"block": 64}] and res.config == {"block": 128}


@pytest.mark.parametrize("stage", ["bwd_chunk", "bwd_dcb", "bwd_state_pass"])
def test_the_backward_stages_written_elements_hide_only_what_the_kernels_leave_unwritten(stage):
    """impls.chunked_backward.written_elements at seqlen 70 in chunks of 32 (the last chunk 6 long), 2 source tiles
    of 16: NaN where the kernels write nothing is zeroed; NaN in any element they write stays, so a miscompiled
    config is still refused; every other output (dx, dD, dC, the state pass's R) is read whole. The entering-state
    terms (switch bwd_entry_term: the dcb kernel's, the state pass's partials) past the sequence are not read."""
    import torch

    from impls.chunked_backward import written_elements

    nan = float("nan")
    if stage == "bwd_chunk":
        per_position = torch.ones(1, 2, 3, 32)  # (batch, nheads, nchunks, chunk): ddt and dl
        row = torch.ones(1, 2, 3, 2, 32)
        row[..., 1, :16] = nan  # the second source tile's rows before its start
        row[:, :, 2, :, 6:] = nan  # past the short last chunk
        per_position[:, :, 2, 6:] = nan
        outputs = (torch.ones(1, 70, 2, 4), None, per_position.clone(), per_position.clone(), row, torch.ones(2))
        # the first written row of tile 1, the short chunk's last position, dx, dD
        planted = [(4, (0, 0, 0, 1, 16)), (2, (0, 1, 2, 5)), (0, (0, 69, 1, 3)), (5, (1,))]
    elif stage == "bwd_dcb":
        dG = torch.ones(1, 3, 2, 32, 32)  # (batch, nchunks, groups, row l, source s)
        dG[..., 3, 4] = nan  # above the diagonal
        dG[:, 2, :, 6:, :] = nan  # rows past the short last chunk
        terms = torch.ones(1, 2, 3, 1, 32)  # (batch, nheads, nchunks, 1, chunk)
        terms[:, :, 2, :, 6:] = nan
        outputs = (torch.ones(1, 70, 2, 8), dG, terms)
        planted = [(1, (0, 1, 0, 4, 3)), (1, (0, 2, 1, 5, 5)), (0, (0, 0, 1, 7)), (2, (0, 1, 2, 0, 5))]
    else:
        terms = torch.ones(1, 2, 3, 4, 32)  # (batch, nheads, nchunks, state tiles, chunk)
        terms[:, :, 2, :, 6:] = nan
        outputs = (torch.ones(1, 3, 2, 4, 8), torch.ones(1, 2, 3, 4), None, terms)
        planted = [(3, (0, 0, 2, 3, 5)), (0, (0, 2, 1, 3, 7)), (1, (0, 1, 2, 3))]
    written = written_elements(stage, outputs, seqlen=70, padding_read=False)
    assert all(bool(torch.isfinite(t).all()) for t in written if isinstance(t, torch.Tensor))
    for index, at in planted:
        outputs[index][at] = nan
        got = written_elements(stage, outputs, seqlen=70, padding_read=False)[index]
        assert not bool(torch.isfinite(got).all()), (index, at)
        outputs[index][at] = 1.0
    if stage == "bwd_chunk":  # where the cumsum reads the short chunk's padding (our Triton), it is checked too
        read = written_elements(stage, outputs, seqlen=70, padding_read=True)
        assert not bool(torch.isfinite(read[2]).all()) and not bool(torch.isfinite(read[3]).all())
        assert bool(torch.isfinite(read[4]).all())  # the row partials' padding is masked by every consumer


def test_nothing_runs_raises_with_the_first_failure():
    def timer(cfg):
        raise RuntimeError("no kernel")

    with pytest.raises(RuntimeError, match="no config of the search space ran.*no kernel"):
        tuning.resolve(_tunable("search", timer=timer))


def test_resume_continues_an_interrupted_search_config_by_config():
    """A search stopped after two configs (a time limit) leaves them in the partial file; `resume` in a new
    process times only the third; `search` starts again from scratch."""
    first = Fake()

    def interrupted(cfg):
        if len(first.timed) == 2:
            raise KeyboardInterrupt
        return first.timer(cfg)

    with pytest.raises(KeyboardInterrupt):
        tuning.resolve(_tunable("resume", first, timer=interrupted))
    assert tuning.lookup("b", "s", GPU, "k") is None
    partial = json.loads(tuning.partial_path("b", "s", GPU).read_text())["k"]
    assert [m["config"]["block"] for m in partial["measurements"]] == [32, 64]
    second = Fake()
    assert tuning.resolve(_tunable("resume", second)).config == {"block": 128}
    assert second.timed == [128]
    assert len(tuning.lookup("b", "s", GPU, "k")["measurements"]) == 3


def test_resume_ignores_partial_progress_of_another_stack(monkeypatch):
    first = Fake()

    def interrupted(cfg):
        if first.timed:
            raise KeyboardInterrupt
        return first.timer(cfg)

    with pytest.raises(KeyboardInterrupt):
        tuning.resolve(_tunable("resume", first, timer=interrupted))
    monkeypatch.setattr(tuning, "stack_versions", lambda names: {n: "2.0" for n in names})
    second = Fake()
    tuning.resolve(_tunable("resume", second))
    assert second.timed == [32, 64, 128]


@pytest.mark.parametrize("stored, expect_search", [
    pytest.param({}, False, id="current-record"),
    pytest.param({"space": {"block": [32, 64]}}, True, id="older-space"),
    pytest.param({"confirmed": []}, True, id="never-confirmed"),
    pytest.param({"versions": {"cuda-tile": "1.6.0", "driver": "580"}}, True, id="another-stack"),
])
def test_resume_searches_again_when_the_record_is_stale(stored, expect_search):
    tuning.store("b", "s", GPU, "k", {"block": 32}, stored.get("space", SPACE), stored.get("versions", STACK),
                 confirmed=stored.get("confirmed", [{"config": {"block": 32}}]))
    fake = Fake()
    res = tuning.resolve(_tunable("resume", fake))
    assert (res.source == "search") == expect_search and bool(fake.timed) == expect_search
    if expect_search:
        assert res.reason


def test_resume_without_confirmation_keeps_an_unconfirmed_record():
    """A backend that does not confirm (no whole-stage run) does not search again for want of a confirmation."""
    tuning.store("b", "s", GPU, "k", {"block": 32}, SPACE, STACK)
    assert tuning.resolve(_tunable("resume", run=None)).source == "record"


# --- records bound to the stack -------------------------------------------------------------------------------------
def test_auto_falls_back_from_a_record_of_another_stack_and_says_why():
    _store({"block": 64}, versions={"cuda-tile": "1.6.0", "driver": "580"})
    res = tuning.resolve(_tunable("auto"))
    assert (res.config, res.source) == ({"block": 16}, "fallback")
    assert res.as_dict()["reason"] == "searched on another stack: cuda-tile 1.6.0 in the record, 1.7.0 today"
    with pytest.raises(ValueError, match="cuda-tile 1.6.0 in the record"):
        tuning.resolve(_tunable("record"))


def test_a_record_missing_a_version_is_another_stack_unless_flagged_unverified():
    _store({"block": 64}, versions={"cuda-tile": "1.7.0"})
    assert "no driver version" in tuning.resolve(_tunable("auto")).reason
    _store({"block": 64}, versions={"cuda-tile": "1.7.0"}, versions_unverified=True)
    res = tuning.resolve(_tunable("auto"))
    assert res.source == "record" and res.as_dict()["versions_unverified"] is True


def test_an_unverified_record_still_checks_the_versions_it_has():
    _store({"block": 64}, versions={"cuda-tile": "1.6.0"}, versions_unverified=True)
    assert tuning.resolve(_tunable("auto")).source == "fallback"


def test_base_key_is_borrowed_in_auto_and_record_only():
    tuning.store("b", "s", GPU, "base", {"block": 64}, SPACE, STACK)
    res = tuning.resolve(_tunable("auto", base_key="base"))
    assert (res.config, res.source, res.key) == ({"block": 64}, "record", "base") and "borrowed" in res.reason
    assert tuning.resolve(_tunable("resume", base_key="base")).source == "search"
    assert tuning.resolve(_tunable("auto", base_key="base")).key == "k"  # its own record now


# --- the tile protocol: whose tiles ran, against the baseline switch set's ------------------------------------------
def test_tile_protocol_says_whose_tiles_ran():
    """No record: fallback; the base key's record borrowed (a trick turned off): pinned; the same record as the
    same-SASS key (the stage's code is the baseline's): same-sass; a record of its own: retuned. describe() reads it
    through as_dict."""
    assert tuning.resolve(_tunable("auto", base_key="base")).protocol == tuning.FALLBACK
    tuning.store("b", "s", GPU, "base", {"block": 64}, SPACE, STACK)
    res = tuning.resolve(_tunable("auto", base_key="base"))
    assert (res.key, res.protocol, res.as_dict()["tile_protocol"]) == ("base", "pinned", "pinned")
    res = tuning.resolve(_tunable("record", base_key="base", same_sass_key="base"))
    assert (res.key, res.protocol) == ("base", "same-sass") and "code" in res.reason
    _store({"block": 32})
    assert tuning.resolve(_tunable("auto", base_key="base", same_sass_key="base")).protocol == "retuned"
    assert tuning.resolve(_tunable("fallback")).protocol == "fallback"
    assert tuning.resolve(_tunable(pins={"block": 64}, pinned_all=True)).protocol == "switches"


def test_a_search_narrower_than_declared_or_than_the_baseline_s_is_retuned_narrower():
    """An own record searched over fewer values than the stage declares today, or than the baseline switch set
    declares, is not `retuned`: the gap is named."""
    tuning.store("b", "s", GPU, "k", {"block": 64}, {"block": [64, 128]}, STACK)
    res = tuning.resolve(_tunable("auto"))
    assert res.protocol == "retuned-narrower" and "block lacks [32]" in res.reason
    res = tuning.resolve(_tunable("search", baseline_space={"block": [16, 32, 64, 128]}))
    assert res.protocol == "retuned-narrower" and "block lacks the baseline's [16]" in res.reason
    assert tuning.resolve(_tunable("auto", baseline_space=SPACE)).protocol == "retuned"  # the search just stored
    assert tuning.space_gaps([{"B": 1}], [{"B": 1}, {"B": 2}]) == ["1 of 2 declared configs"]  # TileGym's layout


def _cutile_stage(stage, arch="sm_90", monkeypatch=None, **switches):
    from impls.cutile import tune
    from impls.cutile.switches import CutileSwitches

    monkeypatch.setattr(tune, "device_arch", lambda device: arch)
    return tune.tunable(stage, CutileSwitches(**switches), None, "S", "bfloat16", make_call=None, heads_per_group=80)


@pytest.mark.parametrize("stage, switches, arch, expect", [
    pytest.param("chunk_cumsum", {"tma": False}, "sm_90", "same-sass", id="tma-off-chunk_cumsum-same-sass"),
    pytest.param("chunk_cumsum", {"transposed_layout": False}, "sm_90", "same-sass", id="layout-chunk_cumsum"),
    pytest.param("chunk_cumsum", {"tma": False}, "sm_100", "pinned", id="tma-off-off-sm_90-pinned"),
    pytest.param("compute_out", {"tma": False}, "sm_90", "pinned", id="tma-off-compute_out-pinned"),
    pytest.param("compute_out", {"head_mma": "batched"}, "sm_90", "fallback", id="head_mma-one-config-row"),
    pytest.param("chunk_cumsum", {"heads_first": True}, None, "same-sass", id="not-in-the-stage-key"),
    pytest.param("chunk_cumsum", {"tma": False, "exp2": False}, "sm_90", "pinned", id="two-switches-pinned"),
])
def test_cutile_protocol_from_the_switch_effects(monkeypatch, stage, switches, arch, expect):
    """cuTile with the defaults' record only: a switch whose sm_90 SASS for the stage is the defaults'
    (impls/cutile/switch_sass_effects.json) runs the defaults' record as same-sass, one that changes it borrows the
    record of the key without the trick (pinned); off sm_90 the SASS table says nothing; head_mma's row compiles one
    head per tile only (no borrowing: its own search, else the fallback); a switch outside the stage's key is the
    same code by the key."""
    from impls.cutile import tune
    from impls.cutile.switches import CutileSwitches

    defaults = _cutile_stage(stage, "sm_90", monkeypatch)
    stack = {n: STACK.get(n) for n in tune.STACK}
    config = {"chunk_cumsum": {"block_heads": 16, "occupancy": 8},
              "compute_out": {"block_rows": 64, "block_headdim": 64, "heads_per_tile": 2, "occupancy": 3}}[stage]
    tuning.store("cutile", stage, defaults.gpu, defaults.key, config, defaults.space, stack)
    t = _cutile_stage(stage, arch, monkeypatch, **switches)
    res = tuning.resolve(t)
    assert res.protocol == expect, res.reason
    if expect == "same-sass":
        assert t.same_sass_key == tune.record_key(stage, CutileSwitches(), "S", "bfloat16") and res.config == config


@pytest.mark.parametrize("stage, switches, expect_same", [
    pytest.param("chunk_cumsum", {"transposed_layout": False}, True, id="layout-same-launches"),
    pytest.param("chunk_state", {"heads_first": True}, True, id="heads_first-stage-2"),
    pytest.param("compute_out", {"transposed_layout": False}, False, id="layout-changes-compute_out"),
    pytest.param("chunk_cumsum", {"launch_path": "cached"}, False, id="host-path-alone-is-the-defaults"),
    pytest.param("chunk_cumsum", {"transposed_layout": False, "exp2": False}, False, id="two-switches"),
    pytest.param("chunk_cumsum", {"transposed_layout": False, "launch_path": "cached"}, True, id="host-path-aside"),
])
def test_triton_same_sass_key_from_the_switch_effects(stage, switches, expect_same):
    """Triton: the defaults' key where impls/triton/switch_launch_effects.json records the same launches for the stage
    (stage 2's kernels read its fwd_pass_state rows) or where the stage's key is the defaults'; None otherwise, and
    for the defaults themselves (the host path aside: their own record is retuned, not borrowed)."""
    from impls.triton import tune
    from impls.triton.switches import TritonSwitches

    flags = {"bias": True}
    key = tune.same_sass_key(TritonSwitches(**switches), "S", "bfloat16", flags, stage)
    assert key == (tune.record_key(TritonSwitches(), "S", "bfloat16", flags, stage) if expect_same else None)


def test_own_search_is_stored_with_the_stack():
    """A backend with its own autotuner (TileGym): what it chose is stored with the versions; `auto` reads it."""
    chosen = []
    space = [{"BLOCK": 1}, {"BLOCK": 8}]  # TileGym's: its own configs
    tunable = _tunable("search", own_search=lambda: chosen.append(1) or {"BLOCK": 8}, run=None, timer=None,
                       space=space)
    assert tuning.resolve(tunable).config == {"BLOCK": 8} and chosen == [1]
    record = tuning.lookup("b", "s", GPU, "k")
    assert record["versions"]["cuda-tile"] == "1.7.0" and "own autotuner" in record["searched_by"]
    assert tuning.resolve(_tunable("resume", own_search=lambda: {"BLOCK": 1}, run=None, space=space)).source == "record"


def test_stack_versions_names_only_known_components():
    with pytest.raises(ValueError, match=r"unknown component\(s\) \['cuda'\]"):
        REAL_STACK_VERSIONS(("cuda",))
    assert set(REAL_STACK_VERSIONS(("triton", "cuda-tile"))) == {"triton", "cuda-tile"}


# --- progress -----------------------------------------------------------------------------------------------------
class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_progress_prints_one_line_per_interval_when_not_a_terminal():
    out, clock = io.StringIO(), Clock()
    progress = tuning.Progress("b/s k", 40, stream=out, clock=clock)
    for done in range(1, 41):
        clock.now += 1.0
        progress.update(done, {"us": 10.0 - done / 10, "config": {"block": done}})
    progress.finish(40, {"us": 6.0, "config": {"block": 40}})
    lines = out.getvalue().splitlines()
    assert len(lines) == 5 and lines[0].startswith("tuning b/s k: 10/40 configs, best 9.0 µs {'block': 10}")
    assert lines[-1] == "tuning b/s k: 40/40 configs, best 6.0 µs {'block': 40}"


def test_progress_prints_every_config_on_a_terminal():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    out = Tty()
    progress = tuning.Progress("b/s k", 3, stream=out, clock=Clock())
    for done in (1, 2, 3):
        progress.update(done, None)
    assert out.getvalue().splitlines() == [f"tuning b/s k: {d}/3 configs, none ran yet" for d in (1, 2, 3)]


# --- cuTile's declarations ---------------------------------------------------------------------------------------
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
    pytest.param("compute_out", {"heads_first": True, "skip_first": True},
                 BASE.replace("|operand", "|heads_first=True|operand").replace("|transposed",
                                                                                "|skip_first=True|transposed"),
                 id="arrangements-on"),
    pytest.param("fwd_pass_state", {"heads_first": True, "skip_first": True}, BASE,
                 id="arrangements-the-stage-does-not-read"),
    pytest.param("compute_out", {"head_loop": 8}, BASE.replace("|operand", "|head_loop=8|operand"), id="head-loop-on"),
    pytest.param("fwd_pass_state", {"head_loop": 8}, BASE, id="head-loop-the-stage-does-not-read"),
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


def test_cutile_candidates_include_each_cb_arrangement():
    """The kernel-only ranking favours the shared C·Bᵀ (its kernel is not timed): the best inline config is
    confirmed too even when the top CONFIRM_TOP are all shared."""
    from impls.cutile.tune import candidates

    ranked = [{"occupancy": i, "shared_cb": True} for i in range(tuning.CONFIRM_TOP + 1)] + [
        {"occupancy": 9, "shared_cb": False}, {"occupancy": 8, "shared_cb": False}]
    picked = tuning.confirm_candidates(ranked, candidates)
    assert picked == ranked[:tuning.CONFIRM_TOP] + [{"occupancy": 9, "shared_cb": False}]
    assert tuning.confirm_candidates(ranked[-2:], candidates) == ranked[-2:]  # fewer than CONFIRM_TOP: all


def _cutile_compute_out(**switches):
    from impls.cutile import tune
    from impls.cutile.switches import CutileSwitches

    return tune.tunable("compute_out", CutileSwitches(**switches), None, "S", "bfloat16", make_call=None,
                        heads_per_group=80, run_config=lambda cfg: None)


def test_cutile_search_with_fake_timers_confirms_the_fastest_stage(capsys):
    """cuTile's search over its declared compute_out space (fixed switches put in), kernel-only timer faked:
    shared_cb is fastest as a kernel, but its stage (with the C·Bᵀ kernel) is slower: the inline config wins."""
    t = _cutile_compute_out(tuning="search", occupancy=3)
    assert all(c["occupancy"] == 3 for c in t.configs) and len(t.configs) == 16  # 2 rows × 2 headdim × 2 heads × 2 C·Bᵀ

    def kernel_us(cfg):
        return 100.0 - 20 * cfg["shared_cb"] - cfg["block_rows"] / 64 - cfg["heads_per_tile"]

    def stage_ms(fn):
        return (0.1 + 0.05 * last[-1]["shared_cb"] - last[-1]["block_rows"] / 64e3)

    last = []
    t.timer, t.run, t.stage_timer = kernel_us, last.append, stage_ms
    res = tuning.resolve(t)
    assert res.source == "search"
    assert res.config == {"block_rows": 128, "block_headdim": 64, "heads_per_tile": 2, "occupancy": 3,
                          "shared_cb": False}
    record = tuning.lookup("cutile", "compute_out", t.gpu, t.key)
    assert len(record["measurements"]) == 16 and len(record["confirmed"]) == tuning.CONFIRM_TOP + 1
    assert record["search_space"]["occupancy"] == [2, 3, 4]  # the declared space, without the fixed values
    assert "16/16 configs" in capsys.readouterr().out


def test_cutile_trick_off_borrows_the_default_codes_record():
    """auto with a code trick off and no record of its own: the default code's record (same tiles as the default
    point of an ablation); a record of its own wins when there is one."""
    from impls.cutile import tune
    from impls.cutile.switches import CutileSwitches

    t = tune.tunable("chunk_cumsum", CutileSwitches(tma=False), None, "S", "bfloat16", make_call=None)
    assert t.key != t.base_key
    stack = {n: STACK.get(n) for n in tune.STACK}
    tuning.store("cutile", "chunk_cumsum", t.gpu, t.base_key, {"block_heads": 16, "occupancy": 8}, {}, stack)
    res = tuning.resolve(t)
    assert (res.config, res.source) == ({"block_heads": 16, "occupancy": 8}, "record")
    tuning.store("cutile", "chunk_cumsum", t.gpu, t.key, {"block_heads": 4, "occupancy": 4}, {}, stack)
    assert tuning.resolve(t).config == {"block_heads": 4, "occupancy": 4}


@pytest.mark.parametrize("switches", [pytest.param({"heads_first": True}, id="heads_first"),
                                      pytest.param({"skip_first": True}, id="skip_first"),
                                      pytest.param({"head_loop": 8}, id="head_loop")])
def test_cutile_compute_out_arrangement_borrows_the_default_record(switches):
    """compute_out's heads_first / skip_first on or head_loop set, without a record of their own, run on the default
    code's tiles (head_loop: the record's heads_per_tile are the heads of one step of its loop)."""
    from impls.cutile import tune
    from impls.cutile.switches import CutileSwitches

    t = tune.tunable("compute_out", CutileSwitches(**switches), None, "S", "bfloat16", make_call=None)
    assert t.key != t.base_key == tune.record_key("compute_out", CutileSwitches(), "S", "bfloat16")
    stack = {n: STACK.get(n) for n in tune.STACK}
    config = {"block_rows": 64, "block_headdim": 32, "heads_per_tile": 2, "occupancy": 3, "shared_cb": False}
    tuning.store("cutile", "compute_out", t.gpu, t.base_key, config, {}, stack)
    res = tuning.resolve(t)
    assert (res.config, res.source) == (config, "record")


@pytest.mark.parametrize("trick", [pytest.param({"exp2_ftz": True}, id="exp2_ftz"),
                                   pytest.param({"exp_fold": True}, id="exp_fold"),
                                   pytest.param({"cb_mode": "shared", "cb_occupancy": 4}, id="cb_occupancy"),
                                   pytest.param({"decay_factor": True, "decay_single": True}, id="decay_single")])
def test_cutile_trick_on_a_targets_defaults_borrows_those_defaults_tiles(trick):
    """An ablation arm adding a tile-borrowing trick to sm_90's defaults (heads_first, skip_first, pdl) runs on
    those defaults' record (the near key), not the declared values' (the base key), which would change the tiles
    between the arms; without the defaults' record it still falls back to the base key's."""
    from impls.cutile import tune
    from impls.cutile.switches import CutileSwitches

    needed = ("cb_mode", "decay_factor")  # what the trick needs, in the arm without it too
    sm90 = {"heads_first": True, "skip_first": True, "pdl": True, **{k: v for k, v in trick.items() if k in needed}}
    t = tune.tunable("compute_out", CutileSwitches(**{**sm90, **trick}), None, "S", "bfloat16", make_call=None)
    assert t.near_key == tune.record_key("compute_out", CutileSwitches(**sm90), "S", "bfloat16") != t.base_key
    stack = {n: STACK.get(n) for n in tune.STACK}
    declared = {"block_rows": 64, "block_headdim": 32, "heads_per_tile": 2, "occupancy": 3, "shared_cb": False}
    tuning.store("cutile", "compute_out", t.gpu, t.base_key, declared, {}, stack)
    assert tuning.resolve(t).config == {**declared, **t.pins}  # cb_mode shared pins shared_cb
    defaults = {"block_rows": 64, "block_headdim": 64, "heads_per_tile": 2, "occupancy": 3, "shared_cb": True}
    tuning.store("cutile", "compute_out", t.gpu, t.near_key, defaults, {}, stack)
    res = tuning.resolve(t)
    assert (res.config, res.key, res.protocol) == (defaults, t.near_key, tuning.PINNED)


# --- Triton under the interpreter: a one-config space (the fallback), searched, confirmed, stored, bound ---------
def _triton_cumsum(backend):
    import math

    import torch

    gen = torch.Generator().manual_seed(0)
    dt, A = torch.rand(1, 32, 2, generator=gen), -torch.rand(2, generator=gen)
    return backend.chunk_cumsum(dt, A, 16, None, True, (0.0, math.inf))


def test_triton_search_under_the_interpreter_stores_a_confirmed_record(monkeypatch):
    from impls.triton import TritonBackend

    monkeypatch.setattr(tuning, "stack_versions", lambda names: {"triton": "3.6.0", "driver": None})
    searched = TritonBackend(tuning="search")
    _triton_cumsum(searched)
    info = searched.describe()["stages"]["chunk_cumsum"]
    assert info["source"] == "search"
    record = tuning.lookup("triton", "chunk_cumsum", "triton-interpreter", info["key"])
    assert record["config"] == info["config"] and len(record["measurements"]) == 1
    assert len(record["confirmed"]) == 1 and record["versions"]["triton"] == "3.6.0"
    resumed = TritonBackend(tuning="resume")
    _triton_cumsum(resumed)
    assert resumed.describe()["stages"]["chunk_cumsum"]["source"] == "record"
    monkeypatch.setattr(tuning, "stack_versions", lambda names: {"triton": "3.7.0", "driver": None})
    auto = TritonBackend()
    _triton_cumsum(auto)
    info = auto.describe()["stages"]["chunk_cumsum"]
    assert info["source"] == "fallback" and "triton 3.6.0 in the record, 3.7.0 today" in info["reason"]
    again = TritonBackend(tuning="resume")
    _triton_cumsum(again)
    assert again.describe()["stages"]["chunk_cumsum"]["source"] == "search"


# --- switch help says what, docs/perf-notes.md how much ------------------------------------------------------------
MEASUREMENT = r"\d\s*%|\d\s*(?:µs|ms)\b|\bmeasured\b|results/|\d×"


@pytest.mark.parametrize("module, cls", [
    pytest.param("impls.cutile.switches", "CutileSwitches", id="cutile"),
    pytest.param("impls.triton.switches", "TritonSwitches", id="triton"),
    pytest.param("impls.tilegym.backend", "TilegymSwitches", id="tilegym"),
])
def test_switch_help_carries_no_measurements(module, cls):
    import importlib
    import re

    from impls.registry import switch_table

    for row in switch_table(getattr(importlib.import_module(module), cls)):
        for field in ("help", "sm90", "sm100"):
            assert not re.search(MEASUREMENT, row[field]), (row["name"], field, row[field])


def test_triton_space_size_is_declared():
    """impls/triton/space.py declares each stage's space size beside its space, to compare with cuTile's."""
    from impls.triton.space import SEARCH_SPACE, SPACE_SIZE, space_size

    assert set(SPACE_SIZE) == set(SEARCH_SPACE)
    assert {stage: space_size(stage) for stage in SEARCH_SPACE} == SPACE_SIZE


def test_auto_and_record_keep_a_record_of_an_older_space():
    tuning.store("b", "s", GPU, "k", {"block": 32}, {"block": [32]}, STACK)
    assert tuning.resolve(_tunable("auto")).source == "record"
    assert tuning.resolve(_tunable("record")).source == "record"


def test_cutile_kernel_timer_times_one_config_with_cuda_tile_tune(monkeypatch):
    """Each config alone through cuda.tile.tune.exhaustive_search (so a search resumes config by config): its
    grid, kernel and arguments are the config's call; its mean (and error margin) are what the record keeps."""
    import types

    import cuda.tile.tune

    from impls.cutile import tune

    seen = []

    def fake_search(space, stream, grid_fn, kernel_fn, args_fn, quiet):
        seen.append((space, grid_fn(space[0]), kernel_fn(space[0]), args_fn(space[0]), quiet))
        return types.SimpleNamespace(best=types.SimpleNamespace(mean_us=12.345, error_margin_us=0.061))

    monkeypatch.setattr(cuda.tile.tune, "exhaustive_search", fake_search)
    monkeypatch.setattr(tune.torch.cuda, "current_stream", lambda: "stream")
    call = types.SimpleNamespace(grid=(4, 1, 1), kernel="kernel", args=("x",))
    assert tune.kernel_timer(lambda cfg: call)({"occupancy": 2}) == {"us": 12.35, "mean_us": 12.35,
                                                                       "error_margin_us": 0.06}
    assert seen == [([0], (4, 1, 1), "kernel", ("x",), True)]


def test_cutile_kernel_timer_times_each_kernel_of_a_config_and_adds_them(monkeypatch):
    """compute_out with shared C·Bᵀ: the C·Bᵀ kernel, then the main kernel, each timed alone; the record keeps the
    sums of their means and of their error margins."""
    import types

    import cuda.tile.tune

    from impls.cutile import tune

    seen = []

    def fake_search(space, stream, grid_fn, kernel_fn, args_fn, quiet):
        seen.append(kernel_fn(space[0]))
        us = {"cb": 20.0, "main": 500.0}[kernel_fn(space[0])]
        return types.SimpleNamespace(best=types.SimpleNamespace(mean_us=us, error_margin_us=0.5))

    monkeypatch.setattr(cuda.tile.tune, "exhaustive_search", fake_search)
    monkeypatch.setattr(tune.torch.cuda, "current_stream", lambda: "stream")
    calls = tuple(types.SimpleNamespace(grid=(4, 1, 1), kernel=k, args=()) for k in ("cb", "main"))
    assert tune.kernel_timer(lambda cfg: calls)({"shared_cb": True}) == {"us": 520.0, "mean_us": 520.0,
                                                                           "error_margin_us": 1.0}
    assert seen == ["cb", "main"]


def test_triton_record_key_of_equal_switches_of_other_types_does_not_depend_on_order():
    """tma=1 equals tma=True (and hashes alike), yet the key's text differs: one must not get the other's key. (The
    backends refuse tma=1, impls.registry.make_switches; the dataclass built directly still takes it.)"""
    from impls.triton.switches import TritonSwitches
    from impls.triton.tune import record_key

    def key(tma):
        return record_key(TritonSwitches(tma=tma), "S1", "bfloat16", {})

    assert "tma=True" in key(True)
    assert "tma=1" in key(1)


@pytest.mark.parametrize("program", ["row_tile", "chunk"])
def test_triton_fused_switches_key_only_the_fused_kernel(program):
    """fuse_state_out and fused_program change only the fused kernel: the staged kernels of either fused
    arrangement read the staged records (no search of their own under a fused key), the fused kernel keys on them."""
    from impls.triton.stages import FUSED
    from impls.triton.switches import TritonSwitches
    from impls.triton.tune import record_key

    fused = TritonSwitches(fuse_state_out=True, fused_program=program, tma=True, tma_descriptors="host")
    staged = TritonSwitches(tma=True, tma_descriptors="host")
    for stage in ("chunk_cumsum", "chunk_state", "state_passing", "compute_out"):
        assert record_key(fused, "S1", "bfloat16", {}, stage) == record_key(staged, "S1", "bfloat16", {}, stage)
    assert "fuse_state_out=True" in record_key(fused, "S1", "bfloat16", {}, FUSED)
    assert ("fused_program=chunk" in record_key(fused, "S1", "bfloat16", {}, FUSED)) == (program == "chunk")


def test_an_unreadable_record_file_is_named_and_left_alone():
    path = tuning.record_path("triton", "compute_out", GPU)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"entries": {"S1": ')
    with pytest.raises(tuning.RecordFileError, match=f"{path}: not a readable tuning-record file"):
        tuning.lookup("triton", "compute_out", GPU, "S1")
    with pytest.raises(tuning.RecordFileError):
        tuning.store("triton", "compute_out", GPU, "S2", {"block_rows": 64}, [], {})
    assert path.read_text() == '{"entries": {"S1": '  # never overwritten


def _store_keys(root: str, worker: int, n: int) -> None:
    import os

    os.environ["SSD_TUNING_DIR"] = root
    for i in range(n):
        tuning.store("triton", "compute_out", GPU, f"w{worker}-k{i}", {"block_rows": 64}, [], {})


def test_processes_storing_to_one_file_lose_no_record(tmp_path):
    """Each store reads, changes and writes the file under a lock: four processes' records all end up in it."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_store_keys, args=(str(tmp_path), w, 15)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert all(p.exitcode == 0 for p in procs)
    entries = json.loads(tuning.record_path("triton", "compute_out", GPU).read_text())["entries"]
    assert len(entries) == 60


# --- a record's fields against the stage's ----------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["auto", "record", "resume"])
def test_record_with_a_field_the_stage_does_not_read_is_refused(mode):
    """A record whose config holds a field outside the stage's space, fallback and pins (a misspelt or stale one)
    is refused, naming the field, the file and the key, in every mode that reads records."""
    _store({"block": 128, "blok_rows": 64})
    with pytest.raises(tuning.RecordFileError, match=r"record 'k' has config field\(s\) \['blok_rows'\]"):
        tuning.resolve(_tunable(mode))


def test_record_fields_not_checked_without_a_declared_space():
    """A backend whose own autotuner writes the records (TileGym: its space is the list of its configs) and a stage
    without a space: nothing of ours to check the record's fields against."""
    _store({"block": 128, "warps": 4})
    assert tuning.resolve(_tunable("auto", space=[{"block": 64}])).config == {"block": 128, "warps": 4}
    assert tuning.resolve(_tunable("auto", space=None)).config == {"block": 128, "warps": 4}


def test_every_committed_record_holds_only_fields_its_stage_reads():
    """The committed cuTile and Triton records (every GPU folder) against the fields their stages declare: the
    search space, the fallback's fields."""
    import glob

    from impls.cutile import tune as cutile_tune
    from impls.triton.space import SEARCH_SPACE
    from impls.triton.tune import STAGE_FIELDS

    declared = {("cutile", s): set(cutile_tune.SPACE[s]) | set(cutile_tune.FALLBACK[9][s]) for s in cutile_tune.SPACE}
    declared |= {("triton", s): set(SEARCH_SPACE[s]) | set(STAGE_FIELDS[s]) for s in SEARCH_SPACE}
    seen = 0
    for path in glob.glob(str(tuning.ROOT / "*" / "*.json")):  # the committed folder (tests point SSD_TUNING_DIR away)
        if path.endswith(".partial.json"):  # an unfinished search's measurements (`tuning=resume` goes on from them)
            continue
        data = json.load(open(path))
        fields = declared.get((data["backend"], data["stage"]))
        for key, record in (data["entries"].items() if fields else ()):
            assert set(record["config"]) <= fields, (path, key, record["config"])
            seen += 1
    assert seen > 20


# --- every switch of a tuned backend has a role for the record key (impls/tuning.py KEY_ROLES) ---------------------
def _cutile_keys(sw):
    from impls.cutile import tune
    from impls.cutile.backward import tune as bwd_tune

    keys = {s: (tune.record_key(s, sw, "b1-l256", "bfloat16"), tune.pins(s, sw)) for s in tune.STAGE_KEYS}
    # the backward's kernels: keyed by their own record_key, no pins
    return {**keys, **{s: (bwd_tune.record_key(sw, "b1-l256", "bfloat16", {}, s), {}) for s in bwd_tune.STAGES}}


def _triton_keys(sw):
    from impls.problem import Shape
    from impls.triton import tune
    from impls.triton.backward import tune as bwd_tune
    from impls.triton.clamp import pinned
    from impls.triton.stages import STAGE_FIELDS  # the fused kernel's stage too

    keys = {s: (tune.record_key(sw, "b1-l256", "bfloat16", {}, s), pinned(sw, s)) for s in STAGE_FIELDS}
    shape = Shape(1, 256, 4, 16, 1, 16, 128)  # the backward's kernels: keyed by their own record_key, no pins
    return {**keys, **{s: (bwd_tune.record_key(sw, shape, "bfloat16", {}, s), {}) for s in bwd_tune.STAGES}}


def _tilegym_keys(sw):
    from types import SimpleNamespace

    from impls.problem import Shape
    from impls.tilegym import tune
    from impls.tilegym.backend import TilegymBackend

    variant = TilegymBackend._variant(SimpleNamespace(switches=sw))
    shape = Shape(1, 256, 4, 16, 1, 16, 128)
    return {s: (tune.config_key(s, shape, "bfloat16", variant if s == "fwd_pass_state" else {}, "float32"), {})
            for s in ("chunk_cumsum", "fwd_pass_state", "compute_out")}


TUNED = {"cutile": _cutile_keys, "triton": _triton_keys, "tilegym": _tilegym_keys}


def _roles_and_switches(backend):
    import importlib

    from impls.registry import backend_class

    return importlib.import_module(f"impls.{backend}.tune").KEY_ROLES, backend_class(backend).Switches


@pytest.mark.parametrize("backend", sorted(TUNED))
def test_every_switch_has_a_role_for_the_record_key(backend):
    """A switch added without saying how it enters the record key fails here (docs/add-a-switch.md): left out of the
    key by omission, a code-changing switch would run on, and store over, the records of the code without it."""
    roles, switches = _roles_and_switches(backend)
    assert tuning.unclassified(switches, roles) == []


def test_a_new_switch_without_a_role_is_named():
    @dataclasses.dataclass(frozen=True)
    class Switches:
        tma: bool = True
        new_trick: bool = False

    assert tuning.unclassified(Switches, {"tma": tuning.KEY, "gone": tuning.PIN}) == [
        "switch 'new_trick' has no key role", "'gone' is no switch of Switches"]


def _away(field) -> list:
    """The values of a switch other than its default: the other bool, its other choices (none for a free int)."""
    if isinstance(field.default, bool):
        return [not field.default]
    return [c for c in field.metadata.get("choices") or () if c != field.default]


@pytest.mark.parametrize("backend", sorted(TUNED))
def test_each_switch_enters_the_key_as_its_role_says(backend):
    """key: some value away from the default changes some stage's record key; pin: it changes some stage's pins;
    kernels and neither: no value changes any stage's key or pins (the switches it needs set on both sides)."""
    roles, switches = _roles_and_switches(backend)
    wrong = []
    for field in dataclasses.fields(switches):
        base = switches(**field.metadata.get("needs", {}))
        before = TUNED[backend](base)
        after = [TUNED[backend](dataclasses.replace(base, **{field.name: v})) for v in _away(field)]
        keys = any(a[s][0] != before[s][0] for a in after for s in before)
        pins = any(a[s][1] != before[s][1] for a in after for s in before)
        role = roles.get(field.name)
        if (role == tuning.KEY and not keys) or (role == tuning.PIN and not pins) or \
                (role in (tuning.KERNELS, tuning.NEITHER) and (keys or pins)):
            wrong.append(f"{field.name}: role {role!r}, but it changes the key: {keys}, the pins: {pins}")
    assert wrong == []
