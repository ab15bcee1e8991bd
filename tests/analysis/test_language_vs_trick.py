"""The language-vs-trick tables (analysis/language_vs_trick.py): the generator on a small synthetic Parquet set
(known times, so every cell can be checked), the doc regenerated from the committed rows, and the pins the
experiment reads off cuTile's records (harness/cutile_tiles.py)."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from analysis import language_vs_trick as lvt
from analysis.load import MixedRuns, repo_root
from analysis.noise import WITHIN_NOISE
from harness import cutile_tiles, store
from tests.fixtures.make_fixture import SHAPES, base

STAGE_MS = {"chunk_cumsum": 0.01, "fwd_pass_state": 0.1, "compute_out": 0.3, "forward": 0.42}


def _point(backend, shape, sweep, ms_scale, ablation="none", arm=None, switches=None, job=0, tiles="retuned"):
    _, b = base(backend, shape, SHAPES[shape], "bfloat16", sweep, switches or {"tuning": "auto"}, ablation)
    b.update(job_num=job, hydra_choices=json.dumps({"lvt": arm} if arm else {}), sweep_id=f"synthetic-{sweep}",
             tile_protocol=tiles)
    rows = []
    for stage, ms in STAGE_MS.items():
        for metric, value in (("median_ms", ms * ms_scale), ("p20_ms", ms * ms_scale), ("p80_ms", ms * ms_scale)):
            rows.append({**b, "stage": stage, "metric": metric, "value": value})
    return rows


@pytest.fixture
def synthetic(tmp_path):
    """S1 and S2: cuTile 1.0, Triton at cuTile's tiles 1.5; tricks: cuTile tma off 1.1x slower,
    Triton exp2 off 1.25x slower, Triton tma on 2x slower, with host descriptors 1.6x faster than tma on (2.5 vs 4.0),
    warp_specialize on top of tma 2x faster (2.0 vs 4.0): a point of a retired switch, as committed rows hold it."""
    parts = {name: [] for name in lvt.EXPERIMENTS}
    for shape in ("S1", "S2"):
        parts[lvt.MATCHED] += _point("cutile", shape, lvt.MATCHED, 1.0, arm="cutile")
        parts[lvt.MATCHED] += _point("triton", shape, lvt.MATCHED, 1.5, arm="triton_cutile_tiles",
                                     switches={"occupancy": 3, "state_occupancy": 2})
        parts[lvt.MATCHED] += _point("triton", shape, lvt.MATCHED, 2.5, arm="triton_tma_host",
                                     switches={"tma": True, "tma_descriptors": "host"})
        c, t = lvt.PARTS["cutile"], lvt.PARTS["triton"]
        for job, (ablation, scale) in enumerate((("none", 1.0), ("tma", 1.1), ("all_off", 1.3))):
            parts[c] += _point("cutile", shape, c, scale, ablation, job=job)
        ws = "tma:True+warp_specialize:True"
        for job, (ablation, scale) in enumerate((("none", 2.0), ("exp2", 2.5), ("tma:True", 4.0), (ws, 2.0),
                                                 ("all_off", 3.0))):
            parts[t] += _point("triton", shape, t, scale, ablation, job=job)
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "results" / "run").mkdir(parents=True)
    index = {}
    for name, rows in parts.items():
        store.write_atomic(store.frame(rows), tmp_path / "results" / "run" / f"{name}.parquet")
        index[name] = f"run/{name}.parquet"
    (tmp_path / "results" / "index.yaml").write_text("".join(f"{k}: {v}\n" for k, v in index.items()))
    return tmp_path


def test_language_table_on_synthetic_rows(synthetic):
    t = lvt.language_table(lvt.load(synthetic)).set_index(["shape", "stage"])
    s1 = t.loc[("S1", "compute_out")]
    assert s1["cuTile tuned ms"] == pytest.approx(0.3) and s1["Triton / cuTile"] == pytest.approx(1.5)
    assert t.loc[("S1", "fwd_pass_state"), "Triton / cuTile"] == pytest.approx(1.5)  # one point, every stage
    assert t.loc[("S1", "forward"), "Triton defaults ms"] == pytest.approx(0.84)
    assert t.loc[("S2", "chunk_cumsum"), "cuTile all-off ms"] == pytest.approx(0.013)
    assert math.isnan(t.loc[("S3", "compute_out"), "cuTile tuned ms"])  # no S3 rows: empty, not invented


def test_rounds_of_one_run_pool_and_rows_of_another_run_are_left_out(synthetic):
    """A point measured in three rounds of its run (sweeps of one run group) reads the median of their medians; rows
    of another run group merged into the same files make the tables refuse, and `pick_run` reads the newest run,
    naming the one left out."""
    w = lvt.load(synthetic)
    one = w[(w["sweep_name"] == lvt.MATCHED) & (w["backend"] == "cutile") & (w["shape_name"] == "S1")]
    rounds = [one.assign(sweep_id=f"synthetic-round{k}", run_id=one["run_id"] + str(k), median_ms=one["median_ms"] * f)
              for k, f in ((2, 2.0), (3, 3.0))]
    t = lvt.language_table(pd.concat([w, *rounds], ignore_index=True)).set_index(["shape", "stage"])
    assert t.loc[("S1", "compute_out"), "cuTile tuned ms"] == pytest.approx(0.6)  # median of 0.3, 0.6, 0.9
    later = one.assign(run_group="later", timestamp="2026-12-02T00:00:00+00:00", median_ms=one["median_ms"] * 2)
    both = pd.concat([w, later], ignore_index=True)
    with pytest.raises(MixedRuns, match="run_group: later, synthetic"):
        lvt.language_table(both)
    newest, left_out = lvt.pick_run(both)
    assert set(newest["run_group"]) == {"later"} and left_out["run_group"].tolist() == ["synthetic"]
    assert "`synthetic` on GPU-synthetic" in lvt.run_text(newest, left_out)


def test_trick_table_on_synthetic_rows(synthetic):
    t = lvt.trick_table(lvt.load(synthetic)).set_index(["trick", "stage"])
    assert t.loc[("tma", "compute_out"), "cuTile S1"] == "+10.0 %"  # on by default: off is 1.1x slower
    assert t.loc[("tma", "compute_out"), "Triton S2"] == "-50.0 %"  # off by default: turning it on halves speed
    assert t.loc[("exp2", "forward"), "Triton S1"] == "+25.0 %"
    assert t.loc[("exp2", "forward"), "cuTile S1"] == "n/a"  # this synthetic cuTile part has no exp2 point
    assert t.loc[("tma", "compute_out"), "cuTile S3"] == ""  # no rows
    # the arm (2.5) against tma on with in-kernel descriptors (4.0), not against the defaults (tma off)
    assert t.loc[("tma_descriptors:host", "compute_out"), "Triton S1"] == "+60.0 %"
    assert t.loc[("tma_descriptors:host", "compute_out"), "cuTile S1"] == "n/a"
    # a trick swept with its needs (tma): against the point of its needs (4.0), not the defaults (2.0), and not
    # mistaken for tma:True
    assert t.loc[("warp_specialize", "compute_out"), "Triton S1"] == "+100.0 %"
    assert t.loc[("tma", "compute_out"), "Triton S2"] == "-50.0 %"


def test_a_trick_inside_the_noise_reads_within_noise(synthetic):
    """cuTile's tma off is 1.1x slower; with p20–p80 spreads of ±12 % at the point without it, the 10 % reads "within
    noise", at every stage, and stays a number in a part whose spreads are narrow."""
    w = lvt.load(synthetic)
    noisy = (w["sweep_name"] == lvt.PARTS["cutile"]) & (w["ablation"] == "tma") & (w["shape_name"] == "S1")
    w.loc[noisy, "p20_ms"], w.loc[noisy, "p80_ms"] = w.loc[noisy, "median_ms"] * 0.88, w.loc[noisy, "median_ms"] * 1.12
    t = lvt.trick_table(w).set_index(["trick", "stage"])
    assert t.loc[("tma", "compute_out"), "cuTile S1"] == WITHIN_NOISE
    assert t.loc[("tma", "forward"), "cuTile S1"] == WITHIN_NOISE
    assert t.loc[("tma", "compute_out"), "cuTile S2"] == "+10.0 %"


