"""harness.provenance: the compiler versions each row records, where the wheel metadata is missing."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from harness import provenance


@pytest.fixture
def no_tileiras_wheel(monkeypatch):
    real = provenance._version
    monkeypatch.setattr(provenance, "_version",
                        lambda dist: "absent" if dist == "nvidia-cuda-tileiras" else real(dist))
    provenance.tileiras_version.cache_clear()
    yield
    provenance.tileiras_version.cache_clear()


def _fake_tool(tmp_path, monkeypatch, output: str):
    tool = tmp_path / "tileiras"
    tool.write_text(f"#!/bin/sh\ncat <<'END'\n{output}\nEND\n")
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.parametrize("output, expect", [
    pytest.param("tileiras: NVIDIA (R) Cuda Tile IR optimizing assembler\nCuda compilation tools, release 13.4, "
                 "V13.4.92", "13.4.92", id="bundle-binary"),
    pytest.param("something else entirely", "absent", id="unparsable"),
])
def test_tileiras_binary_on_path(tmp_path, monkeypatch, no_tileiras_wheel, output, expect):
    """The GPU bundle installs tileiras without its wheel: the version comes from the binary on PATH."""
    _fake_tool(tmp_path, monkeypatch, output)
    assert provenance.tileiras_version() == expect


def test_no_tileiras_at_all(monkeypatch, no_tileiras_wheel):
    monkeypatch.setattr(provenance.shutil, "which", lambda name: None)
    assert provenance.tileiras_version() == "absent"


def test_collect_records_it(tmp_path, monkeypatch, no_tileiras_wheel):
    import torch

    _fake_tool(tmp_path, monkeypatch, "Cuda compilation tools, release 13.3, V13.3.1")
    assert provenance.collect(torch.device("cpu"))["v_tileiras"] == "13.3.1"


@pytest.fixture
def fresh_git_state():
    provenance.git_state.cache_clear()
    yield
    provenance.git_state.cache_clear()


@pytest.mark.parametrize("dirty, expect_dirty", [("0", False), ("1", True), (None, None)])
def test_sent_commit_wins_over_the_checkouts_own(monkeypatch, fresh_git_state, dirty, expect_dirty):
    """The GPU machine's copy may hold a stale .git: the commit the sender names is the one recorded."""
    monkeypatch.setenv("SSD_GIT_COMMIT", "0123abc")
    if dirty is None:
        monkeypatch.delenv("SSD_GIT_DIRTY", raising=False)
    else:
        monkeypatch.setenv("SSD_GIT_DIRTY", dirty)
    assert provenance.git_state() == {"git_commit": "0123abc", "git_dirty": expect_dirty}


def test_without_a_sent_commit_the_checkout_answers(monkeypatch, fresh_git_state):
    monkeypatch.delenv("SSD_GIT_COMMIT", raising=False)
    answers = {"--show-toplevel": str(provenance.REPO), "HEAD": "f" * 40, "status": "", "ls-files": ""}
    monkeypatch.setattr(provenance, "_run",
                        lambda args, cwd=None: answers[args[2] if args[1] == "rev-parse" else args[1]])
    assert provenance.git_state() == {"git_commit": "f" * 40, "git_dirty": False}


# --- code_key: the content that ran, not git, not paths ------------------------------------------------------
@pytest.fixture
def fresh_caches():
    """Provenance reads the tree once per process: each case starts without what another read."""
    cached = [f for f in vars(provenance).values() if hasattr(f, "cache_clear")]
    for f in cached:
        f.cache_clear()
    yield lambda: [f.cache_clear() for f in cached]
    for f in cached:
        f.cache_clear()


def _tree(root: Path, files: dict[str, str] | None = None) -> Path:
    """A source tree: impls/a.py and conf/c.yaml, plus docs/, tests/, analysis/, notebooks/ files; then `files`
    (path -> text) written over them."""
    base = {"impls/a.py": "x = 1\n", "conf/c.yaml": "k: 1\n", "docs/d.md": "d\n", "tests/test_t.py": "t = 1\n",
            "analysis/y.py": "y = 1\n", "notebooks/n.py": "n = 1\n"}
    for name, text in (files or base).items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root, check=True,
                   capture_output=True)


def _commit_all(root: Path) -> None:
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "commit", "-qm", "tree")


def _key(monkeypatch, root: Path, clear, **row) -> str:
    """code_key of a point measured from the tree at root (its git labels as git_state reads them there)."""
    monkeypatch.setattr(provenance, "REPO", root)
    clear()
    return provenance.code_key({**provenance.git_state(), "v_torch": "2.11", **row}, "reference", "cpu")


