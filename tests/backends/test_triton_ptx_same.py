"""The Triton kernels compile to the code recorded in tests/fixtures/triton_ptx_before.json: the SHA-256 of the
normalised sm_90 PTX of every variant `python -m instruments.triton.aot` builds (the declared code switches,
"defaults": a fixed set, and all-off; the tensor-descriptor builds, stage 2's serial kernel's among them, which sm_90's
defaults run: a test here fails when those move; compute_out at dstate 256 and with two heads per program), bf16 and
fp32, tile sizes from the sm_90 fallbacks (instruments/triton/ptx_hashes.py).

It guards changes meant to leave the generated code as it is (the backend's configuration split into one module per
concern); a change meant to alter a kernel or a fallback re-records the dtype it changes, as the failure says:
`python -m instruments.triton.ptx_hashes --write tests/fixtures/triton_ptx_before.json --dtype <bf16|fp32>`. Under
another Triton than the fixture's it fails too, never skips: a fixture that is not compared guards nothing. bf16 shares
its compiles with test_triton_interp's test_kernels_compile_for_sm90 (Triton's cache: seconds after it, about two
minutes cold); fp32 (about four minutes cold on a busy 2-core machine) is slow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

from instruments.triton.ptx_hashes import FIXTURE, variant_dtype  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RECORD = json.loads(FIXTURE.path.read_text())


def _record(dtype: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compiled, not interpreted
    result = subprocess.run([sys.executable, "-m", "instruments.triton.ptx_hashes", "--dtype", dtype],
                            capture_output=True, text=True, env=env, cwd=ROOT, timeout=1200)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("dtype", ["bf16", pytest.param("fp32", marks=pytest.mark.slow)])
def test_ptx_unchanged(dtype):
    record = _record(dtype)
    recorded = {"toolchain": RECORD["toolchain"],
                "hashes": {k: v for k, v in RECORD["hashes"].items() if variant_dtype(k) == dtype}}
    stale = FIXTURE.stale(recorded, record["toolchain"], record["hashes"], ("--dtype", dtype))
    if stale:
        pytest.fail(stale)


def test_the_sm90_defaults_kernels_are_hashed():
    """sm_90's defaults (impls/triton/defaults.py) run the declared code switches with descriptors made as the
    fixture's "-tma-host" builds of compute_out and stage 2 (the serial kernel with state_pass='serial')."""
    from impls.registry import backend_class, resolve_switches

    cls = backend_class("triton")
    sm90 = resolve_switches(cls, "sm_90").first.switches
    code = ("transposed_layout", "operand_swap", "exp2", "cb_mode", "decay_factor", "fuse_state_out")
    assert all(getattr(sm90, k) == getattr(cls.Switches(), k) for k in code), "sm_90's code switches moved"
    suffix = "-defaults" + ("-tma" if sm90.tma else "") + ("-host" if sm90.tma_descriptors == "host" else "")
    stage2 = "serial_state" if sm90.state_pass == "serial" else "chunk_state"
    missing = [f"{kernel}-{dtype}{suffix}" for kernel in ("compute_out", stage2) for dtype in ("bf16", "fp32")
               if f"{kernel}-{dtype}{suffix}" not in RECORD["hashes"]]
    assert not missing, f"{missing}: add the variants to instruments/triton/aot.py variants and re-record (docstring)"
