"""Figures from the analysis tables (matplotlib, Agg backend: no display needed). Each function takes the
table its module returns and gives a Figure; `save(fig, folder, name)` writes name.png and name.svg.

Every figure draws a backend in its one color (analysis.palette), tuned points hatched, stages by marker, shapes
captioned with their model; legends never show raw point labels. Each artist drawn for a backend carries the gid
"backend:<name>" (tests check the colors through it). Error bars are the p20–p80 of one run; points pooled from
several runs get none. The tables come from one run's rows (analysis.load.one_run), so no figure mixes runs; every
figure's title names that run's card, dates and rows (`Source`). Figures are sized for the docs' display width
(DOC_WIDTH_IN at the saved DPI: about 900 pixels); the roofline names each point and ceiling beside it, the ablation
each bar on its tick and its effect at its end, and legends say where tiles came from ("tuned" only for tiles searched
for the point: analysis.palette.is_tuned)."""

from __future__ import annotations

import os
import textwrap
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: headless CI and report runs
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import NullFormatter  # noqa: E402

from analysis import palette  # noqa: E402
from analysis.load import TIMED_STAGES, repo_root  # noqa: E402
from analysis.noise import WITHIN_NOISE  # noqa: E402

DPI = 120
DOC_WIDTH_IN = 7.5  # inches at DPI: the ~900-pixel width a Markdown page shows an image at without scaling it down


@dataclass(frozen=True)
class Source:
    """Where a figure's rows come from, for its title: the card (gpu_name), the dates of the rows, and the rows (a
    results file or folder, and the run group)."""

    gpu: str
    days: str
    rows: str

    def title(self) -> str:
        return f"{self.gpu}, {self.days}; rows: {self.rows}"


def source_of(w: pd.DataFrame, rows: str) -> Source:
    """The Source of one run's wide rows `w` read from `rows` (a path or index name, as the page names it)."""
    gpu = w["gpu_name"].dropna() if "gpu_name" in w else pd.Series(dtype=object)
    if gpu.empty and "device_name" in w:
        gpu = w["device_name"].dropna()
    days = sorted({str(t)[:10] for t in w["timestamp"].dropna()}) if "timestamp" in w else []
    groups = sorted({str(g) for g in w["run_group"].dropna()}) if "run_group" in w else []
    rows = ", ".join(os.path.relpath(r, repo_root()) if os.path.isabs(r) else r for r in str(rows).split(", "))
    return Source(", ".join(sorted(set(gpu))) or "unknown card",
                  " to ".join(dict.fromkeys([days[0], days[-1]])) if days else "undated",
                  f"{rows}" + (f" (run group {', '.join(groups)})" if groups else ""))


def _title(fig, what: str, source: Source | None) -> None:
    """The figure's title: what it shows, then its card, dates and rows, wrapped to the figure's width."""
    text = what if source is None else f"{what}\n{source.title()}"
    width = int(fig.get_figwidth() * 14)  # characters of 8-point text per inch
    fig.suptitle("\n".join(textwrap.fill(line, width) for line in text.split("\n")), fontsize=8)


def _finish(fig, what: str, source: Source | None, bottom: float = 0.0):
    """Titles the figure (`_title`) and lays it out below the title (`bottom`: inches kept free for a figure
    legend); returns the figure."""
    _title(fig, what, source)
    height = fig.get_figheight()
    fig.tight_layout(rect=(0, bottom / height, 1, 1 - 0.08 / height))  # it keeps the suptitle's room itself
    return fig


def save(fig, folder: str | Path, name: str) -> list[Path]:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"{name}.png", folder / f"{name}.svg"]
    fig.savefig(paths[0], dpi=DPI, bbox_inches="tight")
    fig.savefig(paths[1], bbox_inches="tight")
    plt.close(fig)
    return paths


def _empty(title: str, source: Source | None = None):
    fig, ax = plt.subplots(figsize=(DOC_WIDTH_IN, 1.6))
    ax.axis("off")
    ax.text(0.5, 0.5, f"{title}: no rows for this figure", ha="center", va="center", fontsize=8)
    return _finish(fig, title, source)


def _tag(artists, backend: str) -> None:
    for artist in np.atleast_1d(artists):
        artist.set_gid(f"backend:{palette.parse_label(backend).backend}")


