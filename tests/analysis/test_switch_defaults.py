"""Each backend's default switch set per card (impls/<backend>/defaults.py `Preset.chosen_by`) against the committed
rows it names: the card, the number of switch sets those rows ran in the choice's direction at its shapes (the forward
at S1–S4 unless named), the preset the fastest geomean among them (a forward choice compared on the switches the
forward reads: the backward's `bwd_*` switches are chosen by backward rows); and `python -m impls switches` prints
them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from analysis.load import repo_root, wide
from analysis.switches import explicit_switches
from impls import cli
from impls.registry import backend_class

SHAPES = ("S1", "S2", "S3", "S4")
BACKWARD_PREFIX = "bwd_"  # the backward's own switches (impls/<backend>/switches.py)
CHOSEN = [(backend, name, rows) for backend in ("cutile", "triton")
          for name, preset in backend_class(backend).DEFAULTS.presets.items() for rows in preset.chosen_by]


def compared(backend: str, values: dict, direction: str) -> str:
    """A switch set as a choice of `direction` compares it (JSON of its explicit switches): the forward's without the
    backward's own switches, which its rows did not choose."""
    explicit = explicit_switches(backend, values)
    if direction == "forward":
        explicit = {k: v for k, v in explicit.items() if not k.startswith(BACKWARD_PREFIX)}
    return json.dumps(explicit, sort_keys=True)


def sets_measured(path: str, backend: str, direction: str = "forward", shapes=SHAPES) -> dict[str, float]:
    """The backend's switch sets (`compared`) that ran `direction` at every one of `shapes` in the rows, each with its
    geomean over the shapes of the median of its rounds' medians."""
    w = wide(repo_root() / path)
    f = w[(w["backend"] == backend) & (w["stage"] == direction) & (w["status"] == "ok") & w["shape_name"].isin(shapes)]
    key = [compared(backend, d, direction) for d in f["switch_dict"]]
    medians = f.assign(set=key).groupby(["set", "shape_name"])["median_ms"].median().unstack()
    medians = medians.reindex(columns=list(shapes)).dropna()
    return {s: float(np.exp(np.log(medians.loc[s]).mean())) for s in medians.index}


@pytest.mark.parametrize("backend,preset,chosen", CHOSEN,
                         ids=[f"{b}-{p}-{c.card.split()[1]}-{c.rows.split('/')[1]}-{c.direction}"
                              for b, p, c in CHOSEN])
def test_chosen_rows_say_what_the_defaults_claim(backend, preset, chosen):
    rows = wide(repo_root() / chosen.rows)
    assert set(rows["gpu_name"].dropna()) == {chosen.card}
    sets = sets_measured(chosen.rows, backend, chosen.direction, chosen.shapes)
    assert len(sets) == chosen.sets, sets
    values = dict(backend_class(backend).DEFAULTS.preset(preset).values)
    assert min(sets, key=sets.get) == compared(backend, values, chosen.direction)


@pytest.mark.parametrize("backend", ["cutile", "triton"])
def test_switches_cli_names_the_rows_per_card(backend, capsys):
    """Under the sm_90 line: one line per card and rows that measured its default, with the count of sets compared."""
    assert cli.main(["switches", backend]) == 0
    out = capsys.readouterr().out
    head = out.split("presets:")[0]
    for chosen in backend_class(backend).DEFAULTS.preset("best_sm90").chosen_by:
        assert f"    on {chosen.card}: {chosen.rows}: " in head
    cards = {c.card for c in backend_class(backend).DEFAULTS.preset("best_sm90").chosen_by}
    # cuTile's sm_90 set moved on an H100's rows (2026-12-07); the H200 has not measured it yet
    assert cards == ({"NVIDIA H100 80GB HBM3"} if backend == "cutile" else {"NVIDIA H200", "NVIDIA H100 80GB HBM3"})
    assert "  sm_100: published\n    no committed rows measured it" in head