def test_a_trick_that_leaves_a_stage_s_code_alone_reads_same_code(synthetic):
    """tma is a no-op for chunk_cumsum in both languages (impls/cutile/switch_sass_effects.json: the sm_90 SASS;
    impls/triton/switch_launch_effects.json: the launches): its cells read "same code", not the synthetic 1.1x and 2x;
    compute_out and the forward, which it changes, keep their figures. A point whose recorded config for the stage
    differs keeps its figure too."""
    w = lvt.load(synthetic)
    t = lvt.trick_table(w).set_index(["trick", "stage"])
    assert t.loc[("tma", "chunk_cumsum"), "cuTile S1"] == lvt.SAME_CODE
    assert t.loc[("tma", "compute_out"), "cuTile S1"] == "+10.0 %"
    assert t.loc[("tma", "forward"), "cuTile S1"] == "+10.0 %"
    assert t.loc[("tma", "chunk_cumsum"), "Triton S1"] == lvt.SAME_CODE
    assert t.loc[("tma", "compute_out"), "Triton S1"] == "-50.0 %"
    tma = (w["sweep_name"] == lvt.PARTS["cutile"]) & (w["ablation"] == "tma") & (w["shape_name"] == "S1")
    w.loc[tma, "describe"] = json.dumps({"stages": {"chunk_cumsum": {"config": {"block_heads": 4}}}})
    t = lvt.trick_table(w).set_index(["trick", "stage"])
    assert t.loc[("tma", "chunk_cumsum"), "cuTile S1"] == "+10.0 %"  # another config: a measured effect
    assert t.loc[("tma", "chunk_cumsum"), "cuTile S2"] == lvt.SAME_CODE


