"""The committed tuning records (tuning/NVIDIA_H200) resolve, through impls/tuning.py, to the configs the
per-backend resolvers picked before it (frozen in tests/fixtures/tuning_picks_before.json) at the headline shapes
S1–S4 and S1_c128; and they are bound to the stack they were searched on."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
import torch

from impls import tuning
from impls.problem import Shape

BEFORE = json.loads((Path(__file__).parents[1] / "fixtures" / "tuning_picks_before.json").read_text())
SHAPES = {"S1": Shape(8, 4096, 80, 64, 1, 128, 256), "S1_c128": Shape(8, 4096, 80, 64, 1, 128, 128),
          "S2": Shape(1, 65536, 80, 64, 1, 128, 256), "S3": Shape(8, 4096, 64, 64, 8, 128, 256),
          "S4": Shape(16, 2048, 32, 64, 1, 64, 128)}
CUTILE_VARIANTS = {"defaults": {}, "decay_factor": {"decay_factor": True}, "tma_off": {"tma": False},
                   # switches whose records were searched after the picks were frozen (each keys its own record)
                   "later": {"heads_first": True, "skip_first": True, "pdl": True}}
# the stack the committed records were searched on (results/2026-12-03-h200-head-mma and results/2026-12-03-h200-peers-tuned: v_* columns and driver)
H200_STACK = {"cuda-tile": "1.7.0", "tileiras": "13.4.92", "triton": "3.6.0", "tilegym": "1.5.1", "driver": "580"}


@pytest.fixture
def on_the_h200(monkeypatch):
    """The committed records, read as on the H200 they were searched on (name, capability, stack)."""
    monkeypatch.delenv("SSD_TUNING_DIR", raising=False)
    monkeypatch.setattr(tuning, "stack_versions", lambda names: {n: H200_STACK[n] for n in names})
    with mock.patch("torch.cuda.is_available", return_value=True), \
            mock.patch("torch.cuda.get_device_name", return_value="NVIDIA H200"), \
            mock.patch("torch.cuda.get_device_capability", return_value=(9, 0)):
        yield


def _cutile_pick(name: str, variant: str, stage: str) -> tuning.Resolution:
    from impls.cutile import tune
    from impls.cutile.switches import CutileSwitches

    s = SHAPES[name]
    label = f"b{s.batch}-l{s.seqlen}-h{s.nheads}-c{s.chunk_size}" if stage == "chunk_cumsum" else s.label()
    hpg = s.nheads // s.ngroups if stage == "compute_out" else None
    return tuning.resolve(tune.tunable(stage, CutileSwitches(**CUTILE_VARIANTS[variant]), 0, label, "bfloat16",
                                       make_call=None, heads_per_group=hpg))


@pytest.mark.parametrize("point", sorted(BEFORE["cutile"]))
def test_cutile_records_resolve_as_before(point, on_the_h200):
    resolution = _cutile_pick(*point.split("/"))
    assert [resolution.config, resolution.source] == BEFORE["cutile"][point]


def _tilegym_pick(name: str, stage: str) -> tuning.Resolution:
    from impls.tilegym import tune

    s = SHAPES[name]
    shape = Shape(s.batch, s.seqlen, s.nheads, 0, 0, 0, s.chunk_size) if stage == "chunk_cumsum" else s
    variant = {"SWAP": None, "BHT": None} if stage == "fwd_pass_state" else {}
    key = tune.config_key(stage, shape, "bfloat16", variant, "bfloat16")
    own_search = mock.Mock(side_effect=AssertionError("auto never searches"))
    return tuning.resolve(tune.tunable(stage, key, "NVIDIA H200", "auto", [SimpleNamespace(fallback=True)],
                                       own_search))


@pytest.mark.parametrize("point", sorted(BEFORE["tilegym"]))
def test_tilegym_records_resolve_as_before(point, on_the_h200):
    resolution = _tilegym_pick(*point.split("/"))
    assert [resolution.config, resolution.source] == BEFORE["tilegym"][point]


@pytest.mark.parametrize("point", sorted(BEFORE["triton"]))
def test_triton_resolves_as_before(point, on_the_h200):
    """No Triton record is committed: the sm_90 fallback, clamped, as before."""
    from impls.triton import target
    from impls.triton.backend import TritonBackend

    name, stage = point.split("/")
    s = SHAPES[name]
    dims = {"nheads": s.nheads, "chunk": s.chunk_size}
    if stage != "chunk_cumsum":
        dims.update(headdim=s.headdim, dstate=s.dstate)
    with mock.patch.object(target, "arch", return_value="sm90"), \
            mock.patch.object(target, "device_name", return_value="NVIDIA H200"):
        backend = TritonBackend()
        config = backend._config(stage, s, "bfloat16", {}, dims, torch.device("cpu"), launch=None)
    # fields added since the picks were frozen must sit at their neutral value (no register cap, one head)
    added = {k: v for k, v in config.items() if k not in BEFORE["triton"][point][0]}
    assert all(NEUTRAL_TRITON_FIELDS[k] == v for k, v in added.items()), added
    before = {k: v for k, v in config.items() if k not in added}
    assert [before, backend.last_tuning[stage]["source"]] == BEFORE["triton"][point]


NEUTRAL_TRITON_FIELDS = {"occupancy": 0, "heads_per_tile": 1}


def _headline_record_keys() -> list[str]:
    labels = {s.label() for s in SHAPES.values()} | {f"b{s.batch}-l{s.seqlen}-h{s.nheads}-c{s.chunk_size}"
                                                      for s in SHAPES.values()}
    return [key for path in sorted((tuning.ROOT / "NVIDIA_H200").glob("cutile_*.json"))
            for key in json.loads(path.read_text())["entries"] if key.split("|")[0] in labels]


def test_every_headline_record_is_covered():
    """Every committed record of a headline shape is among the frozen picks (as a record or borrowed), except those
    searched under the "later" variant's switches since (the next test resolves them)."""
    picked = sum(source == "record" for _, source in BEFORE["cutile"].values())
    keys = _headline_record_keys()
    later = [key for key in keys if any(f"|{name}=" in key for name in CUTILE_VARIANTS["later"])]
    assert len(keys) - len(later) == 23 and picked >= 23  # the tma_off variant borrows: more picks than records
    assert len(later) == 12  # three stages at S1 (2026-12-05) and at S2–S4 (2026-12-06)