def _backend_legend(ax, labels, tiles: dict[str, str] | None = None, **kw) -> None:
    """One entry per backend (its color) and variant; where tuned points are drawn, the hatch's meaning, and what
    the unhatched points' tiles are, as their rows say (`tiles`: label -> analysis.palette.tile_words)."""
    parsed = [palette.parse_label(lab) for lab in labels]
    handles, seen = [], set()
    for lab in parsed:
        key = (lab.backend, lab.variant)
        if key not in seen:
            seen.add(key)
            handles.append(Patch(facecolor=palette.color(lab.backend),
                                 hatch=palette.VARIANT_HATCH if lab.variant else "", label=_wrap(lab.text, 40)))
    if tiles is not None and any(lab.tuned for lab in parsed):
        handles.append(Patch(facecolor="white", edgecolor="k", hatch=palette.TUNED_HATCH,
                             label="tiles searched for the point"))
        plain = {}
        for raw, lab in zip(labels, parsed):
            if not lab.tuned and tiles.get(raw):
                plain.setdefault(tiles[raw], []).append(lab.backend)
        for words, backends in plain.items():
            handles.append(Patch(facecolor="white", edgecolor="k",
                                 label=_wrap(f"{words}: {', '.join(dict.fromkeys(backends))}", 40)))
    ax.legend(handles=handles, **kw)


def _wrap(text: str, width: int) -> str:
    """A tick label broken after "+" and at spaces into lines of at most `width` characters (a longer name keeps a
    line of its own, unbroken)."""
    words = str(text).replace("+", "+ ").split(" ")
    lines, line = [], ""
    for word in filter(None, words):
        if line and len(line) + len(word) + 1 > width:
            lines.append(line)
            line = ""
        line += word if not line or line.endswith("+") else " " + word
    lines.append(line)
    return "\n".join(lines)


def speedup_bars(table: pd.DataFrame, stage: str = "forward", source: Source | None = None):
    """Speedup over the baseline per shape (and geomean, each geomean bar topped by the number of shapes it covers),
    one bar per backend in its color, points whose tiles were searched for them hatched (the legend names what the
    others' tiles are); error bars: p20–p80 of the one run behind a bar (none for the geomean or for points pooled
    from runs)."""
    t = table[(table["stage"] == stage) & table["speedup"].notna()]
    if t.empty:
        return _empty(f"speedup ({stage})", source)
    shapes = list(dict.fromkeys(t["case"]))
    first = t.drop_duplicates("case").set_index("case")
    captions = [palette.shape_caption(first.at[c, "shape_name"], first.at[c, "shape"]).replace(": ", "\n", 1)
                .replace(", ", "\n") for c in shapes]
    labels = sorted(dict.fromkeys(t["backend"]), key=lambda b: (palette.parse_label(b).backend, b))
    tiles = {lab: next(iter(t.loc[(t["backend"] == lab) & t["tiles"].fillna("").ne(""), "tiles"]), "")
             for lab in labels} if "tiles" in t else {}
    fig, ax = plt.subplots(figsize=(DOC_WIDTH_IN, 5.2))
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
        geo = (d["shape_name"] == "geomean").to_numpy() & d["speedup"].notna().to_numpy()
        for xg, yg, n in zip(xs[geo], d["speedup"].to_numpy()[geo], d["shape"].to_numpy()[geo]):
            ax.text(xg, yg, f" {str(n).split()[0]}", ha="center", va="bottom", fontsize=6, rotation=90)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(x, captions, fontsize=7)
    ax.set_ylabel(f"speedup over {t['baseline'].iloc[0]}")
    _backend_legend(ax, labels, tiles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3)
    return _finish(fig, f"{stage}: speedup over {t['baseline'].iloc[0]} (higher is faster; error bars p20–p80 of "
                   "one run; above a geomean bar, the number of shapes it covers; points of ablation sweeps left "
                   "out)", source)


