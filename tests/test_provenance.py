"""experiments.provenance: the compiler versions each row records, where the wheel metadata is missing."""

from __future__ import annotations

import os
import stat

import pytest

from experiments import provenance


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
    answers = {"rev-parse": "f" * 40, "status": "", "ls-files": ""}
    monkeypatch.setattr(provenance, "_run", lambda args, cwd=None: answers[args[1]])
    assert provenance.git_state() == {"git_commit": "f" * 40, "git_dirty": False}
