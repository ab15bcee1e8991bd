"""instruments.tuning_backfill: a record's versions come from the rows of the run that searched it, or it is flagged
versions_unverified; the committed records are all one or the other."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from impls import tuning
from instruments import tuning_backfill

KEY = "b8-l4096-h80-p64-g1-n128-c256|bfloat16|cb_precision=tf32"
ROW = {"backend": "cutile", "gpu_name": "NVIDIA H200", "dtype": "bfloat16", "batch": 8, "seqlen": 4096, "nheads": 80,
       "headdim": 64, "ngroups": 1, "dstate": 128, "chunk_size": 256, "v_cuda_tile": "1.7.0", "v_tileiras": "13.4.92",
       "v_triton": "3.6.0", "v_tilegym": "1.5.1", "driver": "580.159.04",
       "tuning": json.dumps({"chunk_cumsum": "record", "compute_out": "search"})}


def _setup(tmp_path, rows: list[dict], date="2026-12-03T18:57:15+00:00", kept=None):
    (tmp_path / "results" / "run").mkdir(parents=True)
    pd.DataFrame(rows).to_parquet(tmp_path / "results" / "run" / "autotune.parquet")
    record = {"config": {"block_rows": 64}, "date": date,
              "versions": kept or {"cuda.tile": "1.7.0", "torch": "2.11.0"}}
    path = tmp_path / "tuning" / "NVIDIA_H200" / "cutile_compute_out.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"backend": "cutile", "stage": "compute_out", "gpu": "NVIDIA H200",
                                "entries": {KEY: record}}))
    tuning_backfill.backfill(tmp_path / "results", tmp_path / "tuning")
    return json.loads(path.read_text())["entries"][KEY]


def test_versions_from_the_producing_run(tmp_path):
    record = _setup(tmp_path, [{**ROW, "timestamp": "2026-12-03T18:55:52+00:00"},
                               {**ROW, "timestamp": "2026-12-03T18:30:00+00:00", "v_tileiras": "13.3.0"}])
    assert record["versions"] == {"cuda-tile": "1.7.0", "tileiras": "13.4.92", "driver": "580", "torch": "2.11.0"}
    assert "versions_unverified" not in record
    assert record["versions_from"] == "results/run/autotune.parquet row of 2026-12-03T18:55:52+00:00"


@pytest.mark.parametrize("change", [
    pytest.param({"timestamp": "2026-12-03T19:00:00+00:00"}, id="row-after-the-record"),
    pytest.param({"timestamp": "2026-12-03T17:00:00+00:00"}, id="row-long-before"),
    pytest.param({"tuning": json.dumps({"compute_out": "record"})}, id="stage-not-searched"),
    pytest.param({"nheads": 64}, id="another-shape"),
    pytest.param({"v_tileiras": "absent"}, id="row-without-tileiras"),
    pytest.param({"v_cuda_tile": "1.6.0"}, id="row-disagrees-with-the-record"),
])
def test_no_producing_run_flags_unverified(tmp_path, change):
    record = _setup(tmp_path, [{**ROW, "timestamp": "2026-12-03T18:55:52+00:00", **change}])
    assert record["versions_unverified"] is True
    assert record["versions"]["cuda-tile"] == "1.7.0"  # what the record kept, under today's name


def test_committed_records_are_bound_or_flagged():
    for path in sorted((tuning.ROOT / "NVIDIA_H200").glob("*.json")):
        data = json.loads(path.read_text())
        for key, record in data["entries"].items():
            stack = tuning_backfill.stack(data["backend"])
            assert record.get("versions_unverified") or all(record["versions"].get(k) for k in stack), (path, key)
