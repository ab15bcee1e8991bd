"""W&B logging of one point: the resolved config, summary metrics and a wandb.Table of the point's rows.

Offline unless the user set WANDB_MODE; one W&B group per sweep (sweep_id), job_type = backend. Each run is
closed before the next (reinit="finish_previous"). logger.kind=auto uses wandb when it imports, else local.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pandas as pd


def wandb_importable() -> bool:
    return importlib.util.find_spec("wandb") is not None


def choose(kind: str) -> str:
    """'wandb' or 'local' for logger.kind auto | wandb | local (wandb asked for but absent is an error)."""
    if kind == "local":
        return "local"
    if kind == "wandb":
        if not wandb_importable():
            raise RuntimeError("logger.kind=wandb but the wandb package is not installed (logger=auto falls back)")
        return "wandb"
    return "wandb" if wandb_importable() else "local"


def wandb_dir(configured: str, base: Path) -> Path:
    path = Path(configured)
    path = path if path.is_absolute() else base / path
    path.mkdir(parents=True, exist_ok=True)
    return path


def table_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Plain Python values (None for nulls): wandb.Table does not take pandas' nullable dtypes."""
    out = df.astype(object)
    return out.where(pd.notna(out), None)


def start(*, project, entity, group, job_type, name, config, directory: Path, mode: str, silent: bool = False):
    """One W&B run; `silent`: none of W&B's own lines on the terminal (its banners and run summary, per point)."""
    import wandb

    return wandb.init(project=project, entity=entity, group=group, job_type=job_type, name=name, config=config,
                      dir=str(directory), mode=os.environ.get("WANDB_MODE") or mode, reinit="finish_previous",
                      settings=wandb.Settings(console="off", x_disable_stats=True, silent=silent))


def finish(run, df: pd.DataFrame, summary: dict) -> None:
    import wandb

    run.summary.update(summary)
    run.log({"rows": wandb.Table(dataframe=table_frame(df))})
    run.finish()


def summary_metrics(df: pd.DataFrame) -> dict:
    """stage/metric -> value for the numeric rows, plus status."""
    out = {f"{r.stage}/{r.metric}": float(r.value) for r in df.itertuples() if pd.notna(r.value)}
    if len(df):
        out["status"] = str(df["status"].iloc[0])
    return out
