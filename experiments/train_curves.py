"""`python -m experiments.train_curves [overrides]` — loss curves of the same short training run per backend and
seed (models/train.py: a small Mamba-2 language model on associative recall), written as curve rows.

    python -m experiments.train_curves backends=[reference,triton,cutile,mamba_ssm] seeds=[0,1,2]
    python -m experiments.train_curves backends=[triton] world_size=2   # each run under DDP on 2 GPUs (or CPU ranks)

Config: conf/train_curves.yaml. Each (backend, seed) run writes one file `<backend>_seed<seed>_<run id>.curves.parquet`
under results_dir (a table of its own, CURVE_COLUMNS, which the results store skips: harness/store.py OTHER_TABLES):
one row per step with its loss, the final recall accuracy on the last step's row, and the provenance every result
row carries (harness/provenance.py). A run that fails prints why and writes nothing; the others go on, and the command
exits 1. analysis/curves.py reads the rows, draws the band and checks every backend against it.
"""

from __future__ import annotations

import os
import sys

import torch

# Without CUDA the Triton kernels run in the interpreter; the flag must be set before any @triton.jit is applied.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import datetime as _dt  # noqa: E402
import json  # noqa: E402
import uuid  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import hydra  # noqa: E402
import pandas as pd  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from harness import provenance, secrets, store  # noqa: E402
from impls import validate as check  # noqa: E402
from models.ddp import train_ddp  # noqa: E402
from models.train import Curve, TrainConfig, as_dict, train  # noqa: E402

CURVES_SCHEMA_VERSION = 1
SUFFIX = ".curves.parquet"
# The curve rows' own columns (then every column of harness.provenance.collect: versions, GPU, git labels).
CURVE_COLUMNS: dict[str, tuple[str, str]] = {
    "schema_version": ("Int64", "version of this table's schema (CURVES_SCHEMA_VERSION)"),
    "run_id": ("string", "one id per (backend, seed) run"),
    "run_group": ("string", "one id per command (SSD_RUN_GROUP where set): the runs one band is read from"),
    "timestamp": ("string", "UTC time the run started, ISO 8601"),
    "backend": ("string", "the backend every layer's SSD ran on"),
    "switches": ("string", "JSON of the backend's resolved switches"),
    "seed": ("Int64", "parameters and batches drawn from it (the same on every backend)"),
    "step": ("Int64", "1 … steps"),
    "loss": ("float64", "the mean recall cross-entropy of the step's batch, before its update"),
    "accuracy": ("float64", "recall accuracy on the held-out batch after the last step (last step's row; else null)"),
    "train_s": ("float64", "wall seconds of the run's training steps (last step's row; else null)"),
    "world_size": ("Int64", "processes the run was data-parallel over (1: none; else DDP, models/ddp.py)"),
    "dtype": ("string", "the parameters' dtype"),
    "autocast": ("string", "mixed precision: the forward's torch.autocast dtype over float32 parameters; null: none"),
    "device": ("string", "cuda or cpu"),
    "device_name": ("string", "the GPU's name, or cpu:<processor>"),
    "config": ("string", "JSON of the run's TrainConfig (task, model, optimizer)"),
    "describe": ("string", "JSON of the model's describe(): what its SSD and glue ran"),
    "code_key": ("string", "the code that ran (harness.provenance.code_key)"),
}


@dataclass(frozen=True)
class CurvesSettings:
    """What one command runs: every backend at every seed, on `device`, rows under `results_dir`."""

    backends: tuple[str, ...]
    seeds: tuple[int, ...]
    device: torch.device
    results_dir: Path
    train: TrainConfig
    run_group: str
    world_size: int = 1


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {name!r} asked for, but CUDA is not available")
    return device


def settings_from_config(cfg: DictConfig, base_dir: Path) -> CurvesSettings:
    """The settings of a composed config; a bad value raises naming its key."""
    backends, seeds = tuple(cfg.backends), tuple(int(s) for s in cfg.seeds)
    if not backends or not seeds:
        raise ValueError(f"backends and seeds: expected at least one of each, got {list(backends)}, {list(seeds)}")
    results_dir = Path(cfg.results_dir)
    group = os.environ.get("SSD_RUN_GROUP") or f"curves-{_dt.datetime.now(_dt.UTC):%Y%m%d-%H%M%S}"
    world_size = cfg.world_size
    check.positive_int("world_size", world_size)
    run = TrainConfig.from_dict(OmegaConf.to_container(cfg.train, resolve=True))
    if run.optim.batch % world_size:  # else every rank would start, then each raise (models.ddp.rank_share)
        check.fail("train.optim.batch", f"a multiple of world_size = {world_size} (each rank an equal share)",
                   run.optim.batch)
    results_dir = results_dir if results_dir.is_absolute() else base_dir / results_dir
    return CurvesSettings(backends, seeds, resolve_device(cfg.device), results_dir, run, group, world_size)


