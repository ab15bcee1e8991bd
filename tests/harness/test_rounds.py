"""scripts/rounds.sh on the CPU: every arm runs once per round, each round a run of its own (run_id) in one merged
Parquet, in round-major order; bad ROUNDS or an empty arms file are refused before anything runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "rounds.sh"


def rounds(tmp_path: Path, arms: str | None, rounds_env: str = "2", budget: str = "400", pick: str | None = None,
           first: str | None = None, group: str | None = None):
    arms_file = tmp_path / "arms.txt"
    if arms is not None:  # None: no such file
        arms_file.write_text(arms)
    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_MODE", "SWEEP_ROOT", "SWEEP_OVERRIDES")}
    env.update(PYTHONPATH=str(REPO), PATH=f"{Path(sys.executable).parent}:{env['PATH']}", OUT=str(tmp_path / "out"),
               TMPDIR=str(tmp_path), SSD_TUNING_DIR=str(tmp_path / "tuning"), GPU_SESSION_BUDGET_S=budget,
               ROUNDS=rounds_env)
    env.pop("ARMS", None)
    env.pop("FIRST_ROUND", None)
    if pick is not None:
        env["ARMS"] = pick
    if first is not None:
        env["FIRST_ROUND"] = first
    env.pop("SSD_RUN_GROUP", None)
    if group is not None:
        env["SSD_RUN_GROUP"] = group
    (tmp_path / "tuning").mkdir(exist_ok=True)
    return subprocess.run(["bash", str(SCRIPT), str(arms_file), "cpu"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)


def test_two_arms_two_rounds_interleaved(tmp_path):
    common = (f"bench.cpu_warmup=0 bench.cpu_reps=1 bench.stages=[forward] logger.dir={tmp_path} "
              f"hydra.sweep.dir={tmp_path}/multirun")
    arms = f"# a comment\nbackend=reference {common}\n\nbackend=reference {common} problem.dt_softplus=false\n"
    done = rounds(tmp_path, arms)
    assert done.returncode == 0, done.stderr[-3000:]
    merged = pd.read_parquet(tmp_path / "out" / "cpu.parquet")
    assert set(merged["status"]) == {"ok"}
    # two configurations, each measured in two runs
    per_config = merged.groupby("config_hash")["run_id"].nunique()
    assert len(per_config) == 2 and set(per_config) == {2}
    # one run group for the whole invocation, each row with its round
    assert merged["run_group"].nunique() == 1 and merged["run_group"].iloc[0].startswith("rounds-")
    points = merged.drop_duplicates("run_id")
    assert [sorted(r) for _, r in points.groupby("config_hash")["round"]] == [[1, 2], [1, 2]]
    log = (tmp_path / "out" / "session.log").read_text()
    order = [line.split("arm ")[1].split("'")[1].endswith("problem.dt_softplus=false")
             for line in log.splitlines() if line.startswith("== round ")]
    assert order == [False, True, False, True]


def test_arms_picks_some_arms_in_the_given_order(tmp_path):
    common = (f"bench.cpu_warmup=0 bench.cpu_reps=1 bench.stages=[forward] logger.dir={tmp_path} "
              f"hydra.sweep.dir={tmp_path}/multirun")
    arms = (f"backend=reference {common}\nbackend=reference {common} problem.dt_softplus=false\n"
            f"backend=reference {common} problem.dt_limit=[0.0,1.0]\n")
    done = rounds(tmp_path, arms, rounds_env="1", pick="3,1")
    assert done.returncode == 0, done.stderr[-3000:]
    log = (tmp_path / "out" / "session.log").read_text()
    ran = [line.split("arm ")[1] for line in log.splitlines() if line.startswith("== round ")]
    assert len(ran) == 2 and "dt_limit" in ran[0] and "problem." not in ran[1]
    assert pd.read_parquet(tmp_path / "out" / "cpu.parquet")["config_hash"].nunique() == 2


def test_first_round_continues_a_run_group(tmp_path):
    """FIRST_ROUND=2 ROUNDS=1 under a given run group: the rows say round 2 of that group (a later call on the same
    machine continues the rounds of an earlier one)."""
    common = (f"bench.cpu_warmup=0 bench.cpu_reps=1 bench.stages=[forward] logger.dir={tmp_path} "
              f"hydra.sweep.dir={tmp_path}/multirun")
    done = rounds(tmp_path, f"backend=reference {common}\n", rounds_env="1", first="2", group="group-of-two-calls")
    assert done.returncode == 0, done.stderr[-3000:]
    merged = pd.read_parquet(tmp_path / "out" / "cpu.parquet")
    assert set(merged["round"]) == {2} and set(merged["run_group"]) == {"group-of-two-calls"}
    assert "rounds 2..2" in (tmp_path / "out" / "session.log").read_text()


@pytest.mark.parametrize("pick", ["0", "4", "1,x", "1,,2"], ids=["zero", "past-the-end", "not-a-number", "empty"])
def test_arms_outside_the_file_refused(tmp_path, pick):
    done = rounds(tmp_path, "backend=reference\nbackend=reference\nbackend=reference\n", pick=pick)
    assert done.returncode == 2 and "ARMS=" in done.stderr, done.stderr
    assert not (tmp_path / "out" / "cpu.parquet").exists()


@pytest.mark.parametrize("arms, rounds_env, message", [
    ("backend=reference\n", "0", "ROUNDS"),
    ("backend=reference\n", "two", "ROUNDS"),
    ("backend=reference\n", "first:0", "FIRST_ROUND"),
    ("# only a comment\n\n", "2", "no arm"),
    (None, "2", "cannot read"),
], ids=["zero-rounds", "rounds-not-a-number", "first-round-zero", "no-arm", "no-arms-file"])
def test_refused_before_anything_runs(tmp_path, arms, rounds_env, message):
    first = rounds_env.removeprefix("first:") if rounds_env.startswith("first:") else None
    done = rounds(tmp_path, arms, "2" if first else rounds_env, first=first)
    assert done.returncode == 2 and message in done.stderr
    assert not (tmp_path / "out" / "cpu.parquet").exists()


def test_no_arm_in_time_leaves_no_stale_parquet(tmp_path):
    """With no time for any arm, $OUT/<experiment>.parquet is not an earlier call's rows left on a warm machine: this
    call merged nothing, so there is no such file (and the log says why)."""
    (tmp_path / "out").mkdir()
    pd.DataFrame({"run_id": ["earlier-call"]}).to_parquet(tmp_path / "out" / "cpu.parquet")
    done = rounds(tmp_path, "backend=reference\n", budget="10")
    assert done.returncode == 0, done.stderr[-3000:]
    log = (tmp_path / "out" / "session.log").read_text()
    assert "skipped, out of time" in log and "source: " in log
    assert not (tmp_path / "out" / "cpu.parquet").exists()


def test_arms_file_with_crlf_line_ends(tmp_path):
    """An arms file saved with Windows line ends: the carriage returns do not reach Hydra as part of a value."""
    common = (f"bench.cpu_warmup=0 bench.cpu_reps=1 bench.stages=[forward] logger.dir={tmp_path} "
              f"hydra.sweep.dir={tmp_path}/multirun")
    done = rounds(tmp_path, f"# comment\r\nbackend=reference {common}\r\n\r\n", rounds_env="1")
    assert done.returncode == 0, done.stderr[-3000:]
    merged = pd.read_parquet(tmp_path / "out" / "cpu.parquet")
    assert set(merged["status"]) == {"ok"} and merged["run_id"].nunique() == 1
