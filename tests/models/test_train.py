"""Short training runs (models/recall.py, models/train.py) and their curve rows (experiments/train_curves.py): the
task's targets, rows written with their provenance, the same run per backend, the config file."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir

from analysis import curves
from experiments.train_curves import CURVE_COLUMNS, CurvesSettings, run_curves, settings_from_config
from models.recall import IGNORE, RecallTask, recall_batch
from models.train import ModelSizes, OptimSettings, TrainConfig, train

CONF = Path(__file__).resolve().parents[2] / "conf"
TINY = TrainConfig(task=RecallTask(n_pairs=4, n_queries=3, n_keys=8, n_values=8),
                   model=ModelSizes(n_layer=1, d_model=16, d_state=8, headdim=8, chunk_size=16),
                   optim=OptimSettings(steps=4, batch=2, eval_batch=4))


def test_each_target_is_the_value_paired_with_the_query_key():
    task = RecallTask(n_pairs=5, n_queries=4, n_keys=9, n_values=7)
    b = recall_batch(task, 3, torch.Generator().manual_seed(0))
    assert b.input_ids.shape == (3, task.seqlen) and int(b.input_ids.max()) < task.vocab_size
    for ids, targets in zip(b.input_ids.tolist(), b.targets.tolist()):
        pairs = dict(zip(ids[0:10:2], ids[1:10:2]))
        assert len(pairs) == 5 and all(k < 9 <= v for k, v in pairs.items())
        asked = [i for i, t in enumerate(targets) if t != IGNORE]
        assert asked == [10, 12, 14, 16] and len({ids[i] for i in asked}) == 4
        assert all(targets[i] == pairs[ids[i]] == ids[i + 1] for i in asked)


def test_more_queries_than_pairs_ask_keys_again():
    task = RecallTask(n_pairs=3, n_queries=12, n_keys=5, n_values=4)
    b = recall_batch(task, 4, torch.Generator().manual_seed(1))
    for ids, targets in zip(b.input_ids.tolist(), b.targets.tolist()):
        pairs = dict(zip(ids[0:6:2], ids[1:6:2]))
        asked = [i for i, t in enumerate(targets) if t != IGNORE]
        assert len(asked) == 12 and all(targets[i] == pairs[ids[i]] for i in asked)


def test_a_seed_gives_the_same_run():
    a, b = train(TINY, "reference", 3, "cpu"), train(TINY, "reference", 3, "cpu")
    assert a.losses == b.losses and a.accuracy == b.accuracy and len(a.losses) == 4
    assert train(TINY, "reference", 4, "cpu").losses != a.losses


def _settings(tmp_path, backends=("reference",), seeds=(0, 1, 2)) -> CurvesSettings:
    return CurvesSettings(tuple(backends), tuple(seeds), torch.device("cpu"), tmp_path, TINY, "curves-test")


def test_rows_are_written_per_step_with_provenance_and_fall_in_their_own_band(tmp_path):
    written, failed = run_curves(_settings(tmp_path, backends=("reference", "no_such_backend")))
    assert len(written) == 3 and len(failed) == 3 and all("no_such_backend" in f for f in failed)
    rows = curves.load_curves(tmp_path)
    assert list(rows.columns[:len(CURVE_COLUMNS)]) == list(CURVE_COLUMNS)
    assert len(rows) == 3 * 4 and sorted(rows["seed"].unique()) == [0, 1, 2]
    assert rows["code_key"].str.startswith("tree:").all() and rows["v_torch"].notna().all()
    last = rows[rows["step"] == 4]
    assert last["accuracy"].between(0, 1).all() and rows[rows["step"] < 4]["accuracy"].isna().all()
    assert (rows["world_size"] == 1).all()
    b = curves.band(rows, window=2)
    (v,) = curves.check(rows, b, from_step=2, window=2)
    assert v.backend == "reference" and v.ok, v.reason


@pytest.mark.slow
def test_the_triton_interpreter_run_tracks_the_reference(tmp_path):
    written, failed = run_curves(_settings(tmp_path, backends=("reference", "triton"), seeds=(0, 1, 2)))
    assert not failed and len(written) == 6
    rows = curves.load_curves(tmp_path)
    pivot = rows.pivot(index=["seed", "step"], columns="backend", values="loss")
    assert (pivot["triton"] - pivot["reference"]).abs().max() < 1e-4
    verdicts = curves.check(rows, curves.band(rows, window=2), from_step=2, window=2)
    assert all(v.ok for v in verdicts), [v.reason for v in verdicts]


def test_the_config_file_composes_to_the_settings(tmp_path):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train_curves", overrides=["backends=[reference,triton]", "seeds=[0]", "device=cpu",
                                                 "train.optim.steps=7", "train.dtype=bfloat16"])
        settings = settings_from_config(cfg, tmp_path)
        assert settings.backends == ("reference", "triton") and settings.seeds == (0,)
        assert settings.train.optim.steps == 7 and settings.train.torch_dtype == torch.bfloat16
        assert settings.train.task.seqlen <= 1024 and settings.train.model.n_layer <= 4
        assert settings.results_dir == tmp_path / "results/scratch/train_curves"
        assert settings_from_config(compose("train_curves"), tmp_path).train == TrainConfig()  # one set of defaults
        bad = compose("train_curves", overrides=["+train.optim.step=7"])
        with pytest.raises(TypeError, match="step"):
            settings_from_config(bad, tmp_path)
        assert settings_from_config(compose("train_curves", overrides=["world_size=2"]), tmp_path).world_size == 2
        with pytest.raises(ValueError, match="world_size"):
            settings_from_config(compose("train_curves", overrides=["world_size=0"]), tmp_path)
        with pytest.raises(ValueError, match=r"^train.optim.batch: expected a multiple of world_size = 3"):
            settings_from_config(compose("train_curves", overrides=["world_size=3"]), tmp_path)  # 32 sequences


def test_a_float16_run_is_refused_naming_the_dtype():
    """AdamW on float16 parameters divides by zero (its eps rounds to 0): the run's losses went NaN from step 2."""
    with pytest.raises(ValueError, match=r"^dtype: a training run cannot take float16 parameters: .*eps \(1e-8\)"):
        TrainConfig(dtype="float16")


