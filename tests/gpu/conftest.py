"""GPU tests: skipped at set-up time (never at import or collection) when there is no CUDA device or when the
process runs Triton under the interpreter (the CPU suite's mode: run `pytest tests/gpu` on its own)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _needs_cuda():
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        pytest.skip("TRITON_INTERPRET is set (CPU suite); run `python -m pytest tests/gpu` alone on a GPU machine")
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
