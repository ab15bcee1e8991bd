"""Results into DataFrames: the long store format (one row per point, stage, metric) and the wide analysis
format (one row per point and stage, one column per metric).

Sources: a Parquet file, a folder of them (a sweep directory or a whole results tree, read recursively),
`index:<experiment>[,<experiment>...]` (the file of each experiment named in results/index.yaml, under `current:`
(one entry per question) or `archive:` (superseded, or gated on the whole tensor only); the default), or
`wandb:<entity>/<project>[/<group>]` through W&B's public API (lazily imported; needs the user's login).
A path or an experiment that does not exist is an error naming it: nothing falls back to other data.
Every table and figure reads the rows of one run (`one_run`: one GPU, one source tree, one run group).
"""

from __future__ import annotations

import json
import os
import posixpath
import re
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from harness import store
from impls.stages import FORWARD_STAGE_NAMES

METRICS = ("median_ms", "p20_ms", "p80_ms", "graph_median_ms", "compile_s", "rel_err", "tol", "flops", "bytes",
           "bytes_fused", "tflops", "gbps", "frac_floor", "frac_floor_fused", "matmul_tflops", "copy_gbps", "ok")
SHAPE = ("batch", "seqlen", "nheads", "headdim", "ngroups", "dstate", "chunk_size")
TIMED_STAGES = (*FORWARD_STAGE_NAMES, "forward")  # the SSD's stages (impls/stages.py) and its whole forward
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


INDEX_SECTIONS = ("current", "archive")


def index_sections(root: Path | None = None) -> dict[str, dict[str, str]]:
    """results/index.yaml by section: {"current": {experiment: file}, "archive": {...}}, files relative to results/.
    A file without the two sections (a flat mapping) is all current. A name in both sections is an error."""
    path = (root or repo_root()) / INDEX
    if not path.is_file():
        raise FileNotFoundError(f"results index {path} not found")
    data = yaml.safe_load(path.read_text()) or {}
    if not (set(data) & set(INDEX_SECTIONS)):
        data = {"current": data}
    unknown = set(data) - set(INDEX_SECTIONS)
    if unknown:
        raise ValueError(f"{INDEX}: expected the sections {', '.join(INDEX_SECTIONS)}, got also {sorted(unknown)}")
    sections = {s: {str(k): str(v) for k, v in (data.get(s) or {}).items()} for s in INDEX_SECTIONS}
    twice = sorted(set(sections["current"]) & set(sections["archive"]))
    if twice:
        raise ValueError(f"{INDEX}: {twice} both current and archive")
    return sections


def results_index(root: Path | None = None) -> dict[str, str]:
    """results/index.yaml: experiment -> its file, relative to results/, current and archive entries together
    (`index:<name>` finds either)."""
    sections = index_sections(root)
    return {**sections["current"], **sections["archive"]}


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
    """The long frame (harness.store schema) from a path, an index or W&B source, or a frame given directly."""
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
    out["workload"] = out["workload"].fillna("ssd")  # rows from before schema version 5 are the SSD's forward
    out["direction"] = out["direction"].fillna("forward")
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


def timed(w: pd.DataFrame, ok_only: bool = True, workload: str = "ssd", stages=None) -> pd.DataFrame:
    """Rows of one workload's timed stages (with a median_ms; the SSD's: TIMED_STAGES, or `stages` where given, such
    as the backward's; another workload's: every stage but the ceilings), of points that passed (status ok) unless
    ok_only is False. Rows from before schema version 5 are the SSD's."""
    of_workload = _column(w, "workload").fillna("ssd") == workload
    if workload == "ssd":
        of_stage = w["stage"].isin(TIMED_STAGES if stages is None else tuple(stages))
    else:
        of_stage = ~w["stage"].isin(("ceiling", "point"))
    sel = of_workload & of_stage & w["median_ms"].notna()
    if ok_only:
        sel &= w["status"] == "ok"
    return w[sel]


# --- one run per table ----------------------------------------------------------------------------------------
# A table or figure puts side by side only rows of one run: one card (gpu_uuid, and one GPU model for rows without
# one), one source tree (the tree part of code_key) and one run group (one scripts/rounds.sh, before_after.sh or
# gpu_session.sh invocation, its rounds included). Rows of two runs differ by more than what the table compares.
RUN_COLUMNS = ("gpu_uuid", "gpu_name", "source_tree", "run_group")
# The sweep root a script made for one invocation, as rows before schema version 5 record it in their config
# (results_dir = <root>/<experiment>): gpu_session.sh's call-<time>-<pid>, rounds.sh's rounds-XXXXXX and
# before_after.sh's before-after-sweeps-XXXXXX/<side>.
INVOCATION_ROOT = re.compile(r"/(?:call-\d+-\d+|rounds-[^/]+|before-after-sweeps-[^/]+/(?:before|after))$")
_RESULTS_DIR = re.compile(r"^results_dir: *'?(.+?)'? *$", re.M)
NULL = "null"


