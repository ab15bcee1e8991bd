"""The loss-curve band (analysis/curves.py): the reference seeds' envelope of smoothed losses, a backend inside it
passes, one outside it from step 50 or with its accuracy out of the seeds' range fails, and the figure."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis import curves

STEPS = 120


def _run(backend: str, seed: int, losses, accuracy: float) -> pd.DataFrame:
    n = len(losses)
    return pd.DataFrame({"backend": backend, "seed": seed, "step": np.arange(1, n + 1), "loss": losses,
                         "accuracy": [None] * (n - 1) + [accuracy], "timestamp": "2026-12-06T21:00:00+00:00",
                         "gpu_name": "NVIDIA H100 80GB HBM3", "gpu_uuid": "GPU-1", "device_name": "NVIDIA H100",
                         "code_key": "tree:abc|v:1", "git_commit": "c0ffee", "run_group": "curves-1",
                         "source": f"{backend}_seed{seed}.curves.parquet"})


def _decay(level: float, seed: int) -> np.ndarray:
    steps = np.arange(1, STEPS + 1)
    wiggle = 0.05 * np.sin(steps * (0.3 + 0.1 * seed))
    return 2.0 * np.exp(-steps / 30) + level + wiggle


def _reference() -> pd.DataFrame:
    return pd.concat([_run("reference", s, _decay(1.0 + 0.1 * s, s), 0.5 + 0.05 * s) for s in range(3)])


def _with(*runs) -> pd.DataFrame:
    return pd.concat([_reference(), *runs], ignore_index=True)


def test_the_band_is_the_envelope_of_the_seeds_smoothed_curves():
    flat = pd.concat([_run("reference", s, np.full(STEPS, float(s)), 0.5) for s in range(3)])
    spike = np.full(STEPS, 1.0)
    spike[59] += 20.0  # step 60: the 20-step trailing mean rises by 1 at steps 60 … 79
    flat.loc[(flat["seed"] == 1), "loss"] = spike
    b = curves.band(flat)
    assert b.seeds == (0, 1, 2)
    assert b.low.loc[59] == 0.0 and b.high.loc[59] == 2.0
    assert b.high.loc[60] == pytest.approx(2.0) and b.low.loc[60] == 0.0
    flat.loc[(flat["seed"] == 2), "loss"] = 0.5
    b = curves.band(flat)
    assert b.high.loc[70] == pytest.approx(2.0) and b.high.loc[80] == pytest.approx(1.0)


def test_a_backend_that_tracks_the_reference_is_inside():
    rows = _with(*[_run("triton", s, _decay(1.0 + 0.1 * s, s) + 1e-4, 0.55) for s in range(3)])
    verdicts = {v.backend: v for v in curves.check(rows, curves.band(rows))}
    assert verdicts["triton"].ok and verdicts["reference"].ok, verdicts["triton"].reason
    assert verdicts["triton"].seeds == (0, 1, 2)


def test_a_curve_that_leaves_the_band_after_step_50_fails():
    late = _decay(1.1, 0)
    late[69:] += 1.0  # from step 70
    rows = _with(_run("cutile", 0, late, 0.55))
    (v,) = [v for v in curves.check(rows, curves.band(rows)) if v.backend == "cutile"]
    assert not v.ok and not v.inside and v.accuracy_inside
    assert 70 <= v.first_outside < 80 and v.worst_excess > 0.5
    assert "outside the band" in v.reason


def test_before_step_50_a_curve_may_leave_the_band():
    early = _decay(1.1, 0)
    early[:40] += 5.0  # steps 1 … 40: their 20-step means are back inside by step 60
    rows = _with(_run("cutile", 0, early, 0.55))
    (v,) = [v for v in curves.check(rows, curves.band(rows), from_step=60) if v.backend == "cutile"]
    assert v.ok, v.reason
    (v,) = [v for v in curves.check(rows, curves.band(rows), from_step=50) if v.backend == "cutile"]
    assert not v.inside and v.first_outside == 50


def test_an_accuracy_outside_the_seeds_range_fails():
    rows = _with(_run("mamba_ssm", 1, _decay(1.1, 1), 0.2))
    (v,) = [v for v in curves.check(rows, curves.band(rows)) if v.backend == "mamba_ssm"]
    assert v.inside and not v.accuracy_inside and not v.ok and "accuracy 0.2000" in v.reason


def test_a_curve_missing_steps_fails():
    rows = _with(_run("triton", 0, _decay(1.1, 0)[:90], 0.55))
    (v,) = [v for v in curves.check(rows, curves.band(rows)) if v.backend == "triton"]
    assert not v.inside and v.first_outside == 91


def test_the_band_needs_three_seeds_and_one_run_per_seed():
    with pytest.raises(ValueError, match="3 seeds of 'reference'"):
        curves.band(_reference().query("seed < 2"))
    with pytest.raises(ValueError, match="twice"):
        curves.band(pd.concat([_reference(), _run("reference", 0, _decay(1.0, 0), 0.5)]))


def test_the_figure_names_card_date_and_rows():
    rows = _with(_run("triton", 0, _decay(1.1, 0), 0.55))
    b = curves.band(rows)
    fig = curves.figure(rows, b, curves.check(rows, b))
    title = fig.axes[0].get_title()
    assert "NVIDIA H100 80GB HBM3" in title and "2026-12-06" in title and "reference_seed0.curves.parquet" in title
    gids = {line.get_gid() for line in fig.axes[0].get_lines()}
    assert {"backend:reference", "backend:triton"} <= gids


def test_the_command_prints_verdicts_saves_the_figure_and_fails_on_a_curve_outside(tmp_path, capsys):
    inside = _with(_run("triton", 0, _decay(1.1, 0), 0.55))
    for (backend, seed), run in inside.groupby(["backend", "seed"]):
        run.drop(columns="source").to_parquet(tmp_path / f"{backend}_seed{seed}.curves.parquet")
    assert curves.main([str(tmp_path)]) == 0
    assert (tmp_path / "loss_curves.png").is_file() and "triton seeds [0]: inside" in capsys.readouterr().out
    _run("cutile", 0, _decay(1.1, 0) + 2.0, 0.55).drop(columns="source").to_parquet(tmp_path / "c.curves.parquet")
    assert curves.main([str(tmp_path), "--out", str(tmp_path / "fig")]) == 1
    assert "cutile seeds [0]: FAILS" in capsys.readouterr().out