def test_the_results_store_skips_curve_rows(tmp_path):
    from harness import store

    pd.DataFrame({"step": [1]}).to_parquet(tmp_path / "x.curves.parquet")
    assert store.parquet_files(tmp_path) == []


# --- mixed precision: the forward under torch.autocast over float32 master weights ----------------------------------
def test_mixed_precision_runs_the_ssd_in_bf16_over_float32_parameters_and_says_so(tmp_path, monkeypatch):
    """autocast=bfloat16: the SSD receives bf16 inputs, the parameters and their AdamW state stay float32, the first
    step's loss is the float32 run's within bf16's rounding, and the curve rows name the autocast dtype."""
    import dataclasses

    import impls

    seen = []
    real = impls.ssd

    def spy(*args, **kwargs):
        seen.append(kwargs["x"].dtype if "x" in kwargs else args[0].dtype)
        return real(*args, **kwargs)

    monkeypatch.setattr(impls, "ssd", spy)
    mixed = dataclasses.replace(TINY, autocast="bfloat16")
    run = train(mixed, "reference", 3, "cpu")
    assert seen and set(seen) == {torch.bfloat16}, seen  # every step's and the accuracy's forward
    seen.clear()
    plain = train(TINY, "reference", 3, "cpu")
    assert set(seen) == {torch.float32}, seen
    assert all(torch.isfinite(torch.tensor(run.losses))) and run.losses != plain.losses
    assert abs(run.losses[0] - plain.losses[0]) < 2e-2 * abs(plain.losses[0]), (run.losses[0], plain.losses[0])
    written, failed = run_curves(CurvesSettings(("reference",), (0,), torch.device("cpu"), tmp_path, mixed, "amp"))
    assert not failed and (curves.load_curves(tmp_path)["autocast"] == "bfloat16").all()


@pytest.mark.parametrize("change, named", [({"autocast": "float16"}, "autocast"),
                                           ({"autocast": "bfloat16", "dtype": "bfloat16"}, "dtype")])
def test_mixed_precision_is_refused_where_it_cannot_run_naming_the_setting(change, named):
    import dataclasses

    with pytest.raises(ValueError, match=named):
        dataclasses.replace(TINY, **change)