def curve_rows(curve: Curve, settings: CurvesSettings, run_id: str, timestamp: str) -> list[dict]:
    """One row per step of `curve` (CURVE_COLUMNS, then the provenance columns)."""
    device = settings.device
    prov = provenance.collect(device)
    name = provenance.device_name(device)
    ssd = curve.describe["ssd"]
    common = {"schema_version": CURVES_SCHEMA_VERSION, "run_id": run_id, "run_group": settings.run_group,
              "timestamp": timestamp, "backend": curve.backend,
              "switches": json.dumps(ssd.get("switches", {}), sort_keys=True, default=str), "seed": curve.seed,
              "world_size": settings.world_size, "dtype": settings.train.dtype,
              "autocast": settings.train.autocast, "device": device.type,
              "device_name": name,
              "config": json.dumps(as_dict(settings.train), default=str),
              "describe": secrets.redact(json.dumps(curve.describe, default=str)),
              "code_key": provenance.code_key(prov, curve.backend, prov.get("gpu_name") or name), **prov}
    last = len(curve.losses)
    return [{**common, "step": step, "loss": loss, "accuracy": curve.accuracy if step == last else None,
             "train_s": curve.seconds if step == last else None}
            for step, loss in enumerate(curve.losses, start=1)]


def curve_frame(rows: list[dict]) -> pd.DataFrame:
    """Rows -> a frame with CURVE_COLUMNS typed first, the provenance columns after them."""
    df = pd.DataFrame(rows)
    extra = [c for c in df.columns if c not in CURVE_COLUMNS]
    df = df.reindex(columns=[*CURVE_COLUMNS, *extra])
    for name, (dtype, _) in CURVE_COLUMNS.items():
        df[name] = df[name].astype(dtype)
    return df


def run_one(settings: CurvesSettings, backend: str, seed: int) -> Path:
    """Trains one (backend, seed) run and writes its rows; -> the file."""
    run_id = uuid.uuid4().hex
    timestamp = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    every = max(1, settings.train.optim.steps // 6)

    def progress(step: int, loss: float) -> None:
        if step % every == 0 or step == settings.train.optim.steps:
            print(f"[curves] {backend} seed {seed} step {step}: loss {loss:.4f}", flush=True)

    if settings.world_size == 1:
        curve = train(settings.train, backend, seed, settings.device, on_step=progress)
    else:
        curve = train_ddp(settings.train, backend, seed, settings.world_size, settings.device.type)
    print(f"[curves] {backend} seed {seed}: accuracy {curve.accuracy:.4f} in {curve.seconds:.1f} s", flush=True)
    ranks = "" if settings.world_size == 1 else f"_ddp{settings.world_size}"
    path = settings.results_dir / f"{backend}_seed{seed}{ranks}_{run_id[:12]}{SUFFIX}"
    return store.write_atomic(curve_frame(curve_rows(curve, settings, run_id, timestamp)), path)


def run_curves(settings: CurvesSettings) -> tuple[list[Path], list[str]]:
    """Every backend at every seed; -> (files written, one line per run that failed)."""
    written, failed = [], []
    for backend in settings.backends:
        for seed in settings.seeds:
            try:
                written.append(run_one(settings, backend, seed))
            except Exception as exc:  # noqa: BLE001 - one backend's failure is reported; the others still run
                line = secrets.redact(f"{backend} seed {seed}: {type(exc).__name__}: {exc}")
                print(f"[curves] FAILED {line}", flush=True)
                failed.append(line)
    return written, failed


@hydra.main(version_base="1.3", config_path="../conf", config_name="train_curves")
def hydra_entry(cfg: DictConfig) -> None:
    settings = settings_from_config(cfg, Path(hydra.utils.get_original_cwd()))
    written, failed = run_curves(settings)
    print(f"[curves] {len(written)} runs written under {settings.results_dir} (run group {settings.run_group})")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    hydra_entry()
