"""CPU tests of the cuTile fused forward (switch fuse_state_out, impls/cutile/fused.py): its kernel compiles ahead
of time for sm_90 to warpgroup MMAs without register spills at the fallback tiles, and the backend refuses what the
fused kernel cannot do (packed sequences) with the reason, before anything runs."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

pytest.importorskip("cuda.tile")

from impls.cutile.aot import build_call, cuobjdump_path, export, facts, sass  # noqa: E402
from impls.cutile.switches import CutileSwitches  # noqa: E402
from impls.problem import Problem, Shape  # noqa: E402

FUSED = CutileSwitches(fuse_state_out=True)
BASE = Shape(2, 512, 8, 64, 2, 128, 128)


@pytest.mark.skipif(cuobjdump_path() is None, reason="cuobjdump not installed")
def test_fused_kernel_compiles_to_warpgroup_mma_without_spills():
    from impls.cutile import tune

    text = sass(export(build_call("fused", torch.bfloat16, FUSED, config=tune.FALLBACK[9]["fused"]), "sm_90"))
    f = facts(text)
    assert f["HGMMA"] > 0 and "HMMA" not in text, f
    assert f["UTMALDG"] > 0 and f["MUFU.EX2"] > 0, f  # TMA loads; the decays
    spills = re.findall(r"\b(?:LDL|STL)\b", text)
    assert not spills, f"{len(spills)} local-memory loads/stores at the fallback tiles"


def test_fused_refuses_packed_sequences_with_the_reason():
    from impls.cutile import CutileBackend

    ok, reason = CutileBackend(fuse_state_out=True).supports(Problem(BASE, nseqs=3))
    assert not ok and "fuse_state_out" in reason and "seq_idx" in reason
    assert CutileBackend(fuse_state_out=True).supports(Problem(BASE, has_z=True, has_initial_states=True))[0]
    assert CutileBackend().supports(Problem(BASE, nseqs=3))[0]  # the three stages take them


def test_fused_forward_raises_before_running_on_seq_idx():
    """Called directly (past supports()), the forward raises naming the argument; no kernel is launched."""
    from impls.cutile import CutileBackend

    be = CutileBackend(fuse_state_out=True)
    x = torch.zeros(1, 128, 2, 32)
    with pytest.raises(ValueError, match="seq_idx"):
        be.ssd_forward(x, None, None, None, None, 64, None, None, None, None, torch.zeros(1, 128, dtype=torch.int32),
                       None, True, (0.0, float("inf")), None)


def test_fused_tiles_come_from_their_own_tuning_stage():
    from impls import tuning
    from impls.cutile import fused, tune

    sw = dataclasses.replace(FUSED, tuning="fallback", block_headdim=64)
    config = tuning.resolve(tune.tunable("fused", sw, "cpu", "S", "bfloat16", make_call=None)).config
    assert config["block_headdim"] == 64 and config["occupancy"] == tune.FALLBACK[9]["fused"]["occupancy"]
    assert fused.blocks(256, 64, 128, config) == (64, 64, 128)
    assert fused.blocks(64, 80, 48, {}) == (64, 64, 64)  # rows capped by the chunk; dstate whole (next pow2)


@pytest.mark.parametrize("name, value", [
    pytest.param("transposed_layout", False, id="transposed_layout"),
    pytest.param("operand_swap", True, id="operand_swap"),
    pytest.param("decay_factor", True, id="decay_factor"),
    pytest.param("cb_mode", "inline", id="cb_mode"),
    pytest.param("head_mma", "batched", id="head_mma"),
    pytest.param("block_dstate", 64, id="block_dstate"),
    pytest.param("heads_per_tile", 2, id="heads_per_tile"),
    pytest.param("heads_first", True, id="heads_first"),
    pytest.param("skip_first", True, id="skip_first"),
    pytest.param("two_warpgroups", True, id="two_warpgroups"),
    pytest.param("state_two_warpgroups", True, id="state_two_warpgroups"),
    pytest.param("head_loop", 8, id="head_loop"),
    pytest.param("num_ctas", 2, id="num_ctas"),
])
def test_fused_refuses_a_switch_it_does_not_read(name, value):
    from impls.cutile import CutileBackend

    with pytest.raises(ValueError, match=rf"{name}.*fuse_state_out"):
        CutileBackend(fuse_state_out=True, **{name: value})
    CutileBackend(**{name: value})  # the three stages read it


def test_fused_describe_marks_unread_switches_na():
    from impls.cutile import CutileBackend
    from impls.cutile.switches import FUSED_READS, NOT_READ_BY_FUSED

    described = CutileBackend(fuse_state_out=True, exp2=False, block_rows=32).describe()["switches"]
    assert {described[n] for n in NOT_READ_BY_FUSED} == {"n/a"}
    assert described["exp2"] is False and described["block_rows"] == 32 and set(FUSED_READS) <= set(described)