def _panel_note(d: pd.DataFrame) -> list[tuple[str, dict]]:
    """The text beside each bar of an ablation panel, with its style: the effect (and, for a comparison apart, where
    the two points' tiles came from: protocol, else tuning sources, "<point> / <default>"), or why there is none."""
    notes = []
    sources = d["tile_sources"].fillna("") if "tile_sources" in d else pd.Series("", index=d.index)
    for value, noop, quiet, status, apart, tiles, src in zip(d["shown"], d["noop"], d["quiet"], d["status"],
                                                             d["apart"], d["tiles"].fillna(""), sources):
        if noop:
            notes.append(("no-op on this arch", {"style": "italic"}))
        elif quiet:
            notes.append((WITHIN_NOISE, {"color": "grey"}))
        elif status == "not measured" or not np.isfinite(value):
            notes.append(("not measured", {"color": "grey"}))
        else:
            where = (src if tiles == "unknown" and src else tiles) if apart else ""
            notes.append((f"{value:+.1f} %" + (f" (tiles {where})" if where else ""), {}))
    return notes


NOTE_CHAR_IN = 6.5 / 72 * 0.58  # the width of a 6.5-point character, about


def _ablation_frame(table: pd.DataFrame) -> pd.DataFrame:
    """The table with what a panel draws: `shown` (the effect in percent; 0 for no-ops and effects within noise),
    `noop`, `quiet` and `apart` (the compared points' tiles not both searched for their own code)."""
    eff = table["effect_on_top"].to_numpy(float) * 100
    noop = table["status"].str.startswith("no-op").to_numpy()
    quiet = (table["on_top"] == WITHIN_NOISE).to_numpy() if "on_top" in table else np.zeros(len(table), bool)
    return table.assign(shown=np.where(noop | quiet, 0.0, eff), noop=noop, quiet=quiet,
                        apart=table["status"].str.startswith("apart").to_numpy())


def _tiles_named(rows: pd.DataFrame) -> list[str]:
    """Where each row's compared points' tiles came from: its protocols, and its tuning sources where the rows
    recorded no protocol ("no protocol recorded, tuning record / fallback": the point's / the default's)."""
    sources = rows["tile_sources"] if "tile_sources" in rows else pd.Series("", index=rows.index)
    return [f"no protocol recorded, tuning {src}" if tiles == "unknown" and src else str(tiles)
            for tiles, src in zip(rows["tiles"].fillna("unknown"), sources.fillna(""))]


