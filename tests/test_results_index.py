"""results/: folders named by date, machine and content, each with a README; results/index.yaml names the current
file of each experiment and is the analysis's default; results/HEADLINE.md is what `python -m analysis.headline`
makes of the committed rows."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from analysis import headline
from analysis.load import load_results, resolve_results, results_index
from experiments import store

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
FOLDERS = sorted(p for p in RESULTS.iterdir() if p.is_dir() and p.name != "scratch")
PARQUETS = sorted(RESULTS.glob("*/*.parquet"))


@pytest.mark.parametrize("folder", [pytest.param(p, id=p.name) for p in FOLDERS])
def test_folder_is_named_by_date_and_machine_and_described(folder):
    """<date>-<machine>-<what>, with a README of its own or described in another folder's README."""
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}-[a-z0-9]+-[a-z0-9-]+", folder.name), folder.name
    assert (folder / "README.md").is_file() or any(folder.name in p.read_text() for p in RESULTS.glob("*/README.md"))


def test_every_index_entry_exists():
    missing = {k: v for k, v in results_index(ROOT).items() if not (RESULTS / v).is_file()}
    assert not missing


@pytest.mark.parametrize("path", [pytest.param(p, id=f"{p.parent.name}/{p.name}") for p in PARQUETS])
def test_committed_parquet_loads(path):
    df = pd.read_parquet(path)
    assert len(df)
    if "run_id" in df.columns:  # results rows (profile.ncu.parquet is Nsight Compute's own table)
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


GENERATED_TABLES = sorted(RESULTS.glob("*/forward*.md"))


@pytest.mark.parametrize("path", [pytest.param(p, id=f"{p.parent.name}/{p.name}") for p in GENERATED_TABLES])
def test_a_folder_s_generated_table_matches_its_rows(path):
    """Each results/*/forward*.md is what the command on its first line makes of the folder's committed rows."""
    from analysis import forward_table

    assert forward_table.main(["--check", str(path.relative_to(ROOT))]) == 0, "regenerate it (its first line)"


def test_an_edited_generated_table_fails_its_check(tmp_path):
    from analysis import forward_table

    source = GENERATED_TABLES[0]
    edited = tmp_path / "forward.md"
    edited.write_text(source.read_text().replace("[", "[9", 1))
    assert forward_table.main(["--check", str(edited)]) == 1


def test_a_stage_no_point_timed_is_refused():
    from analysis import forward_table

    files = [str(p) for p in sorted((RESULTS / "2026-12-05-h100-chunk-programs").glob("headline.parquet"))]
    with pytest.raises(ValueError, match="stage 'compute_out': no timed point"):
        forward_table.tables(files, stage="compute_out")