def _with_tiles(w, ablation, protocol, stage=None):
    """The rows of the cuTile part's point `ablation` at S1 (every stage, or `stage`) recorded with `protocol`."""
    sel = (w["sweep_name"] == lvt.PARTS["cutile"]) & (w["ablation"] == ablation) & (w["shape_name"] == "S1")
    if stage:
        sel &= w["stage"] == stage
    w.loc[sel, "tile_protocol"] = protocol
    return w


def test_a_pinned_point_is_shown_apart_and_labelled(synthetic):
    """cuTile's tma-off point at S1 borrowed its baseline's tiles (pinned) for compute_out: no figure in the trick
    table there, the figure in the apart table with the protocol and what it means; its other stages and S2 stay."""
    w = _with_tiles(lvt.load(synthetic), "tma", "pinned", "compute_out")
    t = lvt.trick_table(w).set_index(["trick", "stage"])
    assert t.loc[("tma", "compute_out"), "cuTile S1"] == "apart: pinned"
    assert t.loc[("tma", "forward"), "cuTile S1"] == "+10.0 %" and t.loc[("tma", "compute_out"), "cuTile S2"] == \
        "+10.0 %"
    cells = lvt.trick_cells(w)
    apart = lvt.apart_table(cells).set_index(["trick", "stage", "language"])
    assert len(apart) == 1 and apart.loc[("tma", "compute_out", "cuTile"), "S1"] == "+10.0 % (pinned / retuned)"
    assert apart.loc[("tma", "compute_out", "cuTile"), "S2"] == ""  # S2 is in the trick table
    assert [line.split(":")[0] for line in lvt.apart_legend(cells)] == ["- `pinned`"]
    assert "borrowed" in lvt.apart_legend(cells)[0]
    text = lvt.render(w, "synthetic")
    assert "apart: pinned" in text and "| tma | compute_out | cuTile | +10.0 % (pinned / retuned) |  |" in text


def test_rows_before_the_column_are_unknown_not_guessed(synthetic):
    """Rows written before tile_protocol (null) read "unknown": shown apart, never as a trick's effect."""
    w = _with_tiles(lvt.load(synthetic), "tma", None)
    t = lvt.trick_table(w).set_index(["trick", "stage"])
    assert t.loc[("tma", "compute_out"), "cuTile S1"] == "apart: unknown"
    assert lvt.stage_protocol(w[(w["ablation"] == "tma") & (w["shape_name"] == "S1")], "compute_out") == "unknown"


