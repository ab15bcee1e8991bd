"""analysis.before_after: a point holds within max(2 %, the before-run's p20–p80 spread), and a point missing from
one run is reported, not dropped."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis import before_after
from analysis.load import TIMED_STAGES


def _wide(points, label_suffix="", gpu="NVIDIA H200"):
    return pd.DataFrame([{"label": b + label_suffix, "dtype": "bfloat16", "shape_name": s, "stage": st,
                          "gpu_name": gpu,
                          "status": "ok", "run_id": f"r{i}", "median_ms": m, "p20_ms": m - spread / 2,
                          "p80_ms": m + spread / 2} for i, (b, s, st, m, spread) in enumerate(points)])


def test_variants_of_one_backend_are_compared_apart_not_pooled():
    """Two ablation variants in one sweep: each is its own point, so a 50 % slowdown of one is not hidden by the
    spread between the variants."""
    before = pd.concat([_wide([("cutile", "S1", "forward", 1.0, 0.001)]),
                        _wide([("cutile", "S1", "forward", 2.0, 0.001)], " tma=False")])
    after = pd.concat([_wide([("cutile", "S1", "forward", 1.0, 0.001)]),
                       _wide([("cutile", "S1", "forward", 3.0, 0.001)], " tma=False")])
    cmp = before_after.compare(before, after)
    assert dict(zip(cmp["label"], cmp["verdict"])) == {"cutile": "holds", "cutile tma=False": "differs"}
    assert set(cmp["rounds_before"]) == {1}


def test_rounds_pool_by_their_median_and_their_range_widens_the_allowance():
    """Two before-rounds 1.00 and 1.10 ms (narrow spreads): the before-figure is 1.05 and the allowance the rounds'
    range, 0.10 / 1.05; an after-figure of 1.12 holds, 1.20 does not."""
    before = _wide([("cutile", "S4", "forward", 1.00, 0.001), ("cutile", "S4", "forward", 1.10, 0.001)])
    for after_ms, verdict in ((1.12, "holds"), (1.20, "differs")):
        cmp = before_after.compare(before, _wide([("cutile", "S4", "forward", after_ms, 0.001)]))
        row = cmp.iloc[0]
        assert row["median_ms_before"] == pytest.approx(1.05) and row["allowance"] == pytest.approx(0.10 / 1.05)
        assert (row["verdict"], row["rounds_before"], row["rounds_after"]) == (verdict, 2, 1)


@pytest.mark.parametrize("after_ms,verdict", [
    pytest.param(1.015, "holds", id="within-2pct"),
    pytest.param(1.025, "differs", id="past-2pct"),
    pytest.param(0.97, "differs", id="faster-past-2pct"),
])
def test_two_percent_floor(after_ms, verdict):
    cmp = before_after.compare(_wide([("cutile", "S1", "forward", 1.0, 0.001)]),
                               _wide([("cutile", "S1", "forward", after_ms, 0.001)]))
    assert cmp["verdict"].tolist() == [verdict]


def test_a_wide_before_spread_widens_the_allowance():
    cmp = before_after.compare(_wide([("mamba_ssm", "S4", "forward", 1.0, 0.10)]),
                               _wide([("mamba_ssm", "S4", "forward", 1.06, 0.01)]))
    assert cmp["verdict"].tolist() == ["holds"] and cmp["allowance"].iloc[0] == pytest.approx(0.10)


def test_a_point_in_one_run_only_is_missing_and_fails_the_exit_status(tmp_path, monkeypatch):
    before = _wide([("triton", "S1", "forward", 1.0, 0.0), ("triton", "S2", "forward", 2.0, 0.0)])
    after = _wide([("triton", "S1", "forward", 1.0, 0.0)])
    cmp = before_after.compare(before, after)
    assert dict(zip(cmp["shape_name"], cmp["verdict"])) == {"S1": "holds", "S2": "missing"}
    monkeypatch.setattr(before_after, "wide", lambda path: {"b": before, "a": after}[path])
    assert before_after.main(["b", "a", "--out", str(tmp_path / "t.md")]) == 1
    assert "missing" in (tmp_path / "t.md").read_text()


def test_the_script_runs_a_base_tree_and_this_one_and_compares(tmp_path):
    """scripts/before_after.sh with ROUNDS=2 on the CPU experiment's quick point: the base tree (here an archive of
    this tree's packages) and this tree each leave a log and one Parquet holding both of the side's rounds, and the
    comparison table lists every stage."""
    import os
    import subprocess
    import sys
    import tarfile
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    archive = tmp_path / "before.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        for name in ("impls", "experiments", "harness", "conf", "scripts", "tuning", "pyproject.toml"):
            tar.add(repo / name, arcname=name, filter=lambda t: None if "__pycache__" in t.name else t)
    (tmp_path / "tuning").mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_MODE", "SWEEP_ROOT")}
    env.update(PATH=f"{Path(sys.executable).parent}:{env['PATH']}", PYTHONPATH=str(repo), TMPDIR=str(tmp_path),
               OUT=str(tmp_path / "out"), BEFORE_COMMIT="base", SSD_GIT_COMMIT="head", SSD_GIT_DIRTY="1",
               SSD_TUNING_DIR=str(tmp_path / "tuning"), GPU_SESSION_BUDGET_S="560", ROUNDS="2",
               SWEEP_OVERRIDES=f"backend=reference bench.cpu_warmup=0 bench.cpu_reps=1 logger.dir={tmp_path} "
                               f"hydra.sweep.dir={tmp_path}/multirun")
    done = subprocess.run(["bash", str(repo / "scripts" / "before_after.sh"), str(archive), "cpu"], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=600)
    out = tmp_path / "out"
    assert (out / "before" / "cpu.parquet").exists() and (out / "after" / "cpu.parquet").exists(), done.stderr
    assert not (out / "before" / "tuning.tar.gz").exists()
    for side in ("before", "after"):
        assert pd.read_parquet(out / side / "cpu.parquet")["run_id"].nunique() == 2, side
    md = (out / "before_after.md").read_text()
    assert all(stage in md for stage in TIMED_STAGES) and "missing" not in md


def test_runs_of_two_gpu_models_are_refused():
    """An H200 before and an H100 after are not a before/after pair, nor is one side holding both."""
    h200 = _wide([("cutile", "S1", "forward", 1.0, 0.001)])
    h100 = _wide([("cutile", "S1", "forward", 1.3, 0.001)], gpu="NVIDIA H100 80GB HBM3")
    with pytest.raises(ValueError, match="one GPU model.*H200.*H100"):
        before_after.compare(h200, h100)
    with pytest.raises(ValueError, match="one GPU model"):
        before_after.compare(pd.concat([h200, h100]), h200)


@pytest.mark.parametrize("stage", ["backward", "forward_backward"])
def test_the_backward_stages_are_compared(stage):
    """A before/after of the backward (direction backward or forward_backward) compares its whole-call stage: a 5 %
    faster backward differs, it is not dropped as an unknown stage."""
    cmp = before_after.compare(_wide([("cutile", "S1", stage, 1.0, 0.001)]),
                               _wide([("cutile", "S1", stage, 0.95, 0.001)]))
    assert cmp[["stage", "verdict"]].values.tolist() == [[stage, "differs"]]


def test_a_stage_neither_run_timed_is_not_a_point():
    """A backward sweep's rows name the forward's stages without a median: they are not points of the comparison
    (not 'missing'), the backward is."""
    untimed = [("cutile", "S1", "forward", float("nan"), 0.0)]
    cmp = before_after.compare(_wide([*untimed, ("cutile", "S1", "backward", 1.0, 0.001)]),
                               _wide([*untimed, ("cutile", "S1", "backward", 1.001, 0.001)]))
    assert cmp[["stage", "verdict"]].values.tolist() == [["backward", "holds"]]
