"""Hydra callback of a sweep: checks every job's config before the first one runs, shows a progress bar, and
prints a summary table of the sweep's rows at the end."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pandas as pd
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from harness import config as conf


def job_overrides(config: DictConfig) -> list[list[str]]:
    """The override list of every job the basic sweeper will launch (its own expansion)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    loader = GlobalHydra.instance().config_loader()
    params = config.hydra.sweeper.get("params") or {}
    args = [f"{k}={v}" for k, v in params.items()]
    args += list(OmegaConf.to_container(config.hydra.overrides.task, resolve=False))
    parser = OverridesParser.create(config_loader=loader)
    batches = BasicSweeper.split_arguments(parser.parse_overrides(args), None)
    return [list(job) for job in batches[0]]


def preflight(config: DictConfig) -> int:
    """Composes and validates every job; raises ConfigError naming the job and the problem."""
    from hydra.core.global_hydra import GlobalHydra

    loader = GlobalHydra.instance().config_loader()
    jobs = job_overrides(config)
    for overrides in jobs:
        job_cfg = loader.load_sweep_config(config, overrides)
        try:
            conf.validate(job_cfg)
        except conf.ConfigError as exc:
            raise conf.ConfigError(f"sweep job {' '.join(overrides)}: {exc}") from exc
    return len(jobs)


def summary_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One line per point: backend, shape, dtype, ablation, status, forward median/error, error text."""
    if rows.empty:
        return pd.DataFrame()
    keys = ["config_hash", "backend", "ablation", "shape_name", "dtype", "status"] + \
        (["from"] if "from" in rows else [])
    points = rows.drop_duplicates("config_hash")[keys + ["error"]].set_index("config_hash")
    fwd = rows[rows["stage"] == "forward"].pivot_table(index="config_hash", columns="metric", values="value",
                                                        aggfunc="first")
    for metric in ("median_ms", "rel_err", "tflops", "gbps", "compile_s"):
        points[f"fwd_{metric}"] = fwd[metric] if metric in fwd else float("nan")
    backward = rows[(rows["stage"] == "backward") & (rows["metric"] == "median_ms")]
    if not backward.empty:  # a backward direction's point: its backward's median too
        points["bwd_median_ms"] = backward.set_index("config_hash")["value"]
    points["error"] = points["error"].fillna("").str.slice(0, 60)
    return points.reset_index(drop=True)


def marker_rows(markers: list[dict]) -> pd.DataFrame:
    """The rows each job of this sweep wrote, or, for a skipped job, the rows of the file its skip rule found:
    read from the file the job's marker names, that point's rows only (never another run's rows of the same
    config), with `from` saying which."""
    frames = []
    for m in markers:
        if not m.get("file") or not Path(m["file"]).is_file():
            continue
        rows = pd.read_parquet(m["file"])
        rows = rows[rows["config_hash"] == m["config_hash"]].copy()
        rows["from"] = "stored earlier" if m.get("status") == "skipped" else "this sweep"
        frames.append(rows)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


class SweepCallback(Callback):
    def __init__(self) -> None:
        self.bar = None

    def __getstate__(self) -> dict:
        # hydra-submitit-launcher pickles the Hydra context, callbacks included, into every SLURM job; a live
        # tqdm bar does not survive unpickling (RecursionError in tqdm.utils.__getattr__) and a job has no bar.
        return {**self.__dict__, "bar": None}

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        count = None
        if "basic_sweeper" in str(config.hydra.sweeper.get("_target_", "")):
            try:
                count = preflight(config)
            except conf.ConfigError as exc:
                # Hydra turns a callback's exception into a warning and carries on; a bad sweep must stop here.
                print(f"Error: {exc}", file=sys.stderr)
                raise SystemExit(2) from exc
        try:
            from tqdm import tqdm

            self.bar = tqdm(total=count, desc=f"sweep {config.sweep_name}", unit="point")
        except ImportError:
            self.bar = None

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self.bar is not None:
            self.bar.close()
        print_summary(config.hydra.sweep.dir, f"sweep {config.sweep_name}")

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        """A single point (no -m) prints its summary line too."""
        print_summary(config.hydra.run.dir, f"point {config.sweep_name}")


def print_summary(job_dir: str, what: str) -> None:
    """The summary table of the points whose markers lie under `job_dir`."""
    markers = [json.loads(p.read_text()) for p in Path(job_dir).rglob("point.json")]
    if not markers:
        print(f"[bench] {what} finished: no points ran in this process")
        return
    roots = {m["results_dir"] for m in markers}
    table = summary_table(marker_rows(markers))
    failed = int((table["status"] != "ok").sum()) if not table.empty else 0
    print(f"\n[bench] {what}: {len(table)} points, {failed} failed, results in {', '.join(sorted(roots))}")
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_colwidth", 60):
        print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
