"""Figures from the analysis tables (matplotlib, Agg backend: no display needed). Each function takes the
table its module returns and gives a Figure; `save(fig, folder, name)` writes name.png and name.svg."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: headless CI and report runs
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from analysis.load import TIMED_STAGES  # noqa: E402


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


def speedup_bars(table: pd.DataFrame, stage: str = "forward"):
    """Speedup over the baseline per shape (and geomean), one bar per backend, with the spread as error bars."""
    t = table[(table["stage"] == stage) & table["speedup"].notna()]
    if t.empty:
        return _empty(f"speedup ({stage})")
    shapes = list(dict.fromkeys(t["case"]))
    backends = list(dict.fromkeys(t["backend"]))
    fig, ax = plt.subplots(figsize=(1.2 + 1.1 * len(shapes) * max(1, len(backends)) / 2.5, 3.6))
    width = 0.8 / len(backends)
    x = np.arange(len(shapes))
    for i, b in enumerate(backends):
        d = t[t["backend"] == b].drop_duplicates("case").set_index("case").reindex(shapes)
        err = np.vstack([d["speedup"] - d["speedup_lo"], d["speedup_hi"] - d["speedup"]]).clip(min=0)
        ax.bar(x + (i - (len(backends) - 1) / 2) * width, d["speedup"], width, yerr=np.nan_to_num(err), label=b,
               capsize=2)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(x, shapes, rotation=30 if len(shapes) > 5 else 0, ha="right" if len(shapes) > 5 else "center",
                  fontsize=8)
    ax.set_ylabel(f"speedup over {t['baseline'].iloc[0]}")
    ax.set_title(f"{stage}: speedup (higher is faster)")
    ax.legend(fontsize=8)
    return fig


def ablation_bars(table: pd.DataFrame):
    """Effect of each switch on top of the others (percent of the time without it); no-ops drawn as hatched
    empty bars labelled 'no-op', never as a value."""
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
        ax.barh(y, np.where(noop, 0, np.nan_to_num(eff)), color=["tab:green" if e >= 0 else "tab:red" for e in
                                                               np.nan_to_num(eff)])
        for yi, n, st in zip(y, noop, d["status"]):
            if n:
                ax.text(0, yi, "  no-op on this arch", va="center", fontsize=8, style="italic")
            elif st == "not measured":
                ax.text(0, yi, "  not measured", va="center", fontsize=8, color="grey")
        ax.set_yticks(y, d["switch"])
        ax.axvline(0, color="k", lw=0.8)
        ax.set_xlabel("time saved by the switch (%)")
        ax.set_title(f"{backend} {shape} {dtype} ({d['stage'].iloc[0]})", fontsize=9)
    fig.tight_layout()
    return fig


def roofline(table: pd.DataFrame):
    """Achieved TFLOP/s against arithmetic intensity (model flops / model bytes), with the measured ceilings."""
    t = table[table["tflops"].notna() & (table["intensity"] > 0)]
    if t.empty:
        return _empty("roofline")
    fig, ax = plt.subplots(figsize=(6, 4))
    for (backend, stage), d in t.groupby(["backend", "stage"]):
        ax.scatter(d["intensity"], d["tflops"], label=f"{backend} {stage}", s=18)
    peak, bw = t["matmul_tflops"].median(), t["copy_gbps"].median()
    if np.isfinite(peak) and np.isfinite(bw):
        xs = np.logspace(np.log10(t["intensity"].min() / 4), np.log10(t["intensity"].max() * 4), 100)
        ax.plot(xs, np.minimum(peak, xs * bw / 1e3), "k--", lw=1, label="measured ceilings")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("FLOP / byte (cost model)")
    ax.set_ylabel("TFLOP/s achieved")
    ax.legend(fontsize=7)
    return fig


def seqlen_scaling(table: pd.DataFrame):
    if table.empty:
        return _empty("seqlen scaling")
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for (backend, dtype), d in table.groupby(["backend", "dtype"]):
        ax.plot(d["seqlen"], d["tokens_per_s"] / 1e6, marker="o", label=f"{backend} {dtype}")
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
            ax.plot(g["seqlen"], g["rel_err"], marker="o", label=backend)
        ax.axhline(d["tol"].max(), color="k", ls="--", lw=0.8, label="tolerance")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{dtype} ({stage})", fontsize=9)
        ax.set_xlabel("seqlen")
    axes[0][0].set_ylabel("‖out − ref‖ / ‖ref‖")
    axes[0][-1].legend(fontsize=7)
    return fig


def compile_cost(table: pd.DataFrame):
    t = table[table["stage"].isin(TIMED_STAGES)]
    if t.empty:
        return _empty("first-call cost")
    m = t.groupby(["backend", "stage"])["compile_s"].median().unstack("stage")
    m = m[[s for s in TIMED_STAGES if s in m.columns]]
    fig, ax = plt.subplots(figsize=(6, 3.2))
    m.plot.bar(ax=ax, logy=True)
    ax.set_ylabel("first call (s)")
    ax.set_xlabel("")
    ax.legend(fontsize=7)
    return fig
