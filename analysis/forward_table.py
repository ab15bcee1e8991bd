"""`python -m analysis.forward_table FILE [FILE ...] [--stage forward] [--out PATH | --check PATH]`: one stage of every
point in a results folder's files, as a table to put beside the folder's README instead of copying figures by hand.
`--stage` is a forward stage, `forward`, a backward direction (`backward`, `forward_backward`), or `kernels`: every
kernel of the timed backwards (the rows' `kernel:<name>` stages), a row per (point, kernel), its cell adding the
kernel's share of the call's device time and, for our kernels, its fraction of its cost-model floor.

One table per run (`analysis.load.runs`: one card, one source tree, one run group; ordered by GPU model, then by
when they ran): a row per point (`analysis.load.point_label`: the backend, with its ablation or the switches it ran
away from the defaults), a column per shape, each cell the do_bench median [p20, p80] in ms and, where the point
measured it, the CUDA-graph replay (`graph`) and, where its tiles were not all searched for its own code, where they
came from (`tiles`, the rows' `tile_protocol`). A point measured in several rounds of its run shows each round's cell,
in the order of their timestamps, separated by " · ". Only points that passed the gate (status ok) are shown.

`--out PATH` writes the table with a first line naming the command that made it (relative paths from the
repository root); `--check PATH` regenerates PATH from the command its first line names and exits 1 if it differs
(tests/analysis/test_results_index.py checks every `results/*/forward*.md` this way).
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pandas as pd

from analysis.load import RUN_COLUMNS, TIMED_STAGES, one_run, repo_root, run_keys, runs, timed, wide
from analysis.markdown import check_generated, emit, table, table_parser
from harness.cost_model import BACKWARD_STAGES

COMMAND = "python -m analysis.forward_table"
KERNELS = "kernels"  # --stage: every kernel:<name> stage of the timed backwards (harness/measure_time.py kernel_rows)
KERNEL_STAGE = "kernel:"  # harness/timing.py KERNEL_STAGE (not imported: the analysis runs without torch)


def cell(row) -> str:
    text = f"{row['median_ms']:.3f} [{row['p20_ms']:.3f}, {row['p80_ms']:.3f}]"
    graph = row.get("graph_median_ms")
    text += f", graph {graph:.3f}" if pd.notna(graph) else ""
    share, floor = row.get("share_pct"), row.get("frac_floor")  # a kernel's (kernel rows only)
    text += f", {share:.0f} % of the call" if pd.notna(share) else ""
    kernel = str(row.get("stage", "")).startswith(KERNEL_STAGE)
    text += f", {floor:.2f} of its floor" if kernel and pd.notna(floor) else ""
    tiles = row.get("tile_protocol")  # where the tiles came from, where not searched for this code (impls/tuning.py)
    return text + (f", tiles {tiles}" if isinstance(tiles, str) and tiles != "retuned" else "")


def stage_rows(w: pd.DataFrame, stage: str) -> pd.DataFrame:
    """The SSD's timed rows of `stage` (a forward stage, a backward direction, or KERNELS: every kernel of the
    backwards, each labelled `<point> · <kernel>`) of points that passed."""
    if stage in TIMED_STAGES:
        rows = timed(w)
        return rows[rows["stage"] == stage]
    if stage not in (*BACKWARD_STAGES, KERNELS):
        raise ValueError(f"--stage: expected one of {[*TIMED_STAGES, *BACKWARD_STAGES, KERNELS]}, got {stage!r}")
    ssd = w[(w["workload"].fillna("ssd") == "ssd") & w["median_ms"].notna() & (w["status"] == "ok")]
    if stage != KERNELS:
        return ssd[ssd["stage"] == stage]
    kernels = ssd[ssd["stage"].str.startswith(KERNEL_STAGE)]
    launched = kernels["stage"].str.removeprefix(KERNEL_STAGE)
    shown = launched.copy()
    keys = run_keys(kernels).set_axis(kernels.index)
    point = [kernels["label"], kernels["shape_name"], *(keys[c] for c in RUN_COLUMNS)]
    for _, names in launched.groupby(point, dropna=False):  # numbered within one point of one run only
        shown[names.index] = names.map(kernel_labels(names.unique()))
    return kernels.assign(label=kernels["label"] + " · " + shown)


def kernel_label(name: str) -> str:
    """A launched kernel's name as a table shows it: without cuTile's specialisation (`bwd_chunk_kernel_Kt2_A4bf16_…`
    is `bwd_chunk_kernel`) and, for a C++ template, its leading numeric arguments kept and the rest elided, with the
    argument types of its last lambda (a PyTorch copy's source type): `at::native::reduce_kernel<512, 1, …>
    [double, double]`."""
    name = re.sub(r"(_kernel)_K\w+$", r"\1", name)
    if "<" not in name:
        return name
    base, args = name.removeprefix("void ").split("<", 1)
    numbers = re.match(r"((?:\d+, )*\d+)?", args).group(1)
    types = [t for t in re.findall(r"lambda\(([^)]*)\)", name) if t]
    return f"{base}<{numbers + ', ' if numbers else ''}…>" + (f" [{types[-1]}]" if types else "")


def kernel_labels(names) -> dict[str, str]:
    """{launched kernel name: its `kernel_label`}, numbered (#1, #2, … in name order) where two names would read the
    same, so that no table cell joins two kernels."""
    by_label: dict[str, list[str]] = {}
    for name in sorted(names):
        by_label.setdefault(kernel_label(name), []).append(name)
    return {name: label if len(group) == 1 else f"{label} #{i}"
            for label, group in by_label.items() for i, name in enumerate(group, 1)}


def tables(files: list[str | Path], stage: str = "forward", root: Path | None = None) -> dict[str, pd.DataFrame]:
    """{"<GPU name>, run <run group>": table (point label × shape name, cells as `cell`)} of `stage` in `files`
    (relative paths from `root`, by default the repository's), one per run (the source tree added to the title where
    a run group holds two)."""
    root = root or repo_root()
    long = pd.concat([pd.read_parquet(root / f) for f in files], ignore_index=True)
    rows = stage_rows(wide(long), stage).sort_values("timestamp", kind="stable")
    if rows.empty:
        raise ValueError(f"stage {stage!r}: no timed point of it in {', '.join(map(str, files))}")
    out = {}
    keys, found = run_keys(rows), runs(rows).sort_values(["gpu_name", "first"], kind="stable")
    trees = found.groupby(["gpu_name", "run_group"])["source_tree"].transform("nunique")
    for (_, run), several in zip(found.iterrows(), trees):
        g = one_run(rows[(keys[list(RUN_COLUMNS)] == run[list(RUN_COLUMNS)]).all(axis=1)], "forward table")
        cells = g.assign(cell=g.apply(cell, axis=1)).groupby(["label", "shape_name"], sort=False)["cell"].agg(
            " · ".join)
        title = f"{run['gpu_name']}, run {run['run_group']}" + (f", tree {run['source_tree']}" if several > 1 else "")
        out[title] = cells.unstack("shape_name").reindex(columns=sorted(g["shape_name"].unique())).fillna("")
    return out


def render(files: list[str], stage: str = "forward", root: Path | None = None) -> str:
    command = " ".join([COMMAND, *map(shlex.quote, files), *(["--stage", stage] if stage != "forward" else [])])
    parts = [f"Generated by `{command}` from the rows (status ok): median [p20, p80] ms, `graph` the CUDA-graph "
             "replay, `tiles` where the point's tiles were not all searched for its own code (the rows' "
             "`tile_protocol`, impls/tuning.py: pinned = borrowed from the switch set without the trick, fallback = "
             "no record). Do not edit: regenerate.", ""]
    for run, t in tables(files, stage, root).items():
        parts += [f"## {stage}, {run}", "", table(t.rename_axis("point"), index=True), ""]
    return "\n".join(parts)


def main(argv=None) -> int:
    p = table_parser(COMMAND, __doc__.splitlines()[0],
                     "parquet files of one results folder (paths from the repository root)")
    p.add_argument("--stage", default="forward")
    a = p.parse_args(argv)
    root = repo_root()
    if a.check:
        return check_generated(root / a.check, COMMAND, p, lambda args: render(args.files, args.stage, root),
                               "forward_table")
    if not a.files:
        p.error("files: name at least one parquet file (or --check a generated table)")
    emit(render(a.files, a.stage, root), a.out and str(root / a.out), "forward_table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
