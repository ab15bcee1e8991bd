"""scripts/study.sh on the CPU, with the GPU's name and the two scripts it drives stubbed: what it runs in which order,
under one run group and sweep root, per card."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STUB = """#!/usr/bin/env bash
echo "$(basename "$0") $* | group=${SSD_RUN_GROUP:-} root=${SWEEP_ROOT:-} first=${FIRST_ROUND:-} rounds=${ROUNDS:-} \
arms=${ARMS:-} overrides=${SWEEP_OVERRIDES:-}" >> "$CALLS"
"""


def study(tmp_path: Path, gpu: str, *steps: str, budget: str = "585") -> list[str]:
    """Runs the committed study.sh with these steps in a copy of scripts/ whose two driven scripts and nvidia-smi are
    stubs (made once per test, so later calls see the earlier ones' sweep root); -> every stub call so far."""
    scripts, bin_dir = tmp_path / "scripts", tmp_path / "bin"
    if not scripts.exists():
        shutil.copytree(REPO / "scripts" / "arms", scripts / "arms")
        shutil.copy(REPO / "scripts" / "study.sh", scripts / "study.sh")
        bin_dir.mkdir()
        for name, text in (("gpu_session.sh", STUB), ("rounds.sh", STUB),
                           ("nvidia-smi", f"#!/usr/bin/env bash\necho '{gpu}'\n")):
            path = (bin_dir if name == "nvidia-smi" else scripts) / name
            path.write_text(text)
            path.chmod(0o755)
    calls = tmp_path / "calls.txt"
    env = {k: v for k, v in os.environ.items()
           if k not in ("SSD_RUN_GROUP", "SWEEP_ROOT", "ROUNDS", "ARMS", "SEARCH_SHAPES", "STUDY_ARMS")}
    env.update(PATH=f"{bin_dir}:{env['PATH']}", OUT=str(tmp_path / "out"), TMPDIR=str(tmp_path), CALLS=str(calls),
               GPU_SESSION_BUDGET_S=budget)
    done = subprocess.run(["bash", str(scripts / "study.sh"), *steps], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return calls.read_text().splitlines() if calls.exists() else []


STEPS = ("search", "unseen", "round1", "round2", "round3", "slow")


@pytest.mark.parametrize("gpu, searched, arms", [
    ("NVIDIA H100 80GB HBM3", "S2,S3,S4", ("", "", "", "", "")),
    ("NVIDIA H200", "S1,S2,S3,S4", ("1,2,3", "1,2,3,4", "1,2,3,4", "1,2,3,4", "")),
], ids=["h100", "h200"])
def test_search_then_rounds_in_one_run_group_over_calls(tmp_path, gpu, searched, arms):
    """The steps split over three calls on one machine: the search first, then one run group and one sweep root for
    every round, the rounds numbered 1-3 (the shapes without records and the slow peers in round 1)."""
    study(tmp_path, gpu, "search", "unseen")
    study(tmp_path, gpu, "round1")
    calls = study(tmp_path, gpu, "round2", "round3", "slow")
    assert calls[0].startswith("gpu_session.sh sweep autotune") and f"shape={searched} " in calls[0]
    assert "tuning=resume" in calls[0]
    timed = calls[1:]
    files = [c.split()[1].rsplit("/", 1)[1] for c in timed]
    assert files == ["study_unseen.txt", "study.txt", "study.txt", "study.txt", "study_peers_slow.txt"]
    fields = [dict(f.split("=", 1) for f in c.split("| ")[1].split() if "=" in f) for c in timed]
    assert len({f["group"] for f in fields}) == 1 and len({f["root"] for f in fields}) == 1
    assert fields[0]["group"].startswith("study-") and fields[0]["group"].endswith(gpu.split()[1].lower())
    assert [(f["first"], f["rounds"]) for f in fields] == [("1", "1"), ("1", "1"), ("2", "1"), ("3", "1"), ("1", "1")]
    assert tuple(f.get("arms", "") for f in fields) == arms


def test_steps_without_time_are_skipped_and_unknown_steps_refused(tmp_path):
    assert study(tmp_path, "NVIDIA H100 80GB HBM3", *STEPS, budget="20") == []
    assert "step round3: skipped, out of time" in (tmp_path / "out" / "study.log").read_text()
    for bad in ([], ["round4"]):
        env = {**os.environ, "OUT": str(tmp_path / "bad")}
        done = subprocess.run(["bash", str(REPO / "scripts" / "study.sh"), *bad], env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 2 and ("usage" in done.stderr or "round4" in done.stderr)
