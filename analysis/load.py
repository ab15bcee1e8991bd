"""Results into DataFrames: the long store format (one row per point, stage, metric) and the wide analysis
format (one row per point and stage, one column per metric).

Sources: a Parquet file, a folder of them (a sweep directory or a whole results tree, read recursively),
`index:<experiment>[,<experiment>...]` (the current file of each experiment named in results/index.yaml; the
default), or `wandb:<entity>/<project>[/<group>]` through W&B's public API (lazily imported; needs the user's
login). A path or an experiment that does not exist is an error naming it: nothing falls back to other data.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from experiments import store

METRICS = ("median_ms", "p20_ms", "p80_ms", "graph_median_ms", "compile_s", "rel_err", "tol", "flops", "bytes",
           "bytes_fused", "tflops", "gbps", "frac_floor", "frac_floor_fused", "matmul_tflops", "copy_gbps", "ok")
SHAPE = ("batch", "seqlen", "nheads", "headdim", "ngroups", "dstate", "chunk_size")
TIMED_STAGES = ("chunk_cumsum", "fwd_pass_state", "compute_out", "forward")
STAGE_ORDER = {s: i for i, s in enumerate((*TIMED_STAGES, "ceiling", "point"))}
# Columns that differ between the rows of one point: they become the metric columns of the wide frame.
_PER_ROW = ("stage", "metric", "value", "unit")
# Columns that differ between the stages of one point (the matmul precision the backend reported, where the stage's
# tiles came from) or between its metrics (a missing value's reason): one per (point, stage) in the wide frame,
# `notes` joining the metrics' notes.
_PER_STAGE = ("precision", "note", "tile_protocol")
ENV_RESULTS = "SSD_RESULTS"
INDEX = "results/index.yaml"
DEFAULT_RESULTS = "index:headline"


def repo_root(start: Path | None = None) -> Path:
    """The checkout root: the first folder upwards holding pyproject.toml (falls back to this file's parent)."""
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "pyproject.toml").is_file():
            return folder
    return Path(__file__).resolve().parents[1]


def results_index(root: Path | None = None) -> dict[str, str]:
    """results/index.yaml: experiment -> its current file, relative to results/."""
    path = (root or repo_root()) / INDEX
    if not path.is_file():
        raise FileNotFoundError(f"results index {path} not found")
    return {str(k): str(v) for k, v in (yaml.safe_load(path.read_text()) or {}).items()}


def _from_index(source: str) -> list[str]:
    index = results_index()
    names = [n.strip() for n in source[len("index:"):].split(",") if n.strip()]
    unknown = [n for n in names if n not in index]
    if not names or unknown:
        raise FileNotFoundError(f"results {source!r}: expected experiments of {INDEX} ({', '.join(index)}), "
                                f"got {', '.join(unknown) or 'none'}")
    return [str(Path(INDEX).parent / index[n]) for n in names]


def resolve_sources(path: str | os.PathLike | None = None) -> list[str]:
    """Where results are read from: `path`, else $SSD_RESULTS, else the current headline (results/index.yaml);
    `index:<experiment>,...` names the current file of each experiment. A relative path is taken from the current
    folder, then from the checkout root (notebooks run in notebooks/). W&B sources pass through. Raises
    FileNotFoundError, naming the places tried, when one does not exist."""
    source = str(path or os.environ.get(ENV_RESULTS) or DEFAULT_RESULTS)
    if source.startswith("wandb:"):
        return [source]
    return [_existing(p) for p in (_from_index(source) if source.startswith("index:") else [source])]


def _existing(source: str) -> str:
    p = Path(source).expanduser()
    candidates = [p] if p.is_absolute() else [Path.cwd() / p, repo_root() / p]
    for candidate in candidates:
        if candidate.exists():
            return str(candidate.resolve())
    raise FileNotFoundError(f"results {source!r} not found (tried {', '.join(str(c) for c in candidates)}); "
                            f"pass a path or set ${ENV_RESULTS}")


def resolve_results(path: str | os.PathLike | None = None) -> str:
    """`resolve_sources` as one string (several sources joined by ", ")."""
    return ", ".join(resolve_sources(path))


def load_results(source: str | os.PathLike | pd.DataFrame | None = None) -> pd.DataFrame:
    """The long frame (experiments.store schema) from a path, an index or W&B source, or a frame given directly."""
    if isinstance(source, pd.DataFrame):
        df = source.copy()
    else:
        frames = [load_wandb(s[len("wandb:"):]) if s.startswith("wandb:") else store.load(Path(s))
                  for s in resolve_sources(source)]
        df = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
    return store.conform(df)


def load_wandb(path: str) -> pd.DataFrame:
    """Rows of every run under <entity>/<project>[/<group>] (each run logged its rows as the table "rows")."""
    try:
        import wandb
    except ImportError as exc:
        raise RuntimeError("W&B source given but the wandb package is not installed (pip install wandb)") from exc
    parts = path.strip("/").split("/")
    if len(parts) not in (2, 3):
        raise ValueError(f"W&B source must be wandb:<entity>/<project>[/<group>], got wandb:{path}")
    try:
        api = wandb.Api()
        runs = api.runs("/".join(parts[:2]), filters={"group": parts[2]} if len(parts) == 3 else None)
        frames = []
        for run in runs:
            for artifact in run.logged_artifacts():
                if artifact.type == "run_table":
                    frames.append(artifact.get("rows").get_dataframe())
    except wandb.errors.CommError as exc:  # no login / no network / no such project
        raise RuntimeError(f"W&B API could not read {path!r}: {exc} (run `wandb login` or set WANDB_API_KEY)") from exc
    if not frames:
        return store.frame([])
    df = pd.concat(frames, ignore_index=True)
    return store.frame(df.to_dict("records"))


