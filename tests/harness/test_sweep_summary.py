"""The end-of-sweep summary (harness/callbacks.py): each point's rows come from the file its job wrote (or, for a
skipped job, the file the skip rule found), never from another run of the same config in the results folder."""

from __future__ import annotations

import json
import math

import pandas as pd

from harness import callbacks, store


def _rows(status: str, median: float | None, code_key: str, timestamp: str) -> pd.DataFrame:
    base = {"config_hash": "h1", "code_key": code_key, "backend": "cutile", "ablation": "none", "shape_name": "S1",
            "dtype": "bfloat16", "status": status, "error": None if status == "ok" else "RuntimeError: boom",
            "timestamp": timestamp}
    rows = [{**base, "stage": "point", "metric": "ok", "value": float(status == "ok")}]
    if median is not None:
        rows.append({**base, "stage": "forward", "metric": "median_ms", "value": median})
    return pd.DataFrame(rows)


def test_a_failed_point_is_reported_failed_beside_an_older_ok_run(tmp_path):
    old = store.write_atomic(_rows("ok", 1.234, "old-code", "2026-12-01T00:00:00"), tmp_path / "old.parquet")
    new = store.write_atomic(_rows("failed", None, "new-code", "2026-12-05T00:00:00"), tmp_path / "new.parquet")
    markers = [{"config_hash": "h1", "status": "failed", "file": str(new), "results_dir": str(tmp_path)}]
    table = callbacks.summary_table(callbacks.marker_rows(markers))
    assert len(table) == 1 and table["status"].iloc[0] == "failed" and table["from"].iloc[0] == "this sweep"
    assert math.isnan(table["fwd_median_ms"].iloc[0])  # not the old run's 1.234
    assert old.exists()


def test_a_skipped_point_reads_the_file_its_skip_rule_found(tmp_path):
    stored = store.write_atomic(_rows("ok", 0.5, "k", "2026-12-05T00:00:00"), tmp_path / "stored.parquet")
    markers = [{"config_hash": "h1", "status": "skipped", "file": str(stored), "results_dir": str(tmp_path)}]
    table = callbacks.summary_table(callbacks.marker_rows(markers))
    assert table["fwd_median_ms"].iloc[0] == 0.5 and table["from"].iloc[0] == "stored earlier"
    assert store.measured_file(tmp_path, "h1", "k") == stored
    assert store.measured_file(tmp_path, "h1", "other-code") is None


def test_a_single_point_prints_its_summary_with_the_backward(tmp_path, capsys):
    rows = pd.concat([_rows("ok", 0.5, "k", "2026-12-05T00:00:00"),
                      _rows("ok", None, "k", "2026-12-05T00:00:00").assign(stage="backward", metric="median_ms",
                                                                            value=1.25)])
    stored = store.write_atomic(rows, tmp_path / "point.parquet")
    job = tmp_path / "outputs" / "run"
    job.mkdir(parents=True)
    marker = {"config_hash": "h1", "status": "ok", "file": str(stored), "results_dir": str(tmp_path)}
    (job / "point.json").write_text(json.dumps(marker))
    callbacks.print_summary(str(job), "point adhoc")
    printed = capsys.readouterr().out
    assert "[bench] point adhoc: 1 points, 0 failed" in printed and "bwd_median_ms" in printed and "1.25" in printed
