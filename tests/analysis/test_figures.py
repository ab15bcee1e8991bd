"""Every figure, rendered from the synthetic fixture and from committed results of one run each (results/index.yaml):
one color per backend across all of them (analysis.palette), legends without raw point labels ({switch=...},
[tuned]), shapes captioned with their model, titles naming card, date and rows, names that do not overlap, and
"tuned" only over tiles searched for the point."""

from __future__ import annotations

from pathlib import Path

import matplotlib.colors as mcolors
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import Collection
from matplotlib.lines import Line2D
from matplotlib.text import Annotation, Text

from analysis import figures, palette
from analysis.load import resolve_results, wide
from analysis.report import tables
from analysis.speedup import tuned_label
from impls.registry import list_backends

pytestmark = pytest.mark.filterwarnings("ignore:More than 20 figures:RuntimeWarning")  # all figures at once

ROOT = Path(__file__).resolve().parents[2]
SOURCES = {
    "fixture": ROOT / "tests" / "fixtures" / "h200_synthetic.parquet",  # has a cutile{operand_swap=True} variant
    "headline": "index:headline",                                      # tuned and fallback points, five backends
    "ablations-cutile": "index:ablate_cutile_v13_v17",                 # a figure reads one run: one backend here
    "ablations-triton": "index:ablate_triton_tma_ws",
    "headline-before-vllm": "index:headline_five_backends",
    "front-page-h100": "index:front_page_h100",                        # cuTile's defaults on fallback tiles at S2-S4
}


def render(source) -> dict[str, plt.Figure]:
    w = wide(source)
    t = tables(w)
    src = figures.source_of(w, resolve_results(source))
    figs = {"ablation": figures.ablation_bars(t["ablation"], src), "roofline": figures.roofline(t["roofline"], src),
            "seqlen_scaling": figures.seqlen_scaling(t["seqlen"], src),
            "accuracy": figures.accuracy(t["accuracy"], source=src),
            "compile_cost": figures.compile_cost(t["compile"], src)}
    if "speedup" in t["speedup"]:
        figs["speedup_forward"] = figures.speedup_bars(t["speedup"], "forward", source=src)
    return figs


@pytest.fixture(scope="module")
def rendered():
    out = {f"{src}/{name}": fig for src, path in SOURCES.items() for name, fig in render(path).items()}
    yield out
    for fig in out.values():
        plt.close(fig)


def _artist_colors(fig):
    """(backend, hex color) of every artist a figure drew for a backend (gid "backend:<name>")."""
    for artist in fig.findobj(lambda a: str(a.get_gid() or "").startswith("backend:")):
        if isinstance(artist, Line2D):
            rgba = artist.get_color()
        elif isinstance(artist, Collection):  # scatter points
            rgba = artist.get_facecolor()[0]
        else:  # bars
            rgba = artist.get_facecolor()
        yield artist.get_gid().split(":", 1)[1], mcolors.to_hex(rgba)


def test_every_backend_has_a_color_of_its_own():
    assert set(list_backends()) <= set(palette.BACKEND_COLORS)
    assert len(set(palette.BACKEND_COLORS.values())) == len(palette.BACKEND_COLORS)


def test_one_color_per_backend_across_every_figure(rendered):
    seen: dict[str, set[str]] = {}
    for fig in rendered.values():
        for backend, hex_color in _artist_colors(fig):
            seen.setdefault(backend, set()).add(hex_color)
    assert {"cutile", "triton", "mamba_ssm", "tilegym", "fla"} <= set(seen)
    assert {b: c for b, c in seen.items() if c != {palette.BACKEND_COLORS[b]}} == {}