def arch_of(gpu_cc) -> str:
    """'9.0' -> 'sm_90', '10.0' -> 'sm_100'; 'cpu' when there is no GPU."""
    if gpu_cc is None or (isinstance(gpu_cc, float) and np.isnan(gpu_cc)) or pd.isna(gpu_cc) or not str(gpu_cc):
        return "cpu"
    major, _, minor = str(gpu_cc).partition(".")
    return f"sm_{int(major)}{int(minor or 0)}"


def shape_label(row) -> str:
    return "b{}-l{}-h{}-p{}-g{}-n{}-c{}".format(*(int(row[c]) for c in SHAPE))


def point_label(backend: str, ablation: str, switches: dict) -> str:
    """"backend", "backend[<ablation>]" for an ablation point, or "backend{k=v,...}" for a point run with
    switches set away from the declared defaults outside an ablation (so such points are never pooled with the
    backend's default points)."""
    if ablation != "none":
        return f"{backend}[{ablation}]"
    from analysis.switches import explicit_switches

    changed = explicit_switches(backend, switches)
    if not changed:
        return backend
    return backend + "{" + ",".join(f"{k}={v}" for k, v in sorted(changed.items())) + "}"


def per_stage(long: pd.DataFrame) -> pd.DataFrame:
    """(run_id, stage) -> precision (as the backend reported it), tile_protocol (null in files before schema
    version 5) and notes ("metric: why; ..." of the rows that carry one)."""
    keys = ["run_id", "stage"]
    grouped = long.groupby(keys, sort=False)
    precision, protocol = grouped["precision"].first(), grouped["tile_protocol"].first()
    noted = long[long["note"].notna()]
    notes = (noted["metric"].astype(str) + ": " + noted["note"].astype(str)).groupby(
        [noted["run_id"], noted["stage"]], sort=False).agg("; ".join)
    return pd.DataFrame({"precision": precision, "tile_protocol": protocol}).join(notes.rename("notes"))


def wide(long: pd.DataFrame) -> pd.DataFrame:
    """One row per (point, stage): the point's descriptive columns, one column per metric (NaN where absent),
    plus `arch` (sm_XY or cpu), `shape` (the shape label), `label` (`point_label`: backend, with the ablation
    or the switches set away from the defaults) and `switch_dict` (the switches JSON parsed)."""
    long = load_results(long)
    if long.empty:
        cols = [c for c in long.columns if c not in (*_PER_ROW, *_PER_STAGE)] + list(METRICS)
        return pd.DataFrame(columns=[*cols, "stage", "precision", "tile_protocol", "notes", "arch", "shape", "label",
                                     "switch_dict"])
    values = long.pivot_table(index=["run_id", "stage"], columns="metric", values="value", aggfunc="first")
    values = values.reindex(columns=[*METRICS, *(c for c in values.columns if c not in METRICS)])
    values.columns.name = None
    info = long.drop(columns=[*_PER_ROW, *_PER_STAGE]).drop_duplicates("run_id").set_index("run_id")
    out = values.reset_index().join(info, on="run_id").join(per_stage(long), on=["run_id", "stage"])
    out["arch"] = out["gpu_cc"].map(arch_of)
    out["shape"] = out.apply(shape_label, axis=1)
    out["switch_dict"] = out["switches"].map(lambda s: json.loads(s) if isinstance(s, str) and s else {})
    out["label"] = [point_label(b, a, sw) for b, a, sw in
                    zip(out["backend"], out["ablation"].fillna("none"), out["switch_dict"])]
    out["_order"] = out["stage"].map(STAGE_ORDER).fillna(99)
    out = out.sort_values(["backend", "shape_name", "_order", "timestamp"], kind="stable").drop(columns="_order")
    return out.reset_index(drop=True)


def is_synthetic(long_or_wide: pd.DataFrame) -> bool:
    """Whether the rows are the hand-made fixture (tests/fixtures), not measurements."""
    return bool(long_or_wide["sweep_id"].astype(str).str.startswith("synthetic").any()) if len(long_or_wide) else False


def gpu_key(w: pd.DataFrame) -> pd.Series:
    """Each row's GPU model, the key that keeps cards apart: gpu_name, else the device name (CPU points, which
    never meet GPU points), else "unknown"; a column the frame lacks counts as empty."""
    key = w["gpu_name"] if "gpu_name" in w else pd.Series(None, index=w.index, dtype=object)
    if "device_name" in w:
        key = key.fillna(w["device_name"])
    return key.fillna("unknown")


def timed(w: pd.DataFrame, ok_only: bool = True) -> pd.DataFrame:
    """Rows of timed stages (with a median_ms), of points that passed (status ok) unless ok_only is False."""
    sel = w["stage"].isin(TIMED_STAGES) & w["median_ms"].notna()
    if ok_only:
        sel &= w["status"] == "ok"
    return w[sel]