class MixedRuns(ValueError):
    """Rows of several runs (cards, source trees or run groups) given to what builds one table or figure."""


def source_tree(code_key, git_commit=None) -> str | None:
    """The source tree a row's code_key names: its text before the first "|" (a commit with its diff hash, or a
    hash of the content); rows from before code_key (schema version 4) have their git_commit."""
    if isinstance(code_key, str) and code_key:
        return code_key.split("|", 1)[0]
    return str(git_commit) if isinstance(git_commit, str) and git_commit else None


def legacy_group(sweep_id, config) -> str:
    """The run group of a row from before schema version 5 (no run_group column): the name of the sweep root of the
    script invocation that measured it, read off its config's results_dir (`INVOCATION_ROOT`: the rounds of one
    rounds.sh run share it), else "sweep <sweep_id>" (a run by hand, or a root shared by several invocations)."""
    found = _RESULTS_DIR.search(config) if isinstance(config, str) else None
    root = INVOCATION_ROOT.search(posixpath.dirname(found.group(1))) if found else None
    if root:
        return root.group(0)[1:]  # the root's own name (call-..., rounds-..., before-after-sweeps-.../<side>)
    return f"sweep {sweep_id}" if isinstance(sweep_id, str) and sweep_id else NULL


def _column(frame: pd.DataFrame, name: str) -> pd.Series:
    return frame[name] if name in frame else pd.Series(None, index=frame.index, dtype=object)


def run_keys(frame: pd.DataFrame) -> pd.DataFrame:
    """Each row's run, as RUN_COLUMNS (strings; "null" where a row has no value): gpu_uuid, the GPU model
    (`gpu_key`), the source tree (`source_tree`) and the run group (run_group; `legacy_group` for rows from
    before schema version 5, whose run_group is null). A column a hand-made frame lacks counts as null."""
    code_key, commit = _column(frame, "code_key"), _column(frame, "git_commit")
    group = _column(frame, "run_group").astype(object)
    legacy = group.isna()
    if legacy.any():
        pairs = pd.DataFrame({"s": _column(frame, "sweep_id")[legacy], "c": _column(frame, "config")[legacy]})
        names = {key: legacy_group(*key) for key in pairs.drop_duplicates().itertuples(index=False, name=None)}
        group[legacy] = [names[key] for key in pairs.itertuples(index=False, name=None)]
    trees = {key: source_tree(*key) for key in set(zip(code_key, commit))}
    out = pd.DataFrame({"gpu_uuid": _column(frame, "gpu_uuid").astype(object),
                        "gpu_name": gpu_key(frame) if len(frame) else pd.Series(dtype=object),
                        "source_tree": [trees[key] for key in zip(code_key, commit)],
                        "run_group": group}, index=frame.index)
    return out.astype(object).where(out.notna(), NULL).astype(str)


def one_run(frame: pd.DataFrame, what: str) -> pd.DataFrame:
    """`frame` itself when its rows come from one run (`run_keys`: one gpu_uuid, one GPU model, one source tree,
    one run group); else MixedRuns naming `what` (the table or figure) and each column whose values differ, with
    those values. Rows from before schema version 5 have no run_group: they count as one group per invocation's
    sweep root, else per sweep_id (`legacy_group`), so a legacy single run passes."""
    keys = run_keys(frame)
    mixed = {col: sorted(keys[col].unique()) for col in keys.columns if keys[col].nunique() > 1}
    if mixed:
        differ = "; ".join(f"{col}: {', '.join(values)}" for col, values in mixed.items())
        raise MixedRuns(f"{what}: the rows come from several runs ({differ}); a table reads one GPU, one source "
                        "tree and one run group: select one run (analysis.load.runs lists them)")
    return frame


def runs(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per run in `frame` (RUN_COLUMNS), with its first and last timestamp and its number of points, the
    newest (latest last timestamp) first."""
    keys = run_keys(frame).assign(timestamp=_column(frame, "timestamp").astype(str), run_id=_column(frame, "run_id"))
    out = keys.groupby(list(RUN_COLUMNS), sort=False).agg(first=("timestamp", "min"), last=("timestamp", "max"),
                                                           points=("run_id", "nunique"))
    return out.sort_values("last", ascending=False, kind="stable").reset_index()


def newest_run(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of the newest run in `frame` (`runs`: the one measured last)."""
    if frame.empty:
        return frame
    keys, newest = run_keys(frame), runs(frame).iloc[0]
    return frame[(keys[list(RUN_COLUMNS)] == newest[list(RUN_COLUMNS)]).all(axis=1)]