@pytest.mark.parametrize("shape", ["S1", "S2", "S3", "S4"])
@pytest.mark.parametrize("stage", ["chunk_cumsum", "fwd_pass_state", "compute_out"])
def test_records_searched_under_later_switches_resolve_as_their_own(stage, shape, on_the_h200):
    """Under version 13's switches each stage reads the record searched under them, not the one it borrowed."""
    resolution = _cutile_pick(shape, "later", stage)
    assert resolution.source == "record" and "borrowed" not in resolution.reason, resolution
    assert any(f"|{name}=True" in resolution.key for name in CUTILE_VARIANTS["later"]), resolution.key


def test_unverified_records_are_used_and_flagged(on_the_h200):
    """S2's compute_out record has no producing run in the results: used, and flagged in what describe() shows."""
    resolution = _cutile_pick("S2", "defaults", "compute_out")
    assert resolution.source == "record" and resolution.versions_unverified
    assert resolution.as_dict()["versions_unverified"] is True and "unverified" in resolution.as_dict()["reason"]
    assert not _cutile_pick("S1", "defaults", "compute_out").versions_unverified


@pytest.mark.parametrize("component", ["cuda-tile", "tileiras", "driver"])
def test_cutile_records_of_another_stack_fall_back_and_say_why(component, on_the_h200, monkeypatch):
    today = dict(H200_STACK, **{component: "99"})
    monkeypatch.setattr(tuning, "stack_versions", lambda names: {n: today[n] for n in names})
    resolution = _cutile_pick("S1", "defaults", "fwd_pass_state")
    assert resolution.source == "fallback"
    assert component in resolution.reason and "99" in resolution.reason
