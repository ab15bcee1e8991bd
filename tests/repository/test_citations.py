"""Project files speak of the project: no tracked file cites a path outside the repository (`../shared/...`, which
no reader of the repository has) or the vocabulary of how a GPU machine was reached; a citation names the public
source instead (an upstream repository's file, a paper) or goes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick

ROOT = Path(__file__).resolve().parents[2]
# text -> why it has no place in a tracked file
FORBIDDEN = {
    "../shared": "a path outside the repository",
    "files_at": "how files came back from a GPU machine, not the experiment",
    "a call carries": "how the tree was sent to a GPU machine, not the experiment",
    "carry `.gpu`": "how the tree was sent to a GPU machine, not the experiment",
}


@pytest.mark.parametrize("text", sorted(FORBIDDEN))
def test_no_tracked_file_cites_it(text):
    this_file = Path(__file__).resolve().relative_to(ROOT)
    found = subprocess.run(["git", "grep", "-n", "-I", "-F", "-e", text, "--", ".", f":!{this_file}"],
                           cwd=ROOT, capture_output=True, text=True)
    assert found.returncode in (0, 1), found.stderr
    assert found.stdout == "", f"{FORBIDDEN[text]}:\n{found.stdout}"
