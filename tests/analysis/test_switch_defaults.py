"""Each backend's default switch set per card (impls/<backend>/defaults.py `Preset.chosen_by`) against the committed
rows it names: the card, the number of switch sets those rows ran at S1–S4, the preset the fastest forward geomean
among them; and `python -m impls switches` prints them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from analysis.load import repo_root, wide
from analysis.switches import explicit_switches
from impls import cli
from impls.registry import backend_class

SHAPES = ("S1", "S2", "S3", "S4")
CHOSEN = [(backend, name, rows) for backend in ("cutile", "triton")
          for name, preset in backend_class(backend).DEFAULTS.presets.items() for rows in preset.chosen_by]


def sets_at_s1_s4(path: str, backend: str) -> dict[str, float]:
    """The backend's switch sets (its explicit switches, as JSON) that ran the forward at every one of S1–S4 in the
    rows, each with its geomean over S1–S4 of the median of its rounds' medians."""
    w = wide(repo_root() / path)
    f = w[(w["backend"] == backend) & (w["stage"] == "forward") & (w["status"] == "ok") & w["shape_name"].isin(SHAPES)]
    key = [json.dumps(explicit_switches(backend, d), sort_keys=True) for d in f["switch_dict"]]
    medians = f.assign(set=key).groupby(["set", "shape_name"])["median_ms"].median().unstack()
    medians = medians.reindex(columns=list(SHAPES)).dropna()
    return {s: float(np.exp(np.log(medians.loc[s]).mean())) for s in medians.index}


@pytest.mark.parametrize("backend,preset,chosen", CHOSEN,
                         ids=[f"{b}-{p}-{c.card.split()[1]}-{c.rows.split('/')[1]}" for b, p, c in CHOSEN])
def test_chosen_rows_say_what_the_defaults_claim(backend, preset, chosen):
    rows = wide(repo_root() / chosen.rows)
    assert set(rows["gpu_name"].dropna()) == {chosen.card}
    sets = sets_at_s1_s4(chosen.rows, backend)
    assert len(sets) == chosen.sets, sets
    values = dict(backend_class(backend).DEFAULTS.preset(preset).values)
    assert min(sets, key=sets.get) == json.dumps(explicit_switches(backend, values), sort_keys=True)


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
