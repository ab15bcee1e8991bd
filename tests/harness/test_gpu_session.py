"""scripts/gpu_session.sh on the CPU: each invocation merges exactly the points it ran, and an override that would
send the points where the merge does not look is refused before anything runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_session.sh"


def session(tmp_path: Path, out: str, *args: str, overrides: str = "", **env_extra: str):
    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_MODE", "SWEEP_ROOT")}
    env.update(PYTHONPATH=str(REPO), PATH=f"{Path(sys.executable).parent}:{env['PATH']}", OUT=str(tmp_path / out),
               TMPDIR=str(tmp_path), SSD_TUNING_DIR=str(tmp_path / "tuning"), GPU_SESSION_BUDGET_S="300",
               **env_extra)
    env["SWEEP_OVERRIDES"] = overrides
    (tmp_path / "tuning").mkdir(exist_ok=True)
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)


def cpu_point(tmp_path: Path) -> str:
    """SWEEP_OVERRIDES for one quick point of the cpu experiment (the reference, one timed rep), logs in tmp_path."""
    return (f"backend=reference bench.cpu_warmup=0 bench.cpu_reps=1 logger.dir={tmp_path} "
            f"hydra.sweep.dir={tmp_path}/multirun")


def test_results_dir_override_is_refused(tmp_path):
    done = session(tmp_path, "out", "sweep", "cpu", overrides="backend=reference results_dir=/tmp/elsewhere")
    assert done.returncode == 2
    assert "results_dir" in done.stderr and "SWEEP_ROOT" in done.stderr
    assert not (tmp_path / "out" / "cpu.parquet").exists()


def test_each_call_merges_only_its_own_points(tmp_path):
    overrides = cpu_point(tmp_path)
    runs, groups = [], []
    for out in ("call1", "call2"):
        done = session(tmp_path, out, "sweep", "cpu", overrides=overrides)
        assert done.returncode == 0, done.stderr[-3000:]
        merged = pd.read_parquet(tmp_path / out / "cpu.parquet")
        assert set(merged["status"]) == {"ok"}
        runs.append(set(merged["run_id"]))
        groups.append(set(merged["run_group"]))
        assert (tmp_path / out / "tuning.tar.gz").exists()
    # the second call ran its point again instead of re-merging the first call's stored one
    assert len(runs[0]) == len(runs[1]) == 1 and runs[0] != runs[1]
    # each invocation is a run group of its own
    assert len(groups[0]) == len(groups[1]) == 1 and groups[0] != groups[1]


def test_a_given_sweep_root_resumes(tmp_path):
    overrides = cpu_point(tmp_path)
    root = str(tmp_path / "sweeps")
    first = session(tmp_path, "call1", "sweep", "cpu", overrides=overrides, SWEEP_ROOT=root)
    second = session(tmp_path, "call2", "sweep", "cpu", overrides=overrides, SWEEP_ROOT=root)
    assert first.returncode == 0 and second.returncode == 0, second.stderr[-3000:]
    one, two = (pd.read_parquet(tmp_path / c / "cpu.parquet") for c in ("call1", "call2"))
    assert set(one["run_id"]) == set(two["run_id"])  # the stored point was skipped, not timed again


def test_tests_matching_runs_exactly_the_selected_ids(tmp_path):
    """The tests_matching phase selects node ids by a regular expression over the collection (pytest's -k
    over-matched on the GPU image) and runs those: here GPU tests, which skip without CUDA; a pattern matching
    nothing stops the phase with status 2 before pytest runs."""
    done = session(tmp_path, "out", "tests_matching", r"ngroups8-tma-host", str(REPO / "tests/gpu/test_triton.py"),
                   GPU_TEST_WORKERS="0")
    log = (tmp_path / "out" / "session.log").read_text()
    assert done.returncode == 0, done.stdout + done.stderr
    ran = [line for line in log.splitlines() if "::test_triton_matches_float64[" in line and "SKIPPED" in line]
    assert len(ran) == 4 and all("[ngroups8-tma-host" in line for line in ran), log[-3000:]  # four tma-host variants
    none = session(tmp_path, "out2", "tests_matching", "no-such-test", str(REPO / "tests/gpu/test_triton.py"),
                   GPU_TEST_WORKERS="0")
    assert none.returncode == 2 and "matches no-such-test" in (tmp_path / "out2" / "session.log").read_text()


@pytest.mark.parametrize("given, expect", [
    ({}, ("sweep-1", 1)), ({"SSD_RUN_GROUP": "rounds-x", "SSD_ROUND": "3"}, ("rounds-x", 3)),
], ids=["plain-run", "from-the-scripts"])
def test_the_run_group_and_round_come_from_the_scripts(given, expect):
    from experiments.bench import run_identity

    assert run_identity("sweep-1", given) == expect


@pytest.mark.parametrize("bad", ["0", "two", "-1"])
def test_a_round_that_is_not_a_positive_integer_is_refused(bad):
    from experiments.bench import run_identity
    from harness.config import ConfigError

    with pytest.raises(ConfigError, match="SSD_ROUND"):
        run_identity("sweep-1", {"SSD_ROUND": bad})