def test_the_lowering_change_is_read_from_the_file_beside_the_rows(synthetic):
    """A lowering file beside a part's rows: the tables say what the trick's point changes (registers, stack,
    spills, warp specialisation) from both points' entries; elsewhere "lowering not inspected"."""
    from analysis import lowering

    w = lvt.load(synthetic)
    w["describe"] = json.dumps({"stages": {"compute_out": {"config": {"block_rows": 64}}}})
    w.loc[w["ablation"] == "tma", "switches"] = json.dumps({"tma": False, "tuning": "auto"})
    points = []
    for ablation, kernel in (("none", [80, 0, 18, 13, True]), ("tma", [168, 392, 163, 142, False])):
        r = w[(w["sweep_name"] == lvt.PARTS["cutile"]) & (w["ablation"] == ablation) & (w["shape_name"] == "S1")]
        r = r.iloc[0]
        points.append({"backend": "cutile", "shape": "S1", "dtype": "bfloat16", "arch": "sm_90",
                       "switches": json.loads(r["switches"]), "stage": "compute_out",
                       "configs": [{"block_rows": 64}], "kernels": [dict(zip(
                           ("kernel", "registers", "stack_bytes", "ldl", "stl", "warp_specialized"),
                           ["compute_out", *kernel]))]})
    index = lvt.results_index(synthetic)
    path = lowering.path_for(synthetic / "results" / index[lvt.PARTS["cutile"]])
    path.write_text(json.dumps({"points": points}))
    w = _with_tiles(w, "tma", "pinned", "compute_out")
    cells = lvt.trick_cells(w, lvt.lowering_entries(synthetic))
    t = lvt.lowering_table(cells).set_index(["trick", "stage"])
    assert t.loc[("tma", "compute_out"), "cuTile S1"] == ("compute_out: warp specialisation lost, 80 -> 168 "
                                                          "registers, stack 0 -> 392 B, LDL/STL 18/13 -> 163/142")
    assert t.loc[("tma", "compute_out"), "cuTile S2"] == lvt.NOT_INSPECTED
    assert "warp specialisation lost" in lvt.render(w, "synthetic", lowered=lvt.lowering_entries(synthetic))


def test_render_and_markers(synthetic, tmp_path):
    text = lvt.render(lvt.load(synthetic), "synthetic")
    assert "| S1 | compute_out | 0.3 | 0.45 | 1.5 |" in text and "latency_hints" in text  # a cuTile-only knob
    doc = tmp_path / "doc.md"
    doc.write_text(f"intro\n{lvt.BEGIN}\nold\n{lvt.END}\ntail\n")
    assert lvt.write_section(doc, "new") == f"intro\n{lvt.BEGIN}\nnew\n{lvt.END}\ntail\n"
    doc.write_text("no markers")
    with pytest.raises(ValueError, match="markers"):
        lvt.write_section(doc, "new")


def test_tile_source_says_where_cutiles_tiles_came_from():
    rows = pd.DataFrame({"tuning": [json.dumps({"chunk_cumsum": "record", "compute_out": "fallback"})]})
    assert lvt.tile_source(rows, "compute_out") == "fallback" and lvt.tile_source(rows, "chunk_cumsum") == "record"
    assert lvt.tile_source(rows, "forward") == "fallback/record"
    assert lvt.tile_source(pd.DataFrame({"tuning": [json.dumps({"compute_out": "record"})]}), "forward") == "record"
    assert lvt.tile_source(pd.DataFrame({"tuning": ["auto"]}), "forward") == ""  # a mode, not per-stage sources


def test_each_machine_has_its_own_entries_and_section(synthetic, tmp_path):
    """Entries ending in a card's suffix load that card's rows alone and fill that card's markers only."""
    index = synthetic / "results" / "index.yaml"
    names = [n for n in lvt.EXPERIMENTS]
    index.write_text("".join(f"{n}_h100: run/{n}.parquet\n" for n in names))
    with pytest.raises(lvt.MissingRows, match="language_vs_trick"):
        lvt.load(synthetic)  # the H200's entries are absent
    assert lvt.missing_entries(synthetic, "_h100") == [] and not lvt.load(synthetic, "_h100").empty
    doc = tmp_path / "doc.md"
    begin, end = lvt.markers("_h100")
    doc.write_text(f"a\n{lvt.BEGIN}\nh200\n{lvt.END}\nb\n{begin}\nold\n{end}\n")
    assert lvt.write_section(doc, "new", "_h100") == f"a\n{lvt.BEGIN}\nh200\n{lvt.END}\nb\n{begin}\nnew\n{end}\n"


def test_missing_index_entries_are_named(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "index.yaml").write_text("headline: x.parquet\n")
    with pytest.raises(lvt.MissingRows, match="language_vs_trick, language_vs_trick_cutile"):
        lvt.load(tmp_path)


