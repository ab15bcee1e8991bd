"""Figures from the analysis tables (matplotlib, Agg backend: no display needed). Each function takes the
table its module returns and gives a Figure; `save(fig, folder, name)` writes name.png and name.svg.

Every figure draws a backend in its one color (analysis.palette), tuned points hatched, stages by marker, shapes
captioned with their model; legends never show raw point labels. Each artist drawn for a backend carries the gid
"backend:<name>" (tests check the colors through it). Error bars are the p20–p80 of one run; points pooled from
several runs get none. The tables come from one run's rows (analysis.load.one_run), so no figure mixes runs."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: headless CI and report runs
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from analysis import palette  # noqa: E402
from analysis.load import TIMED_STAGES  # noqa: E402
from analysis.noise import WITHIN_NOISE  # noqa: E402


def save(fig, folder: str | Path, name: str) -> list[Path]:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"{name}.png", folder / f"{name}.svg"]
    fig.savefig(paths[0], dpi=120, bbox_inches="tight")
    fig.savefig(paths[1], bbox_inches="tight")
    plt.close(fig)
    return paths


def _empty(title: str):
    fig, ax = plt.subplots(figsize=(5, 2))
    ax.axis("off")
    ax.text(0.5, 0.5, f"{title}: no data", ha="center", va="center")
    return fig


def _tag(artists, backend: str) -> None:
    for artist in np.atleast_1d(artists):
        artist.set_gid(f"backend:{palette.parse_label(backend).backend}")


def _backend_legend(ax, labels, tuned_hatch: bool = False, **kw) -> None:
    """One entry per backend (its color), one per variant, and the hatch meaning where tuned points are drawn."""
    parsed = [palette.parse_label(lab) for lab in labels]
    handles, seen = [], set()
    for lab in parsed:
        key = (lab.backend, lab.variant)
        if key not in seen:
            seen.add(key)
            handles.append(Patch(facecolor=palette.color(lab.backend),
                                 hatch=palette.VARIANT_HATCH if lab.variant else "", label=lab.text))
    if tuned_hatch and any(lab.tuned for lab in parsed):
        handles.append(Patch(facecolor="white", edgecolor="k", hatch=palette.TUNED_HATCH, label="tuned configs"))
        if not all(lab.tuned for lab in parsed):
            handles.append(Patch(facecolor="white", edgecolor="k", label="fallback configs"))
    ax.legend(handles=handles, **kw)


def speedup_bars(table: pd.DataFrame, stage: str = "forward"):
    """Speedup over the baseline per shape (and geomean), one bar per backend in its color, tuned points hatched;
    error bars: p20–p80 of the one run behind a bar (none for the geomean or for points pooled from runs)."""
    t = table[(table["stage"] == stage) & table["speedup"].notna()]
    if t.empty:
        return _empty(f"speedup ({stage})")
    shapes = list(dict.fromkeys(t["case"]))
    first = t.drop_duplicates("case").set_index("case")
    captions = [palette.shape_caption(first.at[c, "shape_name"], first.at[c, "shape"]).replace(": ", "\n", 1)
                .replace(", ", "\n") for c in shapes]
    labels = sorted(dict.fromkeys(t["backend"]), key=lambda b: (palette.parse_label(b).backend, b))
    fig, ax = plt.subplots(figsize=(1.5 + 1.3 * len(shapes) * max(1, len(labels)) / 3, 4.2))
    width = 0.8 / len(labels)
    x = np.arange(len(shapes))
    for i, lab in enumerate(labels):
        d = t[t["backend"] == lab].drop_duplicates("case").set_index("case").reindex(shapes)
        one_run = (d["n_runs"] == 1) & (d["shape_name"] != "geomean")
        xs = x + (i - (len(labels) - 1) / 2) * width
        bars = ax.bar(xs, d["speedup"], width, color=palette.color(lab), hatch=palette.hatch(lab),
                      edgecolor="white", linewidth=0.5)
        _tag(bars.patches, lab)
        sel = one_run.to_numpy(bool) & d["speedup"].notna().to_numpy()
        err = np.vstack([d["speedup"] - d["speedup_lo"], d["speedup_hi"] - d["speedup"]]).clip(min=0)[:, sel]
        ax.errorbar(xs[sel], d["speedup"].to_numpy()[sel], yerr=err, fmt="none", ecolor="k", capsize=2, lw=1)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(x, captions, fontsize=7)
    ax.set_ylabel(f"speedup over {t['baseline'].iloc[0]}")
    ax.set_title(f"{stage}: speedup (higher is faster; error bars p20–p80 of one run)", fontsize=9)
    _backend_legend(ax, labels, tuned_hatch=True, fontsize=7)
    return fig


def ablation_bars(table: pd.DataFrame):
    """Effect of each switch on top of the others (percent of the time without it), in the backend's color; no-ops
    and effects within the run's noise (the table's `on_top`) drawn as empty bars labelled so, never as a value."""
    if table.empty:
        return _empty("ablation")
    groups = list(dict.fromkeys(zip(table["backend"], table["shape_name"], table["dtype"])))  # one panel each
    fig, axes = plt.subplots(1, len(groups), figsize=(4.5 * len(groups), 0.45 * table["switch"].nunique() + 1.5),
                             squeeze=False)
    for ax, (backend, shape, dtype) in zip(axes[0], groups):
        d = table[(table["backend"] == backend) & (table["shape_name"] == shape) & (table["dtype"] == dtype)]
        y = np.arange(len(d))
        eff = d["effect_on_top"].to_numpy(float) * 100
        noop = d["status"].str.startswith("no-op").to_numpy()
        quiet = (d["on_top"] == WITHIN_NOISE).to_numpy() if "on_top" in d else np.zeros(len(d), bool)
        bars = ax.barh(y, np.where(noop | quiet, 0, np.nan_to_num(eff)), color=palette.color(backend))
        _tag(bars.patches, backend)
        for yi, n, q, st in zip(y, noop, quiet, d["status"]):
            if n:
                ax.text(0, yi, "  no-op on this arch", va="center", fontsize=8, style="italic")
            elif q:
                ax.text(0, yi, f"  {WITHIN_NOISE}", va="center", fontsize=8, color="grey")
            elif st == "not measured":
                ax.text(0, yi, "  not measured", va="center", fontsize=8, color="grey")
        ax.set_yticks(y, d["switch"])
        ax.axvline(0, color="k", lw=0.8)
        ax.set_xlabel("time saved by the switch (%; negative: it costs)")
        ax.set_title(f"{backend}, {palette.shape_caption(shape)}, {dtype} ({d['stage'].iloc[0]})",
                     fontsize=9)
    fig.tight_layout()
    return fig


def roofline(table: pd.DataFrame):
    """Achieved TFLOP/s against arithmetic intensity (model flops / model bytes), with the measured ceilings:
    color per backend, marker per stage."""
    t = table[table["tflops"].notna() & (table["intensity"] > 0)]
    if t.empty:
        return _empty("roofline")
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for (backend, stage), d in t.groupby(["backend", "stage"]):
        points = ax.scatter(d["intensity"], d["tflops"], s=30, color=palette.color(backend),
                            marker=palette.marker(stage), edgecolors="k", linewidths=0.3)
        _tag(points, backend)
    peak, bw = t["matmul_tflops"].median(), t["copy_gbps"].median()
    handles = [Patch(color=palette.color(b), label=b) for b in sorted(t["backend"].unique())]
    handles += [Line2D([], [], ls="", marker=palette.marker(s), color="k", label=s)
                for s in TIMED_STAGES if s in set(t["stage"])]
    if np.isfinite(peak) and np.isfinite(bw):
        xs = np.logspace(np.log10(t["intensity"].min() / 4), np.log10(t["intensity"].max() * 4), 100)
        ax.plot(xs, np.minimum(peak, xs * bw / 1e3), "k--", lw=1)
        handles.append(Line2D([], [], color="k", ls="--", label="measured ceilings"))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("FLOP / byte (cost model)")
    ax.set_ylabel("TFLOP/s achieved")
    ax.legend(handles=handles, fontsize=7, ncol=2)
    return fig


def seqlen_scaling(table: pd.DataFrame):
    """Tokens per second against seqlen: color per backend, line style per dtype."""
    if table.empty:
        return _empty("seqlen scaling")
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for (backend, dtype), d in table.groupby(["backend", "dtype"]):
        (line,) = ax.plot(d["seqlen"], d["tokens_per_s"] / 1e6, marker="o", color=palette.color(backend),
                          ls=palette.DTYPE_LINESTYLES.get(dtype, "-"), label=f"{backend} {dtype}")
        _tag(line, backend)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("seqlen")
    ax.set_ylabel("Mtokens/s")
    ax.legend(fontsize=8)
    return fig


def accuracy(table: pd.DataFrame, stage: str = "forward"):
    t = table[table["stage"] == stage]
    if t.empty:
        return _empty("accuracy")
    dtypes = list(dict.fromkeys(t["dtype"]))
    fig, axes = plt.subplots(1, len(dtypes), figsize=(4 * len(dtypes), 3.2), squeeze=False, sharey=False)
    for ax, dtype in zip(axes[0], dtypes):
        d = t[t["dtype"] == dtype]
        for backend, g in d.groupby("backend"):
            (line,) = ax.plot(g["seqlen"], g["rel_err"], marker="o", color=palette.color(backend), label=backend)
            _tag(line, backend)
        ax.axhline(d["tol"].max(), color="k", ls="--", lw=0.8, label="tolerance")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{dtype} ({stage})", fontsize=9)
        ax.set_xlabel("seqlen")
    axes[0][0].set_ylabel("‖out − ref‖ / ‖ref‖")
    axes[0][-1].legend(fontsize=7)
    return fig


def compile_cost(table: pd.DataFrame):
    """Wall time of each stage's first call, per stage, one bar per backend in its color; one panel per GPU
    (compile_table keeps GPUs apart, and so does the figure: no bar pools two cards)."""
    t = table[table["stage"].isin(TIMED_STAGES)]
    if t.empty:
        return _empty("first-call cost")
    gpu = t["gpu_name"].astype(str) if "gpu_name" in t else pd.Series("", index=t.index)
    gpus = list(dict.fromkeys(gpu))
    fig, axes = plt.subplots(1, len(gpus), figsize=(6.5 * len(gpus), 3.4), squeeze=False)
    for ax, name in zip(axes[0], gpus):
        m = t[gpu == name].groupby(["stage", "backend"])["compile_s"].median().unstack("backend")
        m = m.reindex([s for s in TIMED_STAGES if s in m.index])
        width = 0.8 / len(m.columns)
        x = np.arange(len(m.index))
        for i, backend in enumerate(m.columns):
            bars = ax.bar(x + (i - (len(m.columns) - 1) / 2) * width, m[backend], width,
                          color=palette.color(backend), label=backend)
            _tag(bars.patches, backend)
        ax.set_yscale("log")
        ax.set_xticks(x, m.index, fontsize=8)
        ax.set_ylabel("first call (s)")
        if len(gpus) > 1:
            ax.set_title(name, fontsize=9)
        ax.legend(fontsize=7)
    return fig