def test_legends_have_no_raw_point_labels(rendered):
    texts = {name: [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
             for name, fig in rendered.items()}
    assert {n: [t for t in ts if "{" in t or "[" in t] for n, ts in texts.items() if any("{" in t or "[" in t
                                                                                          for t in ts)} == {}
    assert any("operand_swap=True" in t for t in texts["fixture/speedup_forward"])  # the variant, in words
    assert "tiles searched for the point" in texts["headline/speedup_forward"]


def test_tuned_points_are_hatched_and_shapes_carry_their_model(rendered):
    fig = rendered["headline/speedup_forward"]
    def hatches(backend):
        return {p.get_hatch() or "" for p in fig.findobj(lambda a: str(a.get_gid() or "") == f"backend:{backend}")}

    assert hatches("cutile") == {palette.TUNED_HATCH}  # on its tuning records
    assert hatches("mamba_ssm") == {""}  # upstream's own autotuners: not one of our records
    ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert "S1\nMamba-2 2.7B\n8×4096" in ticks


def test_roofline_marks_each_stage_apart(rendered):
    fig = rendered["headline/roofline"]
    markers = {h.get_marker() for h in fig.legends[0].legend_handles if hasattr(h, "get_marker")}
    assert {palette.STAGE_MARKERS[s] for s in ("fwd_pass_state", "compute_out", "forward")} <= markers


def test_every_figure_titles_its_card_date_and_rows(rendered):
    """The suptitle names the run's gpu_name, its date and the rows it was drawn from."""
    expect = {"headline": ("NVIDIA H200", "2026-12-04", "headline.parquet"),
              "front-page-h100": ("NVIDIA H100 80GB HBM3", "2026-12-06", "headline_fair_fight_one_round.parquet")}
    for name, fig in rendered.items():
        src = name.split("/")[0]
        title = fig._suptitle.get_text().replace("\n", "") if fig._suptitle is not None else ""
        assert title and all(part in title for part in expect.get(src, ())), (name, title)
        assert "rows: " in title and "/work" not in title, (name, title)


def test_roofline_names_every_point_and_ceiling(rendered):
    fig = rendered["headline/roofline"]
    texts = {t.get_text() for ax in fig.axes for t in ax.texts}
    assert {"cutile/forward", "triton/compute_out", "mamba_ssm/fwd_pass_state", "vllm/forward"} <= texts
    assert any(t.startswith("matmul ceiling") for t in texts) and any(t.startswith("copy ceiling") for t in texts)
    names = [t for ax in fig.axes for t in ax.texts if isinstance(t, Annotation)]
    assert len(names) == sum(len(c.get_offsets()) for ax in fig.axes for c in ax.collections)


def _overlaps(boxes) -> list[tuple[int, int]]:
    return [(i, j) for i, a in enumerate(boxes) for j, b in enumerate(boxes[i + 1:], i + 1) if a.overlaps(b)]


def test_names_do_not_overlap(rendered):
    """At the saved size: no two switch names of an ablation panel overlap, none runs into another panel, and no two
    point names of a roofline panel overlap."""
    for name in ("ablations-cutile/ablation", "ablations-triton/ablation", "headline/roofline"):
        fig = rendered[name]
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        for ax in fig.axes:
            labels = [t.get_window_extent(renderer) for t in ax.get_yticklabels() if t.get_text()]
            labels += [Text.get_window_extent(t, renderer) for t in ax.texts if isinstance(t, Annotation)]  # no arrow
            assert _overlaps(labels) == [], name
            others = [o.get_window_extent(renderer) for o in fig.axes if o is not ax and o.get_visible()
                      and o.axison]
            assert [b for b in labels for o in others if b.overlaps(o)] == [], name


def test_accuracy_shows_every_backend(rendered):
    """Backends with equal errors stay visible: each its own marker and line style, and its own x positions."""
    fig = rendered["headline/accuracy"]
    lines = [ln for ln in fig.axes[0].get_lines() if str(ln.get_gid() or "").startswith("backend:")]
    styles = {(ln.get_marker(), str(ln.get_linestyle())) for ln in lines}
    assert len(lines) >= 5 and len(styles) == len(lines)
    xs = [tuple(np.round(ln.get_xdata(), 6)) for ln in lines]
    assert len(set(xs)) == len(xs)


def test_legend_says_tuned_only_over_tiles_searched_for_the_point(rendered):
    """The H100 front page's cuTile defaults ran S2-S4 on fallback tiles: the legend says so, those bars unhatched."""
    fig = rendered["front-page-h100/speedup_forward"]
    texts = [t.get_text().replace("\n", " ") for t in fig.axes[0].get_legend().get_texts()]
    assert "fallback tiles: cutile" in texts
    plain = [p for p in fig.findobj(lambda a: str(a.get_gid() or "") == "backend:cutile")
             if not p.get_hatch() and np.isfinite(p.get_height())]
    assert len(plain) == 4  # S2, S3, S4 and their geomean
    notes = [t.get_text() for ax in rendered["front-page-h100/ablation"].axes for t in ax.texts]
    assert sum("(tiles record / fallback)" in t for t in notes) == 3  # version 13's set on records, the default not


@pytest.mark.parametrize("protocol,tuning,tuned", [
    ("retuned", '{"compute_out": "record"}', True),
    ("pinned", '{"compute_out": "record"}', False),
    ("same-sass", '{"compute_out": "record"}', False),
    (None, '{"compute_out": "record", "fwd_pass_state": "record"}', True),
    (None, '{"compute_out": "record", "fwd_pass_state": "fallback"}', False),
    (None, "none", False),
], ids=["retuned", "pinned", "same-sass", "record", "record-and-fallback", "peer"])
def test_tuned_label_reads_the_tile_protocol(protocol, tuning, tuned):
    w = pd.DataFrame({"backend": ["cutile"], "tile_protocol": pd.array([protocol], dtype="string"),
                      "tuning": [tuning]})
    assert tuned_label(w).iloc[0] == ("cutile[tuned]" if tuned else "cutile")


@pytest.mark.parametrize("label,expect", [
    ("cutile", palette.Label("cutile")), ("cutile[tuned]", palette.Label("cutile", tuned=True)),
    ("tilegym{precompile_workers=8}[tuned]", palette.Label("tilegym", True, "precompile_workers=8")),
    ("triton[only:exp2]", palette.Label("triton", False, "only:exp2")),
], ids=["plain", "tuned", "variant-tuned", "ablation"])
def test_parse_label(label, expect):
    assert palette.parse_label(label) == expect