def test_an_edited_tree_sent_as_a_clean_commit_is_measured_again(tmp_path, monkeypatch, fresh_caches):
    """SSD_GIT_COMMIT=<head> SSD_GIT_DIRTY=0 with an uncommitted edit: the stored point is not taken for this one."""
    from harness import store

    tree = _tree(tmp_path / "tree")
    monkeypatch.setenv("SSD_GIT_COMMIT", "0123abc")
    monkeypatch.setenv("SSD_GIT_DIRTY", "0")
    before = _key(monkeypatch, tree, fresh_caches)
    store.write_rows([{"run_id": "r", "config_hash": "h", "code_key": before, "status": "ok"}], tmp_path / "res", "r")
    (tree / "impls" / "a.py").write_text("x = 2\n")
    after = _key(monkeypatch, tree, fresh_caches)
    assert after != before
    assert store.measured_file(tmp_path / "res", "h", after) is None
    assert store.measured_file(tmp_path / "res", "h", before) is not None


def test_the_same_content_in_two_places_has_one_key(tmp_path, monkeypatch, fresh_caches):
    """A copy of the tree elsewhere, or inside another git repository, is the same code; the outer repository's
    commit is not recorded as the copy's."""
    for name in ("SSD_GIT_COMMIT", "SSD_GIT_DIRTY"):
        monkeypatch.delenv(name, raising=False)
    alone = _tree(tmp_path / "alone")
    outer = tmp_path / "outer"
    (outer / "other.txt").parent.mkdir()
    (outer / "other.txt").write_text("another project\n")
    _commit_all(outer)
    inside = _tree(outer / "copy")
    assert _key(monkeypatch, alone, fresh_caches) == _key(monkeypatch, inside, fresh_caches)
    assert provenance.git_state()["git_commit"] is None


def test_docs_tests_analysis_and_notebooks_stay_out_of_the_key(tmp_path, monkeypatch, fresh_caches):
    for name in ("SSD_GIT_COMMIT", "SSD_GIT_DIRTY"):
        monkeypatch.delenv(name, raising=False)
    tree = _tree(tmp_path / "tree")
    _commit_all(tree)
    before = _key(monkeypatch, tree, fresh_caches)
    _tree(tree, {"docs/d.md": "edited\n", "tests/test_t.py": "t = 2\n", "analysis/y.py": "y = 2\n",
                 "notebooks/n.py": "n = 2\n"})
    assert _key(monkeypatch, tree, fresh_caches) == before
    assert provenance.git_state()["git_dirty"] is True  # a label: the tree differs from its commit
    (tree / "conf" / "c.yaml").write_text("k: 2\n")
    assert _key(monkeypatch, tree, fresh_caches) != before


def test_the_driver_major_enters_the_key(tmp_path, monkeypatch, fresh_caches):
    tree = _tree(tmp_path / "tree")
    key = {d: _key(monkeypatch, tree, fresh_caches, driver=d) for d in ("550.54.15", "550.90.07", "560.35.03")}
    assert key["550.54.15"] == key["550.90.07"] != key["560.35.03"]


def _vllm_files(root: Path, bmm: str = "x = 1\n") -> Path:
    from impls.vllm import loader

    for name in loader.SSD_FILES:
        (root / loader.OPS).mkdir(parents=True, exist_ok=True)
        (root / loader.OPS / f"{name}.py").write_text(bmm if name == "ssd_bmm" else f"# {name}\n")
    (root / "vllm-0.33.0.dist-info").mkdir(exist_ok=True)
    (root / "vllm-0.33.0.dist-info" / "METADATA").write_text("Name: vllm\nVersion: 0.33.0\n")
    return root


def test_an_edited_peer_file_changes_the_backends_key(tmp_path, monkeypatch, fresh_caches):
    """vLLM's kernel files, where its loader finds them (Backend.peer_files): an edit re-measures its points, the
    same files in another folder do not."""
    from harness import plan
    from impls.problem import Problem, Shape

    problem = Problem(Shape(1, 32, 2, 8, 1, 8, 16), "float32")

    def key(folder: Path) -> str:
        monkeypatch.setenv("SSD_VLLM_DIR", str(folder))
        return plan.point("vllm", problem, device="cpu").identity.code_key

    before = key(_vllm_files(tmp_path / "one"))
    assert key(_vllm_files(tmp_path / "two")) == before
    assert key(_vllm_files(tmp_path / "two", bmm="x = 2\n")) != before
