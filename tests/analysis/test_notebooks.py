"""The analysis notebooks (jupytext percent scripts, notebooks/*.py) execute top to bottom (nbclient, one kernel
each) on the committed results their parameter names by default (results/index.yaml) and on the synthetic fixture
(passed through $SSD_RESULTS), from notebooks/ as their working folder (as Jupyter runs them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis import notebooks

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = notebooks.sources()
FIXTURE = ROOT / "tests" / "fixtures" / "h200_synthetic.parquet"

jupytext = pytest.importorskip("jupytext")
pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")


def test_the_four_notebooks_exist():
    names = {p.stem for p in NOTEBOOKS}
    assert {"01_reproduce_speedups", "02_ablations", "03_accuracy", "04_roofline"} <= names


@pytest.mark.parametrize("path", [pytest.param(p, id=p.stem) for p in NOTEBOOKS])
def test_notebook_is_parametrised_on_the_results_index(path):
    nb = jupytext.read(path)
    params = [c for c in nb.cells if c.cell_type == "code" and "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1 and "SSD_RESULTS" in params[0].source and '"index:' in params[0].source


def _outputs_text(nb) -> str:
    return "\n".join(o.get("text", "") + str(o.get("data", {}).get("text/markdown", ""))
                     for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))


def _execute(path):
    return _outputs_text(notebooks.execute(path, timeout=120))


@pytest.mark.parametrize("path", [pytest.param(p, id=p.stem) for p in NOTEBOOKS])
def test_notebook_executes_on_the_current_results(path, monkeypatch):
    monkeypatch.delenv("SSD_RESULTS", raising=False)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    text = _execute(path)
    assert "points from" in text and "/results/2026-" in text and "SYNTHETIC FIXTURE" not in text


@pytest.mark.parametrize("path", [pytest.param(p, id=p.stem) for p in NOTEBOOKS[:1]])
def test_notebook_executes_on_the_fixture_parameter(path, monkeypatch):
    monkeypatch.setenv("SSD_RESULTS", str(FIXTURE))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    text = _execute(path)
    assert "SYNTHETIC FIXTURE" in text and "points from" in text
