"""Test-suite set-up. The CPU suite runs Triton kernels under the interpreter; tests/gpu runs them compiled.

TRITON_INTERPRET is read when a kernel is decorated, so one process is either interpreted or compiled: a run whose
arguments name only tests/gpu leaves it unset; any other run sets it (and tests/gpu then skip, saying why).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

GPU_DIR = Path(__file__).parent / "gpu"


def _targets_gpu_only(args) -> bool:
    paths = [Path(a.split("::")[0]).resolve() for a in args if not a.startswith("-")]
    return bool(paths) and all(p == GPU_DIR or GPU_DIR in p.parents for p in paths)


def pytest_configure(config):
    if not _targets_gpu_only(config.args):
        os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _fresh_backends():
    """Each test builds its own backends: an instance's cached tuning or an availability answer from another
    test (another SSD_TUNING_DIR, another environment) would leak into it."""
    from impls.registry import clear_cache

    clear_cache()
    yield
    clear_cache()
