"""The Triton kernels compile to the code recorded in tests/fixtures/triton_ptx_before.json: the SHA-256 of the
normalised sm_90 PTX of every variant `python -m impls.triton.aot` builds (defaults and all-off, the tensor-descriptor
builds, compute_out at dstate 256 and with two heads per program), bf16 and fp32, tile sizes from the sm_90 fallbacks
(impls/triton/ptx_hashes.py).

It guards changes meant to leave the generated code as it is (the backend's configuration split into one module per
concern); a change meant to alter a kernel or a fallback re-records the fixture:
`python -m impls.triton.ptx_hashes --write tests/fixtures/triton_ptx_before.json`. Compared only under the Triton the
fixture was recorded with. bf16 shares its compiles with test_triton_interp's test_kernels_compile_for_sm90 (Triton's
cache: seconds after it, about two minutes cold); fp32 (about four minutes cold on a busy 2-core machine) is slow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parent.parent
RECORD = json.loads((ROOT / "tests" / "fixtures" / "triton_ptx_before.json").read_text())


def _record(dtype: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compiled, not interpreted
    result = subprocess.run([sys.executable, "-m", "impls.triton.ptx_hashes", "--dtype", dtype], capture_output=True,
                            text=True, env=env, cwd=ROOT, timeout=1200)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("dtype", ["bf16", pytest.param("fp32", marks=pytest.mark.slow)])
def test_ptx_unchanged(dtype):
    record = _record(dtype)
    if record["toolchain"] != RECORD["toolchain"]:
        pytest.skip(f"toolchain {record['toolchain']} is not the fixture's {RECORD['toolchain']}")
    expected = {k: v for k, v in RECORD["hashes"].items() if k.split("-")[1] == dtype}
    assert sorted(record["hashes"]) == sorted(expected), "the variants differ from the recorded ones"
    changed = sorted(k for k, v in record["hashes"].items() if v != expected[k])
    assert not changed, (f"the normalised PTX differs from the recorded one for {changed} "
                         "(`python -m impls.triton.aot` shows the variants' facts)")