def ablation_bars(table: pd.DataFrame, source: Source | None = None):
    """Effect of each switch on top of the others (percent of the time without it), in the backend's color: per
    backend one row of panels per two (shape, dtype), sharing the switch names (wrapped) on the left, each bar valued
    at its end; no-ops and effects within the run's noise drawn as empty bars labelled so, never as a value; a
    comparison whose tiles are not both searched for their code hatched (the title names those tiles). Switches that
    no panel of a backend measured are named under its panels instead of drawn."""
    if table.empty:
        return _empty("ablation", source)
    t = _ablation_frame(table).fillna({"tiles": "", "status": "not measured"})
    backends = list(dict.fromkeys(t["backend"]))
    longest = max(len(note) for _, g in t.groupby(["backend", "shape_name", "dtype"]) for note, _ in _panel_note(g))
    cols = 2 if longest <= 16 else 1  # notes that name tiles need the docs' whole width
    layout = []  # (backend, switches drawn, [(shape, dtype), ...] per row, switches not measured)
    for backend in backends:
        mine = t[t["backend"] == backend]
        drawn = mine.groupby("switch", sort=False)["status"].apply(lambda st: (st != "not measured").any())
        switches = [sw for sw in dict.fromkeys(mine["switch"]) if drawn[sw]]
        groups = list(dict.fromkeys(zip(mine["shape_name"], mine["dtype"])))
        for i in range(0, len(groups), cols):
            layout.append((backend, switches, groups[i:i + cols], [sw for sw in drawn.index if not drawn[sw]]))
    last_row = {backend: groups for backend, _, groups, _ in layout}  # the backend's last row names what it lacks
    heights = [sum(0.13 * (_wrap(x, 24).count("\n") + 1) + 0.12 for x in sw) + 0.8 for _, sw, _, _ in layout]
    fig, axes = plt.subplots(len(layout), cols, figsize=(DOC_WIDTH_IN, sum(heights) + 0.9), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for row, (backend, switches, groups, unmeasured) in zip(axes, layout):
        panels = [t[(t["backend"] == backend) & (t["shape_name"] == s) & (t["dtype"] == dt)]
                  .set_index("switch").reindex(switches) for s, dt in groups]
        span = max([float(np.nanmax(np.abs(p["shown"]))) for p in panels if p["shown"].notna().any()] + [1.0])
        negative = any((p["shown"] < 0).any() for p in panels)
        axis_in = (DOC_WIDTH_IN - 1.7) / cols - (0.3 if cols > 1 else 0)
        share = min(0.03 + longest * NOTE_CHAR_IN / axis_in, 0.7)  # of the axis width, for the notes
        for col, (ax, (shape, dtype)) in enumerate(zip(row, groups)):
            d = panels[col].assign(status=lambda x: x["status"].fillna("not measured"),
                                   noop=lambda x: x["noop"].fillna(False).astype(bool),
                                   quiet=lambda x: x["quiet"].fillna(False).astype(bool),
                                   apart=lambda x: x["apart"].fillna(False).astype(bool))
            y = np.arange(len(d))
            shown = d["shown"].to_numpy(float)
            bars = ax.barh(y, np.nan_to_num(shown), color=palette.color(backend), edgecolor="white",
                           hatch=[palette.VARIANT_HATCH if a else "" for a in d["apart"]])
            _tag(bars.patches, backend)
            for yi, value, (note, kw) in zip(y, np.nan_to_num(shown), _panel_note(d)):  # right of the bar or of 0
                ax.text(max(value, 0) + 0.03 * span, yi, note, va="center", ha="left", fontsize=6.5, **kw)
            ax.set_yticks(y, [_wrap(s, 24) for s in d.index] if col == 0 else [""] * len(y), fontsize=6.5)
            ax.set_ylim(len(y) - 0.5, -0.5)
            ax.axvline(0, color="k", lw=0.8)
            left = -1.1 * span if negative else -0.05 * span  # one scale across a backend's panels
            ax.set_xlim(left, (span - share * left) / (1 - share))  # the longest note fits right of the longest bar
            ax.tick_params(axis="x", labelsize=6.5)
            ax.set_title(f"{backend}, {palette.shape_caption(shape)}, {dtype}", fontsize=7)
            if unmeasured and col == 0 and groups is last_row[backend]:
                ax.set_xlabel(_wrap("not measured here: " + ", ".join(unmeasured), 60), fontsize=6, color="grey")
        for ax in row[len(groups):]:
            ax.axis("off")
    apart_tiles = sorted(set(_tiles_named(t[t["apart"]])))
    what = (f"Switch effects at the {', '.join(dict.fromkeys(t['stage']))}, on top of the others: a switch's row, "
            "the time it saves (negative: it costs); a row 'name=value', the time the default saves over that "
            "setting (negative: the setting is faster)")
    if apart_tiles:
        what += (". Hatched: the compared points' tiles not both searched for their own code "
                 f"({'; '.join(apart_tiles)}; a bar's note: the point's / the default's)")
    return _finish(fig, what, source)


def _spread(ys: np.ndarray, gap: float) -> np.ndarray:
    """Label positions (log10 units) for points at `ys`, at least `gap` apart in the points' order: labels that
    would collide form a stack centred on its points, stacks merged until none collide."""
    order = np.argsort(ys, kind="stable")
    stacks: list[list[float]] = []  # each: the ys of its points, in order
    for y in ys[order]:
        stacks.append([float(y)])
        while len(stacks) > 1:
            low, high = stacks[-2], stacks[-1]
            low_top = np.mean(low) + (len(low) - 1) / 2 * gap
            high_bottom = np.mean(high) - (len(high) - 1) / 2 * gap
            if high_bottom - low_top >= gap:
                break
            stacks[-2:] = [low + high]
    placed = [np.mean(st) + (j - (len(st) - 1) / 2) * gap for st in stacks for j in range(len(st))]
    out = np.empty(len(ys))
    out[order] = placed
    return out


NAME_PT = 6  # the roofline's point names
PANEL_IN = 3.3  # a roofline panel's height; its axes about 2.4 inches of it


def _roofline_points(t: pd.DataFrame) -> pd.DataFrame:
    """One row per (shape, label, stage): the median of its repeats' intensity and rate, and the name drawn beside
    it, "backend/stage" (the variant in words before the stage where the backend has several points there)."""
    pooled = t.groupby(["shape_name", "label", "backend", "stage"], sort=False, as_index=False)[
        ["intensity", "tflops"]].median()
    several = pooled.groupby(["shape_name", "backend", "stage"])["label"].transform("nunique") > 1
    pooled["name"] = [f"{palette.parse_label(lab).text if many else b}/{st}"
                      for lab, b, st, many in zip(pooled["label"], pooled["backend"], pooled["stage"], several)]
    return pooled


def roofline(table: pd.DataFrame, source: Source | None = None):
    """Achieved TFLOP/s against arithmetic intensity (model flops / model bytes) with the measured ceilings, one
    panel per shape: color per backend, marker per stage, each point named "backend/stage" beside it (the names of
    one column stacked apart, a thin line to their point) and each ceiling with its measured value."""
    t = table[table["tflops"].notna() & (table["intensity"] > 0)]
    if t.empty:
        return _empty("roofline", source)
    if "label" not in t:
        t = t.assign(label=t["backend"])
    pts = _roofline_points(t)
    shapes = list(dict.fromkeys(pts["shape_name"]))
    cols = min(2, len(shapes))
    rows = -(-len(shapes) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(DOC_WIDTH_IN, PANEL_IN * rows + 0.7), squeeze=False, sharey=True)
    peak, bw = t["matmul_tflops"].median(), t["copy_gbps"].median()
    ceilings = bool(np.isfinite(peak) and np.isfinite(bw))
    knee = peak * 1e3 / bw if ceilings else np.nan
    x_lo = pts["intensity"].min() / 3
    label_x = pts["intensity"].max() * 1.8
    x_hi = max(pts["intensity"].max() * 60, knee * 2 if ceilings else 0)
    y_lo, y_hi = pts["tflops"].min() / 2.5, max(pts["tflops"].max(), peak if ceilings else 0) * 2
    gap = 0.0
    for _ in range(3):  # a name's height in decades at the axes' scale; the range grown to hold the tallest stack
        gap = 1.45 * NAME_PT / 72 * np.log10(y_hi / y_lo) / (PANEL_IN - 0.9)
        half_stack = 10 ** (gap * pts.groupby("shape_name").size().max() / 2)
        y_lo = min(y_lo, gmean(pts["tflops"]) / half_stack / 1.5)
        y_hi = max(y_hi, gmean(pts["tflops"]) * half_stack * 1.5)
    for ax, shape in zip(axes.flat, shapes):
        d = pts[pts["shape_name"] == shape]
        for (backend, stage), g in d.groupby(["backend", "stage"]):
            points = ax.scatter(g["intensity"], g["tflops"], s=22, color=palette.color(backend),
                                marker=palette.marker(stage), edgecolors="k", linewidths=0.3, zorder=3)
            _tag(points, backend)
        d = d.sort_values("tflops")  # the names in one column right of the points, stacked apart, lines to them
        at = _spread(np.log10(d["tflops"].to_numpy(float)), gap)
        for (_, r), y_name in zip(d.iterrows(), at):
            ax.annotate(r["name"], (r["intensity"], r["tflops"]), xytext=(label_x, 10 ** y_name), fontsize=NAME_PT,
                        va="center", color=palette.color(r["backend"]),
                        arrowprops={"arrowstyle": "-", "lw": 0.3, "color": "grey", "shrinkA": 0, "shrinkB": 2})
        if ceilings:
            xs = np.logspace(np.log10(x_lo), np.log10(x_hi), 100)
            ax.plot(xs, np.minimum(peak, xs * bw / 1e3), "k--", lw=0.9)
            ax.text(x_hi / 1.1, peak * 1.1, f"matmul ceiling {peak:.0f} TFLOP/s", ha="right", va="bottom", fontsize=6)
            ax.text(x_lo * 3, x_lo * 3 * bw / 1e3 * 1.3, f"copy ceiling\n{bw:.0f} GB/s", fontsize=6,
                    ha="right", va="bottom")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(x_lo, x_hi)
        ax.set_ylim(y_lo, y_hi)
        ax.set_title(palette.shape_caption(shape), fontsize=8)
        ax.set_xlabel("FLOP / byte (cost model)", fontsize=7)
        ax.set_ylabel("TFLOP/s achieved", fontsize=7)
        ax.tick_params(labelsize=7)
        ax.xaxis.set_minor_formatter(NullFormatter())
    for ax in list(axes.flat)[len(shapes):]:
        ax.axis("off")
    handles = [Line2D([], [], ls="", marker=palette.marker(s), color="k", label=s)
               for s in TIMED_STAGES if s in set(pts["stage"])]
    handles.append(Line2D([], [], color="k", ls="--", label="ceilings measured on the card"))
    fig.legend(handles=handles, fontsize=7, loc="lower center", ncol=len(handles), bbox_to_anchor=(0.5, 0))
    flopless = sorted(set(table.loc[table["flops"].fillna(0) == 0, "stage"])) if "flops" in table else []
    return _finish(fig, "Roofline: achieved rate against the cost model's intensity, per shape (points of "
                   "ablation sweeps left out)"
                   + (f" ({', '.join(flopless)}: no matmul flops, not drawn)" if flopless else ""), source, bottom=0.35)


def gmean(values) -> float:
    v = np.asarray(values, float)
    return float(np.exp(np.log(v[v > 0]).mean()))


def seqlen_scaling(table: pd.DataFrame, source: Source | None = None):
    """Tokens per second against seqlen: color and marker per backend, line style per dtype."""
    if table.empty:
        return _empty("seqlen scaling", source)
    fig, ax = plt.subplots(figsize=(DOC_WIDTH_IN, 4))
    for (backend, dtype), d in table.groupby(["backend", "dtype"]):
        (line,) = ax.plot(d["seqlen"], d["tokens_per_s"] / 1e6, marker=palette.backend_marker(backend),
                          color=palette.color(backend), ls=palette.DTYPE_LINESTYLES.get(dtype, "-"),
                          label=f"{backend} {dtype}")
        _tag(line, backend)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("seqlen")
    ax.set_ylabel("Mtokens/s")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return _finish(fig, "Sequence-length scaling", source)


def accuracy(table: pd.DataFrame, stage: str = "forward", source: Source | None = None):
    """‖out − ref‖ / ‖ref‖ against seqlen, one panel per dtype: each backend its color, marker and line style, and
    shifted a little along x (a fixed offset per backend) so that backends with equal errors stay visible."""
    t = table[table["stage"] == stage]
    if t.empty:
        return _empty("accuracy", source)
    dtypes = list(dict.fromkeys(t["dtype"]))
    backends = sorted(t["backend"].unique())
    fig, axes = plt.subplots(len(dtypes), 1, figsize=(DOC_WIDTH_IN, 3.4 * len(dtypes)), squeeze=False)
    for ax, dtype in zip(axes[:, 0], dtypes):
        d = t[t["dtype"] == dtype]
        for i, backend in enumerate(backends):
            g = d[d["backend"] == backend].sort_values("seqlen")
            if g.empty:
                continue
            shift = 2 ** (0.1 * (i - (len(backends) - 1) / 2))  # a few percent along a log2 axis
            (line,) = ax.plot(g["seqlen"] * shift, g["rel_err"], marker=palette.backend_marker(backend),
                              ls=palette.backend_linestyle(backend), color=palette.color(backend), label=backend,
                              markersize=5, lw=1.2, alpha=0.9)
            _tag(line, backend)
        ax.axhline(d["tol"].max(), color="k", ls="--", lw=0.8, label="tolerance")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{dtype} ({stage}); points shifted a little along x per backend so that none hides another",
                     fontsize=8)
        ax.set_xlabel("seqlen")
        ax.set_ylabel("‖out − ref‖ / ‖ref‖")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return _finish(fig, "Accuracy against the float64 reference", source)


def compile_cost(table: pd.DataFrame, source: Source | None = None):
    """Wall time of each stage's first call, per stage, one bar per backend in its color; one panel per GPU
    (compile_table keeps GPUs apart, and so does the figure: no bar pools two cards)."""
    t = table[table["stage"].isin(TIMED_STAGES)]
    if t.empty:
        return _empty("first-call cost", source)
    gpu = t["gpu_name"].astype(str) if "gpu_name" in t else pd.Series("", index=t.index)
    gpus = list(dict.fromkeys(gpu))
    fig, axes = plt.subplots(len(gpus), 1, figsize=(DOC_WIDTH_IN, 3.6 * len(gpus)), squeeze=False)
    for ax, name in zip(axes[:, 0], gpus):
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
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return _finish(fig, "First-call cost (compile and autotune included)", source)
