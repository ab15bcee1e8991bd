"""CPU tests of stage 3's C·Bᵀ kernel switches (cb_occupancy, cb_lower_triangle): the kernel compiled ahead of time
for sm_90 and sm_100, the kernel and the whole stage run under the emulator against float64 in poisoned
allocations (the pairs above the diagonal left unwritten and never read), the refusals and the record key."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("cuda.tile")

from impls.cutile import compute_out  # noqa: E402
from impls.cutile.switches import CutileSwitches  # noqa: E402
from impls.reference.compute_out import compute_out as reference_compute_out  # noqa: E402
from impls.tolerance import poisoned_allocations, rel_err  # noqa: E402
from instruments.cutile.aot import build_call, export  # noqa: E402
from instruments.cutile.emulate import emulated_launches  # noqa: E402
from instruments.sass import cubin_facts, cuobjdump_path, facts  # noqa: E402

DEFAULTS = CutileSwitches()
SHARED = {"cb_mode": "shared"}
# S1's sizes as the kernel sees them (64-row blocks of a 256 chunk: 4 x 4 pairs, 10 on or below the diagonal)
S1_DIMS = dict(batch=8, seqlen=4096, nheads=80, headdim=64, ngroups=1, dstate=128, chunk=256)
S1_CONFIG = {"block_rows": 64, "block_headdim": 64, "shared_cb": True}
needs_cuobjdump = pytest.mark.skipif(cuobjdump_path() is None, reason="cuobjdump not installed")


def _cb_build(arch: str, **switches):
    call = build_call("compute_out_cb", torch.bfloat16, dataclasses.replace(DEFAULTS, **switches), dims=S1_DIMS,
                      config=S1_CONFIG, optional=False)
    return call, cubin_facts(export(call, arch))


# --- ahead-of-time compiles -------------------------------------------------------------------------------------------
@needs_cuobjdump
@pytest.mark.parametrize("arch, occupancy, registers", [
    pytest.param("sm_90", 0, 255, id="sm_90-no-hint"),
    pytest.param("sm_90", 4, 64, id="sm_90-occupancy4"),
    pytest.param("sm_90", 2, 128, id="sm_90-occupancy2", marks=pytest.mark.slow),
    pytest.param("sm_100", 0, 255, id="sm_100-no-hint", marks=pytest.mark.slow),
    pytest.param("sm_100", 4, 64, id="sm_100-occupancy4"),
])
def test_cb_occupancy_caps_the_cb_kernels_registers_without_spills(arch, occupancy, registers):
    """Without a hint the C·Bᵀ kernel takes 255 registers (one CTA per SM); the hint caps them for that many CTAs,
    warp-specialised, nothing spilled."""
    _, f = _cb_build(arch, cb_occupancy=occupancy)
    assert (f.registers, f.ldl, f.stl, f.stack_bytes, f.warp_specialized) == (registers, 0, 0, 0, True)


@needs_cuobjdump
@pytest.mark.parametrize("arch", ["sm_90", pytest.param("sm_100", marks=pytest.mark.slow)])
def test_cb_lower_triangle_launches_the_lower_pairs_with_the_same_tile_code(arch):
    """10 of the 16 pairs per (batch, chunk) at S1; each program's loads, MMAs and store are the full grid's, with a
    few integer instructions more for the pair's indices."""
    full_call, full = _cb_build(arch)
    lower_call, lower = _cb_build(arch, cb_lower_triangle=True)
    assert full_call.grid == (8 * 16 * 16, 1) and lower_call.grid == (8 * 16 * 10, 1)
    f, g = facts(full.sass), facts(lower.sass)
    assert {k: g[k] for k in ("UTMALDG", "UTMASTG", "HGMMA", "UTCMMA")} == \
        {k: f[k] for k in ("UTMALDG", "UTMASTG", "HGMMA", "UTCMMA")}
    assert 0 < g["instructions"] - f["instructions"] <= 48, (f, g)
    assert (lower.registers, lower.ldl, lower.stl) == (full.registers, 0, 0)


# --- under the emulator, poisoned ------------------------------------------------------------------------------------
def _small_inputs(seed: int = 0, seqlen: int = 256, nheads: int = 4, ngroups: int = 2, chunk: int = 128):
    """(C, B, x, dt, dA_cumsum, states) of a small problem, fp32 on the CPU."""
    g = torch.Generator().manual_seed(seed)
    batch, headdim, dstate, nchunks = 1, 32, 32, seqlen // chunk
    C, B = (torch.randn(batch, seqlen, ngroups, dstate, generator=g) for _ in range(2))
    x = torch.randn(batch, seqlen, nheads, headdim, generator=g)
    dt = torch.rand(batch, nheads, nchunks, chunk, generator=g) * 0.1
    dA = torch.cumsum(-torch.rand(batch, nheads, nchunks, chunk, generator=g) * 0.1, dim=-1)
    states = torch.randn(batch, nchunks, nheads, headdim, dstate, generator=g)
    return C, B, x, dt, dA, states


