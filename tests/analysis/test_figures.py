"""Every figure, rendered from the synthetic fixture and from committed results of one run each (results/index.yaml):
one color per backend across all of them (analysis.palette), legends without raw point labels ({switch=...},
[tuned]), shapes captioned with their model."""

from __future__ import annotations

from pathlib import Path

import matplotlib.colors as mcolors
import matplotlib.pyplot as plt
import pytest
from matplotlib.collections import Collection
from matplotlib.lines import Line2D

from analysis import figures, palette
from analysis.load import wide
from analysis.report import tables
from impls.registry import list_backends

pytestmark = pytest.mark.filterwarnings("ignore:More than 20 figures:RuntimeWarning")  # all figures at once

ROOT = Path(__file__).resolve().parents[2]
SOURCES = {
    "fixture": ROOT / "tests" / "fixtures" / "h200_synthetic.parquet",  # has a cutile{operand_swap=True} variant
    "headline": "index:headline",                                      # tuned and fallback points, five backends
    "ablations-cutile": "index:ablate_cutile_v13_v17",                 # a figure reads one run: one backend here
    "ablations-triton": "index:ablate_triton_tma_ws",
    "headline-before-vllm": "index:headline_five_backends",
}


def render(source) -> dict[str, plt.Figure]:
    t = tables(wide(source))
    figs = {"ablation": figures.ablation_bars(t["ablation"]), "roofline": figures.roofline(t["roofline"]),
            "seqlen_scaling": figures.seqlen_scaling(t["seqlen"]), "accuracy": figures.accuracy(t["accuracy"]),
            "compile_cost": figures.compile_cost(t["compile"])}
    if "speedup" in t["speedup"]:
        figs["speedup_forward"] = figures.speedup_bars(t["speedup"], "forward")
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
    assert "tuned configs" in texts["headline/speedup_forward"]


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
    markers = {h.get_marker() for h in fig.axes[0].get_legend().legend_handles if hasattr(h, "get_marker")}
    assert {palette.STAGE_MARKERS[s] for s in ("fwd_pass_state", "compute_out", "forward")} <= markers


@pytest.mark.parametrize("label,expect", [
    ("cutile", palette.Label("cutile")), ("cutile[tuned]", palette.Label("cutile", tuned=True)),
    ("tilegym{precompile_workers=8}[tuned]", palette.Label("tilegym", True, "precompile_workers=8")),
    ("triton[only:exp2]", palette.Label("triton", False, "only:exp2")),
], ids=["plain", "tuned", "variant-tuned", "ablation"])
def test_parse_label(label, expect):
    assert palette.parse_label(label) == expect