def test_only_the_matched_part_renders_the_language_table(synthetic):
    """With the two languages' parts not committed, the language table comes from the matched part (their columns
    empty, not invented) and the trick section names what is missing instead of a table."""
    index = synthetic / "results" / "index.yaml"
    index.write_text(f"{lvt.MATCHED}: run/{lvt.MATCHED}.parquet\n")
    w = lvt.load(synthetic)
    t = lvt.language_table(w).set_index(["shape", "stage"])
    assert t.loc[("S1", "compute_out"), "Triton / cuTile"] == pytest.approx(1.5)
    assert math.isnan(t.loc[("S1", "forward"), "Triton defaults ms"])
    text = lvt.render(w, "synthetic", tuple(lvt.missing_entries(synthetic)))
    assert "| S1 | compute_out | 0.3 | 0.45 | 1.5 |" in text
    assert "Not run yet" in text and "`language_vs_trick_cutile`, `language_vs_trick_triton`" in text
    assert "| trick |" not in text


def test_committed_doc_matches_the_committed_rows():
    root = repo_root()
    missing = lvt.missing_entries(root)
    if lvt.MATCHED in missing:
        pytest.skip(f"results/index.yaml has no entry {lvt.MATCHED} (no GPU rows of the language_vs_trick "
                    "experiment committed yet)")
    assert lvt.main(["--check"]) == 0, "docs/language-vs-trick.md differs: python -m analysis.language_vs_trick"


def test_cutile_tiles_read_the_records_and_refuse_a_shape_without_one():
    key_s1 = cutile_tiles.shape_key("S1", "compute_out")
    assert key_s1 == "b8-l4096-h80-p64-g1-n128-c256" and cutile_tiles.shape_key("S1", "chunk_cumsum") == \
        "b8-l4096-h80-c256"
    config = cutile_tiles.tuned("S4", "compute_out")
    assert cutile_tiles.tile("S4", "compute_out", "occupancy") == config["occupancy"]
    assert cutile_tiles.tile("S4", "compute_out", "cb_mode") == ("shared" if config["shared_cb"] else "inline")
    with pytest.raises(cutile_tiles.MissingRecord, match="no cuTile record for compute_out at tiny"):
        cutile_tiles.tile("tiny", "compute_out", "occupancy")


H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture(autouse=True)
def _records_of_the_h200(monkeypatch):
    """The tests read the H200's committed records whatever card the host has (records_gpu reads the running
    card's); a test that wants another card patches records_gpu again."""
    monkeypatch.setattr(cutile_tiles, "records_gpu", lambda: cutile_tiles.DEFAULT_GPU)


def test_records_gpu_is_the_running_card_else_the_h200(monkeypatch):
    import torch

    monkeypatch.undo()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cutile_tiles.records_gpu() == cutile_tiles.DEFAULT_GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: H100)
    assert cutile_tiles.records_gpu() == H100


def test_cutile_tiles_are_the_running_cards_records(monkeypatch):
    """The Triton point is pinned at the tiles of the card the run is on, the records cuTile's own point runs with:
    another card's records (the H100's at S2, none under the default switches) raise, never pin the H200's."""
    from impls import tuning

    monkeypatch.setattr(cutile_tiles, "records_gpu", lambda: H100)
    h100_s1 = tuning.lookup("cutile", "compute_out", H100, cutile_tiles.tune_key("S1", "compute_out"))
    assert h100_s1 is not None and cutile_tiles.tuned("S1", "compute_out") == h100_s1["config"]
    with pytest.raises(cutile_tiles.MissingRecord, match="at S2 on NVIDIA H100 80GB HBM3"):
        cutile_tiles.tile("S2", "compute_out", "occupancy")