@pytest.mark.parametrize("lower", [False, True], ids=["full", "lower"])
def test_cb_matrix_writes_the_pairs_it_launches(lower):
    """32-row blocks of a 128 chunk (4 x 4 pairs): with cb_lower_triangle the pairs j <= i equal C_i·B_jᵀ and the
    pairs above the diagonal keep the poison; without it every pair is written."""
    C, B = _small_inputs()[:2]
    sw = dataclasses.replace(DEFAULTS, **SHARED, cb_precision="fp32", cb_lower_triangle=lower)
    with emulated_launches(), poisoned_allocations():
        cb = compute_out.cb_matrix(C, B, 128, False, sw, {"block_rows": 32})
    chunks = C.double().reshape(1, 2, 128, 2, 32).transpose(2, 3)  # (b, c, g, position, dstate)
    want = chunks @ B.double().reshape(1, 2, 128, 2, 32).transpose(2, 3).transpose(-1, -2)
    for i in range(4):
        for j in range(4):
            block = (..., slice(32 * i, 32 * (i + 1)), slice(32 * j, 32 * (j + 1)))
            if lower and j > i:
                assert torch.isnan(cb[block]).all(), (i, j)
            else:
                torch.testing.assert_close(cb[block].double(), want[block], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("switches, config", [
    pytest.param({}, {}, id="defaults"),
    pytest.param({"cb_occupancy": 4}, {}, id="occupancy4"),
    pytest.param({"decay_factor": True}, {}, id="decay_factor"),
    pytest.param({"operand_swap": True, "head_mma": "batched"}, {}, id="swap"),
    pytest.param({"head_mma": "per_head"}, {"heads_per_tile": 2}, id="heads2-per_head"),
    pytest.param({"head_loop": 2}, {}, id="head_loop2"),
])
def test_compute_out_with_the_lower_triangle_matches_float64_in_poisoned_memory(switches, config):
    """compute_out's main kernels (and the head loop's) read only the pairs j <= i of the shared C·Bᵀ: with the
    pairs above the diagonal left NaN, the stage still matches the float64 reference (a read of one would be NaN)."""
    C, B, x, dt, dA, states = _small_inputs()
    sw = dataclasses.replace(DEFAULTS, **SHARED, cb_precision="fp32", cb_lower_triangle=True, **switches)
    want = reference_compute_out(*(t.double() for t in (C, B, x, dt, dA, states)))
    with emulated_launches(), poisoned_allocations():
        y = compute_out.run(C, B, x, dt, dA, states, None, None, None, sw, {"block_rows": 32, **config})
    assert not torch.isnan(y).any()
    assert rel_err(y, want) < 1e-5


# --- refusals and the record key -------------------------------------------------------------------------------------
@pytest.mark.parametrize("switches, match", [
    pytest.param({"cb_mode": "inline", "cb_occupancy": 4}, "cb_mode='inline'", id="inline-occupancy"),
    pytest.param({"cb_mode": "inline", "cb_lower_triangle": True}, "cb_mode='inline'", id="inline-lower"),
    pytest.param({"fuse_state_out": True, "cb_lower_triangle": True}, "fuse_state_out", id="fused-lower"),
])
def test_the_cb_kernel_switches_are_refused_where_that_kernel_never_runs(switches, match):
    with pytest.raises(ValueError, match=match):
        CutileSwitches(**switches)


def test_the_cb_kernel_switches_key_compute_out_and_borrow_the_tiles_without_them():
    from impls.cutile import tune

    sw = dataclasses.replace(DEFAULTS, cb_occupancy=4, cb_lower_triangle=True)
    key = tune.record_key("compute_out", sw, "S", "bfloat16")
    assert "cb_occupancy=4" in key and "cb_lower_triangle=True" in key
    assert tune.record_key("compute_out", sw, "S", "bfloat16", code_tricks=False) == \
        tune.record_key("compute_out", DEFAULTS, "S", "bfloat16", code_tricks=False)
    for stage in ("chunk_cumsum", "fwd_pass_state"):
        assert tune.record_key(stage, sw, "S", "bfloat16") == tune.record_key(stage, DEFAULTS, "S", "bfloat16")


# --- what the tile search times --------------------------------------------------------------------------------------
@pytest.mark.parametrize("shared", [False, True], ids=["inline", "shared"])
def test_the_search_times_the_cb_kernel_with_shared_cb(shared):
    """The search's calls for one config: the C·Bᵀ kernel (on its own output) before the main kernel where the
    config shares C·Bᵀ, the main kernel alone where it does not."""
    C, B, x, dt, dA, states = _small_inputs()
    sw = dataclasses.replace(DEFAULTS, cb_lower_triangle=True)
    config = {"block_rows": 32, "shared_cb": shared}
    with emulated_launches():
        calls = compute_out.search_calls(C, B, x, dt, dA, states, None, None, None, torch.empty_like(x), sw, config)
    names = [call.kernel._pyfunc.__name__ for call in calls]
    assert names == (["cb_kernel", "compute_out_kernel"] if shared else ["compute_out_kernel"])
    if shared:
        assert calls[0].grid == (2 * 10, 2)  # 2 chunks x 10 lower pairs, 2 groups
        assert calls[0].args[2] is not calls[1].args[9]  # its own output, not the one the main kernel reads
