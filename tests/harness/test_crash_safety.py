"""The results store survives a writer killed mid-write (SIGKILL): it still reads, and every completed point is
intact (each file is whole; half-written temporaries are never read)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pandas as pd

from harness import store

ROWS_PER_POINT = 400

WRITER = textwrap.dedent(f"""
    import sys
    from harness import store
    out = sys.argv[1]
    for i in range(100000):
        rows = [{{"run_id": f"p{{i}}", "stage": "forward", "metric": f"m{{k}}", "value": float(i), "status": "ok"}}
                for k in range({ROWS_PER_POINT})]
        store.write_rows(rows, out, f"point{{i:05d}}")
""")


def test_sigkill_mid_sweep_leaves_a_readable_store(tmp_path):
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], cwd=repo,
                            env={**os.environ, "PYTHONPATH": repo})
    deadline = time.time() + 120
    while len(store.parquet_files(tmp_path)) < 8 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL

    files = store.parquet_files(tmp_path)
    assert len(files) >= 8
    df = store.load(tmp_path)
    assert len(df) == len(files) * ROWS_PER_POINT  # every stored point complete, nothing partial
    for run_id, rows in df.groupby("run_id"):
        assert len(rows) == ROWS_PER_POINT
        assert (rows["value"] == float(run_id[1:])).all()
    assert list(df.columns) == list(store.COLUMNS)
    # a temporary the kill may have left behind is not a result
    leftovers = [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert all(p not in files for p in leftovers)
    merged = tmp_path.parent / "merged.parquet"
    store.write_atomic(df, merged)
    assert len(pd.read_parquet(merged)) == len(df)
