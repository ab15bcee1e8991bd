"""Parquet store: atomic writes, resumability index, merge round trip; sync replays local rows into W&B."""

import json
import os
from pathlib import Path

import pandas as pd
import pytest

from experiments import merge, sync
from harness import store

pytestmark = pytest.mark.quick  # the quick tier: pytest -m quick


def rows(run_id, n, logger="local", backend="reference"):
    base = {"schema_version": 1, "run_id": run_id, "sweep_id": "sw", "sweep_name": "t", "job_num": 0,
            "timestamp": "2026-01-01T00:00:00+00:00", "config_hash": f"h{run_id}", "status": "ok",
            "backend": backend, "logger": logger, "config": "backend:\n  name: reference\nseed: 0\n",
            "shape_name": "tiny", "batch": 2, "seqlen": 96, "git_dirty": False, "code_key": "code-1"}
    return [{**base, "stage": "forward", "metric": f"m{i}", "value": float(i), "unit": "ms"} for i in range(n)]


def test_write_is_atomic_and_typed(tmp_path):
    path = store.write_rows(rows("a", 3), tmp_path, "a")
    assert [p.name for p in tmp_path.iterdir()] == ["a.parquet"]  # no temporary file left
    df = pd.read_parquet(path)
    assert list(df.columns) == list(store.COLUMNS) and len(df) == 3
    assert df["gpu_name"].isna().all()  # absent provenance is null, never an error


@pytest.mark.parametrize("fails_at", ["to_parquet", "replace"])
def test_a_write_that_raises_leaves_no_partial_file(tmp_path, monkeypatch, fails_at):
    store.write_rows(rows("a", 3), tmp_path, "a")
    before = (tmp_path / "a.parquet").read_bytes()

    def broken(*args, **kwargs):
        if fails_at == "to_parquet":
            Path(args[1] if len(args) > 1 else args[0]).write_bytes(b"PAR1 half")  # a partial file, then the error
        raise OSError("No space left on device")

    if fails_at == "to_parquet":
        monkeypatch.setattr(pd.DataFrame, "to_parquet", lambda self, path, **kw: broken(self, path))
    else:
        monkeypatch.setattr(store.os, "replace", broken)
    with pytest.raises(OSError, match="No space left"):
        store.write_rows(rows("b", 2), tmp_path, "a")
    assert [p.name for p in tmp_path.iterdir()] == ["a.parquet"] and (tmp_path / "a.parquet").read_bytes() == before


def test_stored_points_and_merge_round_trip(tmp_path):
    store.write_rows(rows("a", 3), tmp_path / "sweep", "a")
    store.write_rows(rows("b", 2), tmp_path / "sweep" / "sub", "b")
    assert store.stored_points(tmp_path / "sweep") == {("ha", "code-1", "ok"), ("hb", "code-1", "ok")}
    target = tmp_path / "merged.parquet"
    assert merge.merge(tmp_path / "sweep", target) == (5, 2)
    merged = pd.read_parquet(target)
    parts = store.load(tmp_path / "sweep")
    pd.testing.assert_frame_equal(merged.sort_values(["run_id", "metric"]).reset_index(drop=True),
                                  parts.sort_values(["run_id", "metric"]).reset_index(drop=True))
    merge.main([str(tmp_path / "sweep"), str(tmp_path / "again.parquet")])
    assert len(pd.read_parquet(tmp_path / "again.parquet")) == 5


@pytest.mark.parametrize("code_key, status, retry_failed, skipped", [
    pytest.param("code-1", "ok", True, True, id="same-code-ok-skipped"),
    pytest.param("code-2", "ok", True, False, id="other-code-measured"),
    pytest.param("code-1", "failed", True, False, id="failed-retried"),
    pytest.param("code-1", "failed", False, True, id="failed-kept-without-retry"),
])
def test_a_point_is_skipped_only_when_config_and_code_match(tmp_path, code_key, status, retry_failed, skipped):
    store.write_rows([{**r, "status": status} for r in rows("a", 2)], tmp_path, "a")
    assert store.already_measured(tmp_path, "ha", code_key, retry_failed) is skipped
    assert not store.already_measured(tmp_path, "hz", "code-1", retry_failed)


def test_committed_results_of_every_schema_version_still_load():
    """Files written before version 4 (with `tf32`, without precision/code_key/note) load with the new columns
    null, and so do those before version 5 (without run_group and round)."""
    root = Path(__file__).resolve().parents[2] / "results"
    files = sorted(root.glob("*/*.parquet"))
    files = [f for f in files if not f.name.endswith(store.OTHER_TABLES)]
    assert files
    for f in files[:6]:
        df = store.load(f)
        assert list(df.columns) == list(store.COLUMNS) and len(df)
        assert df["code_key"].isna().all()
        assert df["run_group"].isna().all() and df["round"].isna().all()


def test_sync_replays_local_rows_offline(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    fixture = tmp_path / "fixture.parquet"
    store.write_atomic(store.frame(rows("a", 4) + rows("b", 2, logger="wandb")), fixture)
    monkeypatch.chdir(tmp_path)
    runs = sync.sync(fixture, directory=tmp_path)
    assert len(runs) == 1  # only the point logged without W&B
    (run,) = (tmp_path / "wandb").glob("offline-run-*")
    (record,) = run.glob("run-*.wandb")  # offline runs keep the config in their record log
    assert b"reference" in record.read_bytes() and b"seed" in record.read_bytes()
    (table,) = (run / "files" / "media" / "table").glob("*.table.json")
    assert len(json.loads(table.read_text())["data"]) == 4
    assert os.path.exists(run)


def test_profile_tables_beside_results_are_not_read_as_rows(tmp_path):
    """instruments/profile.py writes *.ncu.parquet, instruments/step_profile.py *.step_profile.parquet (other tables)
    into result folders; load skips them, and a foreign Parquet file under any other name still fails loudly."""
    store.write_rows(rows("a", 3), tmp_path, "a")
    pd.DataFrame({"backend": ["cutile"], "kernel": ["k"], "metric": ["duration_ns"], "value": [1.0]}).to_parquet(
        tmp_path / "profile.ncu.parquet")
    pd.DataFrame({"backend": ["cutile"], "direction": ["forward"], "share": [0.3]}).to_parquet(
        tmp_path / "lm.step_profile.parquet")
    assert len(store.load(tmp_path)) == 3
    pd.DataFrame({"backend": ["cutile"]}).to_parquet(tmp_path / "stray.parquet")
    with pytest.raises(ValueError, match="lack schema columns"):
        store.load(tmp_path)


def test_merge_refuses_what_would_lose_or_double_rows(tmp_path, capsys):
    """A missing or empty source never overwrites a merged file with no rows; a target inside the source (which a
    second merge would read back) is refused; the error names the argument."""
    store.write_rows(rows("a", 3), tmp_path / "sweep", "a")
    target = tmp_path / "merged.parquet"
    merge.merge(tmp_path / "sweep", target)
    before = target.read_bytes()
    (tmp_path / "empty").mkdir()
    for source in (tmp_path / "empty", tmp_path / "typo"):
        with pytest.raises(merge.MergeError, match="^source: "):
            merge.merge(source, target)
        assert target.read_bytes() == before
    with pytest.raises(merge.MergeError, match="^target: .* is inside source"):
        merge.merge(tmp_path / "sweep", tmp_path / "sweep" / "merged.parquet")
    assert not (tmp_path / "sweep" / "merged.parquet").exists()
    with pytest.raises(SystemExit):
        merge.main([str(tmp_path / "empty"), str(target)])
    assert "source: no Parquet files" in capsys.readouterr().err and target.read_bytes() == before
