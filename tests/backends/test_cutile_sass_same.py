"""The cuTile kernels compile to the machine code recorded in tests/fixtures/cutile_sass_before.json: the SHA-256 of
the normalised sm_90 SASS of every kernel at the declared values ("defaults": a fixed set) and all-off, bf16 and
fp32, the kernels sm_90's defaults change at those (impls/cutile/defaults.py: a test here fails when they move), and
compute_out with two heads per tile (per_head, batched) and with C·Bᵀ shared (instruments/cutile/sass_hashes.py lists
them).

It guards changes meant to leave the machine code as it is (the helpers' constants grouped into
`compute_out.OutConsts` and `fwd_pass_state.StateConsts`, the stand-in arguments gone); a change meant to alter a
kernel re-records the variants it changes, as the failure says:
`python -m instruments.cutile.sass_hashes --write tests/fixtures/cutile_sass_before.json <variant id>`. Under another
toolchain than the fixture's (cuda-tile, tileiras, cuobjdump, nvdisasm) it fails too, never skips: a fixture that
is not compared guards nothing. Default set: three variants (about 10 s each on a busy 2-core machine); the rest
are slow (fused fp32 all-off alone takes over 2 minutes).
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("cuda.tile")

from instruments.cutile.sass_hashes import FIXTURE, SM90_DEFAULTS, digest, toolchain, variants  # noqa: E402
from instruments.sass import cuobjdump_path  # noqa: E402

pytestmark = pytest.mark.skipif(cuobjdump_path() is None, reason="cuobjdump not installed")

RECORD = json.loads(FIXTURE.path.read_text())
FAST = ("compute_out-bf16-defaults", "compute_out-bf16-hb2-per_head", "fused-bf16-defaults")


def _params():
    return [pytest.param(v, id=v.id, marks=[] if v.id in FAST else [pytest.mark.slow]) for v in variants()]


def test_fixture_covers_every_variant():
    assert sorted(RECORD["hashes"]) == sorted(v.id for v in variants())


def test_the_sm90_defaults_are_the_hashed_ones():
    """The fixture's "best_sm90" variants compile what cuTile runs by default on sm_90: the switches that target's
    defaults set over the declared values are SM90_DEFAULTS (else re-record them, module docstring)."""
    import dataclasses

    from impls.cutile.switches import CutileSwitches
    from impls.registry import backend_class, resolve_switches

    sm90 = dataclasses.asdict(resolve_switches(backend_class("cutile"), "sm_90").first.switches)
    declared = dataclasses.asdict(CutileSwitches())
    assert {k: v for k, v in sm90.items() if v != declared[k]} == SM90_DEFAULTS, (
        "sm_90's defaults moved: set instruments/cutile/sass_hashes.py SM90_DEFAULTS (and SM90_KERNELS) to them and "
        "re-record tests/fixtures/cutile_sass_before.json")


@pytest.mark.parametrize("variant", _params())
def test_sass_unchanged(variant):
    recorded = {"toolchain": RECORD["toolchain"],
                "hashes": {k: v for k, v in RECORD["hashes"].items() if k == variant.id}}
    got = {variant.id: digest(variant)} if toolchain() == RECORD["toolchain"] else {}
    stale = FIXTURE.stale(recorded, toolchain(), got, (variant.id,))
    if stale:
        pytest.fail(stale)
