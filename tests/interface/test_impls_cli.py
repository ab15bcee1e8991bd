"""`python -m impls backends | switches | supports`: what is there, read from the registry and conf/shape/."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from impls import cli
from impls.declaration import declarations

pytestmark = pytest.mark.quick


def test_backends_lists_every_backend_with_stages_and_versions(capsys):
    assert cli.main(["backends"]) == 0
    out = capsys.readouterr().out
    for name in ("reference", "mamba_ssm", "cutile", "triton", "tilegym", "fla", "vllm"):
        assert f"\n{name}: " in "\n" + out
    assert "reference: declared packages installed" in out
    assert "cuda-tile 1.7.0" in out and "stages: forward" in out  # cutile's pin, fla's one stage


def test_check_asks_the_backend(capsys):
    assert cli.main(["backends", "--check"]) == 0
    assert "reference: available" in capsys.readouterr().out


def test_listing_imports_no_backend():
    """`python -m impls backends` reads the declarations: no backend package, nor cuda.tile, mamba_ssm, fla."""
    code = ("import sys; from impls import cli; cli.main(['backends']); "
            "print(sorted(m for m in sys.modules if m.startswith(('cuda.tile', 'mamba_ssm', 'fla', 'tilegym')) "
            "or m.count('.') == 1 and m.split('.')[1] in cli.list_backends()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "[]"


def test_a_missing_declared_package_is_unavailable_without_importing_it(capsys, monkeypatch):
    changed = dict(declarations())
    changed["reference"] = dataclasses.replace(changed["reference"], packages={"x": ("no-such-dist-xyz", "1.0")})
    monkeypatch.setattr(cli, "declarations", lambda: changed)
    cli.main(["backends", "--check"])
    assert "reference: unavailable: no-such-dist-xyz is not installed" in capsys.readouterr().out


@pytest.mark.parametrize("found,required,ok", [
    ("2.13.0+cpu", ">=2.11", True), ("2.10.1", ">=2.11", False), ("3.6.0", "3.6.*", True),
    ("3.60.0", "3.6.*", False), ("1.7.0", "1.7.0", True), ("1.7.1", "1.7.0", False),
], ids=lambda v: str(v))
def test_version_matches(found, required, ok):
    assert cli.version_matches(found, required) is ok


def test_switches_prints_default_choices_and_both_architectures(capsys):
    assert cli.main(["switches", "cutile"]) == 0
    out = capsys.readouterr().out
    assert "tma (default True)" in out and "choices ('tf32', 'fp32')" in out
    assert "sm_90: " in out and "sm_100: " in out


RETIRED = {"cutile": ("persistent", "row_pairs", "two_warpgroups", "state_two_warpgroups", "num_ctas"),
           "triton": ("persistent", "row_pairs", "warp_specialize")}


@pytest.mark.parametrize("backend", list(RETIRED))
def test_switches_lists_none_of_the_retired_variants(backend, capsys):
    """The variants measured slower everywhere or refused on the GPU left the kernels (docs/perf-notes.md, "Retired
    variants"): neither the listing nor the Switches dataclass names them."""
    assert cli.main(["switches", backend]) == 0
    out = capsys.readouterr().out
    named = [name for name in RETIRED[backend] if name in out]
    assert not named, named
    from impls.registry import backend_class

    assert not set(RETIRED[backend]) & {f.name for f in dataclasses.fields(backend_class(backend).Switches)}


def test_supports_ok_and_the_reason(capsys):
    assert cli.main(["supports", "cutile", "--shape", "S1"]) == 0
    assert "cutile S1 bfloat16: ok" in capsys.readouterr().out
    assert cli.main(["supports", "triton", "--shape", "S1", "--dtype", "float64"]) == 1
    assert "not supported: dtype float64" in capsys.readouterr().out


@pytest.mark.parametrize("shape", [pytest.param("S9", id="unknown"), pytest.param("../config", id="path-to-config"),
                                   pytest.param("../shape/S1", id="path-to-a-shape"), pytest.param("", id="empty")])
def test_supports_an_unknown_shape_names_the_known_ones(shape):
    with pytest.raises(SystemExit, match="--shape: expected one of .*'S1'"):
        cli.main(["supports", "reference", "--shape", shape])
