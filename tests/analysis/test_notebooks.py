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


def test_the_notebooks_exist():
    names = {p.stem for p in NOTEBOOKS}
    assert {"01_reproduce_speedups", "02_ablations", "03_accuracy", "04_roofline", "05_end_to_end"} <= names


def _default_entries(path) -> list[str]:
    """The results/index.yaml entries a notebook's parameter cell reads by default."""
    import re

    nb = jupytext.read(path)
    (params,) = [c for c in nb.cells if c.cell_type == "code" and "parameters" in c.metadata.get("tags", [])]
    (names,) = re.findall(r'SSD_RESULTS", "index:([^"]+)"', params.source)
    return [n.strip() for n in names.split(",")]


def _not_yet_indexed(path) -> list[str]:
    from analysis.load import results_index

    return [name for name in _default_entries(path) if name not in results_index()]


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
    missing = _not_yet_indexed(path)
    if missing:  # a notebook written before its GPU rows: runs on its CPU fixture below until they are committed
        pytest.skip(f"results/index.yaml names no current {', '.join(missing)} yet (docs/gpu-runbook.md)")
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


END_TO_END_CPU = ROOT / "tests" / "fixtures" / "end_to_end_cpu"


def test_the_end_to_end_notebook_executes_on_its_cpu_rows(monkeypatch):
    """notebooks/05_end_to_end.py on rows the project's own commands wrote on the CPU (tests/fixtures/end_to_end_cpu
    /README.md: the language model and the layer at shape tiny, reference and mamba_ssm under the interpreter, their
    step profile, the reference's loss curves over three seeds): every section fills its table or figure."""
    monkeypatch.setenv("SSD_RESULTS", str(END_TO_END_CPU / "end_to_end.parquet"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    text = _execute(NOTEBOOKS[[p.stem for p in NOTEBOOKS].index("05_end_to_end")])
    assert "points from" in text and "end_to_end_cpu" in text
    for column in ("tokens_per_s", "speedup_vs_mamba_ssm", "non_ssd", "share_of_layer", "share_base", "gain_ratio"):
        assert column in text, column
    assert "reference seeds [0, 1, 2]: inside" in text
