"""results/: folders named by date, machine and content, each with a README; results/index.yaml names the file of
each experiment, current (block-gated, one per question) or archive, and is the analysis's default; results/HEADLINE.md
and results/HEADLINE-<gpu>.md are what `python -m analysis.headline` and `python -m analysis.front_page` make of the
committed rows."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from analysis import headline
from analysis.load import MixedRuns, load_results, resolve_results, results_index
from harness import store

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"
FOLDERS = sorted(p for p in RESULTS.iterdir() if p.is_dir() and p.name != "scratch")
PARQUETS = sorted(RESULTS.glob("*/*.parquet"))


@pytest.mark.parametrize("folder", [pytest.param(p, id=p.name) for p in FOLDERS])
def test_folder_is_named_by_date_and_machine_and_described(folder):
    """<date>-<machine>-<what>, with a README of its own (machine, software, commands, what the rows show)."""
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}-[a-z0-9]+-[a-z0-9-]+", folder.name), folder.name
    assert (folder / "README.md").is_file(), f"{folder.name} has no README.md"


def test_every_index_entry_exists():
    missing = {k: v for k, v in results_index(ROOT).items() if not (RESULTS / v).is_file()}
    assert not missing


@pytest.mark.parametrize("path", [pytest.param(p, id=f"{p.parent.name}/{p.name}") for p in PARQUETS])
def test_committed_parquet_loads(path):
    df = pd.read_parquet(path)
    assert len(df)
    # results rows (profile.ncu.parquet is Nsight Compute's own table, *.curves.parquet the loss curves')
    if "run_id" in df.columns and not path.name.endswith(store.OTHER_TABLES):
        assert len(store.conform(df)) == len(df)


def test_the_default_source_is_the_current_headline(monkeypatch):
    monkeypatch.delenv("SSD_RESULTS", raising=False)
    assert resolve_results() == str(RESULTS / results_index(ROOT)["headline"])
    frame = load_results()
    assert set(frame["backend"]) == set(pd.read_parquet(RESULTS / results_index(ROOT)["headline"])["backend"])
    assert {"cutile", "triton", "mamba_ssm"} <= set(frame["backend"])


def test_an_unknown_experiment_names_the_known_ones():
    with pytest.raises(FileNotFoundError, match="expected experiments of results/index.yaml .*headline"):
        resolve_results("index:nope")


def test_committed_headline_table_matches_the_rows():
    assert (ROOT / headline.OUTPUT).read_text() == headline.render(ROOT), "run python -m analysis.headline"


GENERATED_TABLES = sorted(p for name in ("forward", "backward", "kernels") for p in RESULTS.glob(f"*/{name}*.md"))


@pytest.mark.parametrize("path", [pytest.param(p, id=f"{p.parent.name}/{p.name}") for p in GENERATED_TABLES])
def test_a_folder_s_generated_table_matches_its_rows(path):
    """Each results/*/{forward,backward,kernels}*.md is what the command on its first line makes of the folder's
    committed rows."""
    from analysis import forward_table

    assert forward_table.main(["--check", str(path.relative_to(ROOT))]) == 0, "regenerate it (its first line)"


def test_an_edited_generated_table_fails_its_check(tmp_path):
    from analysis import forward_table

    source = GENERATED_TABLES[0]
    edited = tmp_path / "forward.md"
    edited.write_text(source.read_text().replace("[", "[9", 1))
    assert forward_table.main(["--check", str(edited)]) == 1


def test_a_point_on_borrowed_or_fallback_tiles_says_so_in_its_cell():
    """Each cell names where its point's tiles came from unless they were all searched for its own code (2026-12-07:
    the trick arms borrow the defaults' records, inner_chunk's inner stages ran on fallback tiles)."""
    from analysis import forward_table

    folder = "results/2026-12-07-h100-switches-backward-first"
    (table,) = forward_table.tables([f"{folder}/switches_s1_s3.parquet"]).values()
    cutile = table.loc[[label for label in table.index if label.startswith("cutile")]]
    assert cutile.loc["cutile[inner_chunk:128]", "S1"].endswith(", tiles retuned+fallback")
    assert cutile.loc["cutile[exp2_ftz:True]", "S1"].endswith(", tiles retuned+pinned")
    assert "tiles" not in cutile.loc["cutile{heads_first=True,pdl=True,skip_first=True}", "S1"]


def test_a_stage_no_point_timed_is_refused():
    from analysis import forward_table

    files = [str(p) for p in sorted((RESULTS / "2026-12-05-h100-chunk-programs").glob("headline.parquet"))]
    with pytest.raises(ValueError, match="stage 'compute_out': no timed point"):
        forward_table.tables(files, stage="compute_out")


def test_backward_directions_and_their_kernels_have_tables(tmp_path):
    """--stage forward_backward reads the backward points' rows; --stage kernels a row per (point, kernel) from the
    backward's kernel:<name> stages, each cell with the kernel's share of the call (rows planted on a committed
    point: no GPU run has written kernel rows yet); an unknown stage is refused naming --stage."""
    import pandas as pd

    from analysis import forward_table

    source = RESULTS / "2026-12-07-h100-switches-backward-first" / "forward_backward.parquet"
    (table,) = forward_table.tables([str(source.relative_to(ROOT))], stage="forward_backward").values()
    assert table.loc["mamba_ssm", "S1"].startswith("7.397 [7.394, 7.402]")
    long = pd.read_parquet(source)
    point = long[(long["backend"] == "mamba_ssm") & (long["shape_name"] == "S1") & (long["stage"] == "backward")
                 & long["metric"].isin(["median_ms", "p20_ms", "p80_ms"])]
    kernels = []
    for kernel, scale, share in (("_chunk_scan_bwd_dx_kernel", 0.25, 25.0), ("_chunk_state_bwd_db_kernel", 0.1, 10.0)):
        k = point.assign(stage=f"kernel:{kernel}", value=point["value"] * scale)
        kernels += [k, k.iloc[:1].assign(metric="share_pct", value=share, unit="%")]
    pd.concat([long, *kernels], ignore_index=True).to_parquet(tmp_path / "kernels.parquet")
    (table,) = forward_table.tables(["kernels.parquet"], stage="kernels", root=tmp_path).values()
    assert table.loc["mamba_ssm · _chunk_scan_bwd_dx_kernel", "S1"].startswith("1.44")
    assert ", 25 % of the call" in table.loc["mamba_ssm · _chunk_scan_bwd_dx_kernel", "S1"]
    with pytest.raises(ValueError, match="--stage: expected one of"):
        forward_table.tables([str(source.relative_to(ROOT))], stage="sideways")


def test_the_kernels_table_reads_launched_names_short_and_apart(tmp_path):
    """The kernels' rows of 2026-12-07 on an H100: cuTile's specialised names read as the function's, C++ templates
    keep their leading numeric arguments and a lambda's types, two kernels that would read the same are numbered
    within their point (never joined into one cell), and each point's kernels appear once."""
    from analysis import forward_table

    assert forward_table.kernel_label("bwd_chunk_kernel_Kt2_A4bf16_7v8l0_8t1_ei16_p16_Si32_B0") == "bwd_chunk_kernel"
    assert forward_table.kernel_label("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<double, at::native"
                                      "::func_wrapper_t<double, {lambda(double, double)#1}>, unsigned int>>(x)") == (
        "at::native::reduce_kernel<512, 1, …> [double, double]")
    assert forward_table.kernel_labels(["k<4, a{lambda()#1}>", "k<4, b{lambda()#2}>", "bwd_db_kernel"]) == {
        "bwd_db_kernel": "bwd_db_kernel", "k<4, a{lambda()#1}>": "k<4, …> #1", "k<4, b{lambda()#2}>": "k<4, …> #2"}
    import pandas as pd

    source = RESULTS / "2026-12-07-h100-backward-gate-abba" / "backward_kernels_s1.parquet"
    (table,) = forward_table.tables([str(source.relative_to(ROOT))], stage="kernels").values()
    cutile = [label for label in table.index if label.startswith("cutile")]
    assert any(label.endswith(" · bwd_chunk_kernel") for label in cutile), cutile
    assert all(" · " not in cell for cell in table["S1"]), "two kernels joined into one cell"
    # the same kernels at a second shape, where cuTile's specialised names differ (I256 → I128): one row each still
    long = pd.read_parquet(source)
    other = long.assign(shape_name="S2", run_id=long["run_id"] + "-S2",
                        stage=long["stage"].str.replace("_I256_", "_I128_", regex=False))
    pd.concat([long, other], ignore_index=True).to_parquet(tmp_path / "two_shapes.parquet")
    (table,) = forward_table.tables(["two_shapes.parquet"], stage="kernels", root=tmp_path).values()
    chunk = [label for label in table.index if label.startswith("cutile") and "bwd_chunk_kernel" in label]
    assert chunk == [label for label in cutile if "bwd_chunk_kernel" in label], chunk
    assert table.loc[chunk[0]].notna().all(), table.loc[chunk[0]]


# --- the index's two sections and the front pages -------------------------------------------------------------
def test_every_index_name_resolves_in_either_section():
    """`index:<name>` finds current and archive entries alike (names the code, the claims and the notebooks use)."""
    from analysis.load import index_sections

    sections = index_sections(ROOT)
    assert sections["current"] and sections["archive"]
    for name in ("headline", "ablate_triton", "headline_fair_fight", "headline_h100_chunk_programs",
                 "ablate_cutile_v13_v17", "headline_five_backends"):
        assert resolve_results(f"index:{name}").endswith(".parquet"), name


def test_rows_gated_on_the_whole_tensor_only_are_archive():
    """A current entry's rows carry the block-wise gate's worst block (`block_err`); rows from before it are archive."""
    from analysis.load import index_sections

    for name, path in index_sections(ROOT)["current"].items():
        if path.endswith(".parquet") and not path.endswith(store.OTHER_TABLES):
            assert (pd.read_parquet(RESULTS / path, columns=["metric"])["metric"] == "block_err").any(), name


def test_committed_front_pages_match_their_rows():
    from analysis import front_page

    assert front_page.main(["--check"]) == 0, "run python -m analysis.front_page"


def _front_page_root(tmp_path, rows: pd.DataFrame | None) -> Path:
    (tmp_path / "results").mkdir(parents=True)
    (tmp_path / "pyproject.toml").write_text("")
    index = "current:\n  headline: run/headline.parquet\narchive: {}\n"
    if rows is not None:
        store.write_atomic(rows, tmp_path / "results" / "run" / "headline.parquet")
        index = "current:\n  front_page_h200: run/headline.parquet\narchive: {}\n"
    (tmp_path / "results" / "index.yaml").write_text(index)
    return tmp_path


def _tilegym_at(rows: pd.DataFrame, chunk: int, shape_name: str, scale: float) -> pd.DataFrame:
    """The fixture's cuTile S1 point as a TileGym point at `chunk`, its times scaled."""
    import uuid

    t = rows[(rows["backend"] == "cutile") & (rows["shape_name"] == "S1")].copy()
    timed = t["metric"].isin(["median_ms", "p20_ms", "p80_ms", "graph_median_ms"])
    t.loc[timed, "value"] *= scale
    return t.assign(backend="tilegym", switches="{}", chunk_size=chunk, shape_name=shape_name,
                    config_hash=uuid.uuid4().hex[:16], run_id=uuid.uuid4().hex, tuning="none")


def test_a_front_page_regenerates_from_its_run(tmp_path):
    """The synthetic H200 run: each backend's defaults point and its best, a peer's best at its own chunk (TileGym at
    128 although its point at 256 is faster), the backends the run lacks named at the top."""
    from analysis import front_page

    fixture = pd.read_parquet(ROOT / "tests" / "fixtures" / "h200_synthetic.parquet")
    rows = fixture[fixture["sweep_name"].isin(["headline", "ablate_cutile"])]
    rows = rows.assign(switches=rows["switches"].where(rows["ablation"] != "none", "{}"))  # the declared defaults
    rows = pd.concat([rows, _tilegym_at(rows, 256, "S1", 0.5), _tilegym_at(rows, 128, "S1_c128", 2.0)])
    root = _front_page_root(tmp_path, rows)
    text = front_page.render(front_page.page_of("h200", root), root)
    t = front_page.standings(front_page.wide(root / "results" / "run" / "headline.parquet")).set_index(
        ["shape", "backend", "point"])
    assert t.loc[("S1", "tilegym", "best"), "chunk"] == "128" and t.loc[("S1", "tilegym", "defaults"), "chunk"] == "256"
    assert t.loc[("S1", "mamba_ssm", "defaults, best"), "settings"] == "defaults"  # its one point
    assert "transposed_layout=False" not in set(t.xs("defaults", level="point", drop_level=False)["settings"])
    assert "Not in this run: vllm, fla" in text and "`synthetic` on GPU-synthetic" in text
    both = rows.assign(run_group=["synthetic", "other"] * (len(rows) // 2) + ["other"] * (len(rows) % 2))
    root2 = _front_page_root(tmp_path / "two", both)
    with pytest.raises(MixedRuns, match="run_group: other, synthetic"):
        front_page.render(front_page.page_of("h200", root2), root2)


def test_a_model_without_a_current_run_says_so_at_the_top(tmp_path):
    from analysis import front_page

    root = _front_page_root(tmp_path, None)
    lines = front_page.render(front_page.page_of("h200", root), root).splitlines()
    assert lines[0] == "# Where things stand: NVIDIA H200"
    assert lines[2].startswith("**No current run on NVIDIA H200**") and "front_page_h200" in lines[2]


def test_committed_status_page_matches_the_rows():
    """docs/STATUS.md is what `python -m analysis.status` makes of the current runs (one card, one run per table)."""
    from analysis import status

    assert (ROOT / status.OUTPUT).read_text() == status.render(ROOT), "run python -m analysis.status"


def test_the_status_page_names_each_card_s_run_and_its_fastest_point():
    from analysis import front_page, status

    text = status.render(ROOT)
    for slug, gpu in front_page.MODELS.items():
        source = front_page.page_of(slug, ROOT).source
        assert f"## {gpu}" in text and (f"`results/{source}`" in text if source else "No current run" in text)