def test_cutiles_matched_point_runs_on_records_only():
    from hydra import compose, initialize_config_dir

    from harness import config as conf

    conf.register_schemas()
    conf.register_resolvers()
    with initialize_config_dir(config_dir=str(repo_root() / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["experiment=language_vs_trick", "+lvt=cutile", "shape=S2"])
        assert conf.validate(cfg)[1].tuning == "record"


def test_synthetic_rows_are_synthetic(synthetic):
    w = lvt.load(synthetic)
    assert (w["host"] == "synthetic-fixture").all() and isinstance(w, pd.DataFrame)


def test_figure_draws_each_language_in_its_color(synthetic):
    from matplotlib.colors import to_hex

    from analysis import palette

    fig = lvt.figure(lvt.language_table(lvt.load(synthetic)))
    bars = [p for ax in fig.axes for p in ax.patches]
    assert bars and all(to_hex(p.get_facecolor()) == palette.color(p.get_gid().split(":")[1]) for p in bars)


def test_triton_arm_pins_cutiles_tiles():
    """One Triton point in cuTile's arrangement at cuTile's S3 tiles, each MMA stage at its record's occupancy."""
    arm = "triton_cutile_tiles"
    from hydra import compose, initialize_config_dir
    from omegaconf.errors import OmegaConfBaseException

    from harness import config as conf

    conf.register_schemas()
    conf.register_resolvers()
    with initialize_config_dir(config_dir=str(repo_root() / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["experiment=language_vs_trick", f"+lvt={arm}", "shape=S3"])
        _, sw = conf.validate(cfg)
        out, fwd = cutile_tiles.tuned("S3", "compute_out"), cutile_tiles.tuned("S3", "fwd_pass_state")
        assert (sw.block_rows, sw.heads_per_tile, sw.block_dstate) == (out["block_rows"], out["heads_per_tile"],
                                                                       fwd["block_dstate"])
        assert (sw.occupancy, sw.state_occupancy) == (out["occupancy"], fwd["occupancy"])
        assert sw.operand_swap is False and sw.tma is True
        # one block_headdim switch serves both MMA stages: the two records agree on it at every headline shape
        assert sw.block_headdim == out["block_headdim"]
        assert all(cutile_tiles.tuned(s, "compute_out")["block_headdim"] ==
                   cutile_tiles.tuned(s, "fwd_pass_state")["block_headdim"] for s in lvt.SHAPES)
        # stage 2 as cuTile arranges it, descriptors built on the host
        assert (sw.state_pass, sw.tma_descriptors) == ("serial", "host")
        # OmegaConf wraps the resolver's ConfigError; the message names the record file and key
        with pytest.raises((conf.ConfigError, OmegaConfBaseException), match="no cuTile record for compute_out"):
            conf.validate(compose("config", overrides=["experiment=language_vs_trick", f"+lvt={arm}",
                                                       "shape=tiny"]))


def test_every_arm_validates_at_every_headline_shape():
    from hydra import compose, initialize_config_dir

    from harness import config as conf

    conf.register_schemas()
    conf.register_resolvers()
    arms = [p.stem for p in sorted((repo_root() / "conf" / "lvt").glob("*.yaml"))]
    with initialize_config_dir(config_dir=str(repo_root() / "conf"), version_base="1.3"):
        swept = compose("config", overrides=["experiment=language_vs_trick"], return_hydra_config=True)
        assert sorted(str(swept.hydra.sweeper.params["+lvt"]).split(",")) == arms
        for arm in arms:
            for shape in lvt.SHAPES:
                cfg = compose("config", overrides=["experiment=language_vs_trick", f"+lvt={arm}", f"shape={shape}"])
                _, sw = conf.validate(cfg)
                assert sw is not None and cfg.backend.name.name == arm.partition("_")[0], (arm, shape)


def test_figure_legend_reads_where_cutiles_tiles_came_from(synthetic):
    """A shape whose cuTile point ran on fallback tiles (no record on that card) is drawn and named so, never
    "tuned"; the title names the card, date and rows."""
    from analysis import figures

    w = lvt.load(synthetic)
    lang = lvt.language_table(w)
    lang.loc[lang["shape"] == "S2", "cuTile's tiles"] = "fallback"
    fig = lvt.figure(lang, figures.source_of(w, "results/x/language_vs_trick.parquet"))
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "cuTile, fallback tiles (S2)" in texts and not any("tuned" in t and "S2" in t for t in texts)
    s2 = [p for ax in fig.axes for p in ax.patches if p.get_gid() == "backend:cutile" and abs(p.get_x() - 0.6) < 1e-9]
    assert s2 and all(p.get_hatch() == lvt.FALLBACK_HATCH for p in s2)
    title = fig._suptitle.get_text().replace("\n", " ")
    assert "results/x/language_vs_trick.parquet" in title and all(g in title for g in set(w["gpu_name"].dropna()))
