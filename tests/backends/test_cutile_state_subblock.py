"""CPU tests of switch state_subblock (cuTile stage 2's local state as a main loop over sub-blocks of the chunk's
positions): the kernels emulated on CPU against the float64 reference, compiled for sm_90 and sm_100, and refused
where they cannot run."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("cuda.tile")

from impls.cutile.switches import CutileSwitches  # noqa: E402
from impls.problem import Problem, Shape  # noqa: E402
from impls.reference import chunk_cumsum as ref_chunk_cumsum  # noqa: E402
from impls.reference import fwd_pass_state as ref_fwd_pass_state  # noqa: E402
from instruments.cutile.emulate import emulated_launches  # noqa: E402
from instruments.sass import cuobjdump_path  # noqa: E402

# fp32 inputs and full-fp32 MMAs (cb_precision fp32): the emulator's MMA is fp32, so what is left is summation order
FP32 = dict(cb_precision="fp32")


def _inputs(seqlen: int, chunk: int, seq_idx: bool, init: bool):
    """(B, x, dt, dA_cumsum, initial_states, seq_idx) in float64: batch 2, 2 heads of one group, headdim 32, dstate 32
    (one state tile per program)."""
    g = torch.Generator().manual_seed(seqlen + chunk)
    batch, nheads, headdim, dstate = 2, 2, 32, 32
    x = torch.randn(batch, seqlen, nheads, headdim, generator=g, dtype=torch.float64)
    B = torch.randn(batch, seqlen, 1, dstate, generator=g, dtype=torch.float64)
    dt = torch.rand(batch, seqlen, nheads, generator=g, dtype=torch.float64) * 0.2
    A = -torch.rand(nheads, generator=g, dtype=torch.float64)
    dt, dA = ref_chunk_cumsum(dt, A, chunk)
    states = torch.randn(batch, nheads, headdim, dstate, generator=g, dtype=torch.float64) if init else None
    seq = None
    if seq_idx:  # three sequences per row, one boundary inside a chunk, one on a chunk edge
        seq = torch.zeros(batch, seqlen, dtype=torch.int32)
        seq[:, seqlen // 3:] = 1
        seq[:, chunk:] += 1
    return B, x, dt, dA, states, seq


def _emulated(sw: CutileSwitches, B, x, dt, dA, init, seq):
    from impls.cutile import fwd_pass_state

    f32 = [t.float() if t is not None else None for t in (B, x, dt, dA, init)]
    with emulated_launches():
        return fwd_pass_state.run(*f32[:4], f32[4], seq, torch.float32, sw, {})


@pytest.mark.parametrize("seqlen,chunk,sub,switches,seq_idx,init", [
    pytest.param(300, 128, 64, {}, False, False, id="l300-c128-sub64"),
    pytest.param(300, 256, 64, {}, False, False, id="l300-c256-sub64"),
    pytest.param(600, 256, 128, {}, False, True, id="l600-c256-sub128-init"),
    pytest.param(256, 128, 128, {}, False, False, id="l256-c128-sub128-one-step"),
    pytest.param(300, 128, 64, {"state_pass": "chunk_parallel"}, True, True, id="l300-c128-sub64-parallel-seq-init"),
    pytest.param(300, 256, 64, {"operand_swap": True, "transposed_layout": False}, True, False,
                 id="l300-c256-sub64-swap-rowmajor-seq"),
    pytest.param(300, 128, 64, {"exp2": False}, False, False, id="l300-c128-sub64-exp"),
])
def test_subblocks_match_the_float64_reference_under_emulation(seqlen, chunk, sub, switches, seq_idx, init):
    """Every entering state and the final state, seqlen not a multiple of the chunk (a padded last chunk, whose last
    sub-block lies wholly past the end for seqlen 300 at chunk 256)."""
    B, x, dt, dA, states, seq = _inputs(seqlen, chunk, seq_idx, init)
    want, want_final = ref_fwd_pass_state(B, x, dt, dA, states, seq)
    got, got_final = _emulated(CutileSwitches(**FP32, **switches, state_subblock=sub), B, x, dt, dA, states, seq)
    scale = want.abs().max().item()
    assert (got.double() - want).abs().max().item() < 1e-5 * scale
    assert (got_final.double() - want_final).abs().max().item() < 1e-5 * want_final.abs().max().item()


def test_subblocks_add_the_same_terms_as_the_whole_chunk_in_bf16():
    """bf16 operands rounded as the whole-chunk kernel rounds them (w·x per element, then the MMA): the two walks
    differ only in the order of their fp32 sums."""
    B, x, dt, dA, _, _ = _inputs(300, 256, False, False)
    B, x = B.bfloat16(), x.bfloat16()
    whole, whole_final = _emulated(CutileSwitches(), B, x, dt, dA, None, None)
    sub, sub_final = _emulated(CutileSwitches(state_subblock=64), B, x, dt, dA, None, None)
    assert (sub - whole).abs().max().item() < 1e-5 * whole.abs().max().item()
    assert (sub_final - whole_final).abs().max().item() < 1e-5 * whole_final.abs().max().item()


# --- compiled for sm_90 and sm_100 -----------------------------------------------------------------------------------
S1 = dict(batch=8, seqlen=4096, nheads=80, headdim=64, ngroups=1, dstate=128, chunk=256)
S1_RECORD = {"block_headdim": 64, "block_dstate": 128, "occupancy": 4}  # the H100 record under the sm_90 defaults
SM90 = dict(heads_first=True, skip_first=True, pdl=True)  # impls/cutile/defaults.py, best_sm90


def _cubin_facts(kernel: str, sw: CutileSwitches, arch: str, dims: dict | None = None, config: dict | None = None):
    from instruments.cutile.aot import build_call, export
    from instruments.sass import cubin_facts, facts, resource_usage

    cubin = export(build_call(kernel, torch.bfloat16, sw, dims=dims, config=config, optional=dims is None), arch)
    found = cubin_facts(cubin)
    return found, facts(found.sass), resource_usage(cubin)["SHARED"]


@pytest.mark.skipif(cuobjdump_path() is None, reason="cuobjdump not installed")
def test_sm90_subblocks_fit_two_ctas_per_sm_at_the_s1_record():
    """At S1's record the whole-chunk walk compiles to 242 registers and 226.5 KB of shared memory (one CTA per SM);
    the 64-position main loop to 128 registers and under half the SM's 228 KB, warp-specialised, on HGMMA."""
    whole, _, whole_smem = _cubin_facts("fwd_pass_state", CutileSwitches(**SM90), "sm_90", S1, S1_RECORD)
    sub, sub_ops, sub_smem = _cubin_facts("fwd_pass_state", CutileSwitches(**SM90, state_subblock=64), "sm_90", S1,
                                          S1_RECORD)
    assert whole.registers > 128 and whole_smem > 114 * 1024
    assert sub.registers == 128 and sub_smem + 1024 <= 114 * 1024  # 1 KB per CTA reserved by the SM
    assert sub.warp_specialized and sub_ops["HGMMA"] > 0


@pytest.mark.skipif(cuobjdump_path() is None, reason="cuobjdump not installed")
@pytest.mark.parametrize("kernel,sub,arch,chunk", [
    pytest.param("fwd_pass_state", 128, "sm_90", 256, id="serial-sub128-c256-sm90"),
    pytest.param("fwd_pass_state_local", 64, "sm_90", 128, id="local-sub64-c128-sm90"),
    pytest.param("fwd_pass_state", 64, "sm_100", 256, id="serial-sub64-c256-sm100"),
    pytest.param("fwd_pass_state_local", 128, "sm_100", 128, id="local-sub128-c128-sm100"),
])
def test_subblocks_compile(kernel, sub, arch, chunk):
    """Every optional input present (initial states, seq_idx), both of stage 2's kernels that form local states."""
    from instruments.cutile.aot import AOT_DIMS, build_call, export
    from instruments.sass import disassemble, facts

    sw = CutileSwitches(state_subblock=sub)
    ops = facts(disassemble(export(build_call(kernel, torch.bfloat16, sw, dims=dict(AOT_DIMS, chunk=chunk)), arch)))
    assert ops["HGMMA" if arch == "sm_90" else "UTCMMA"] > 0


# --- refusals --------------------------------------------------------------------------------------------------------
def test_a_subblock_that_does_not_divide_the_chunk_is_refused():
    from impls.cutile import CutileBackend
    from instruments.cutile.aot import build_call

    base = Shape(2, 512, 8, 64, 2, 128, 64)
    assert CutileBackend(state_subblock=64).supports(Problem(base))[0]
    ok, reason = CutileBackend(state_subblock=128).supports(Problem(base))
    assert not ok and "state_subblock=128" in reason and "chunk_size=64" in reason, reason
    with pytest.raises(ValueError, match="state_subblock=128.*chunk_size=64"):
        build_call("fwd_pass_state", torch.bfloat16, CutileSwitches(state_subblock=128), dims={"chunk": 64})


def test_fused_state_out_refuses_the_subblocks():
    with pytest.raises(ValueError, match="state_subblock"):
        CutileSwitches(fuse_state_out=True, state_subblock=64)


def test_the_subblocks_key_stage_2_and_borrow_the_tiles_of_the_key_without_them():
    from impls.cutile.tune import record_key

    sw, base = CutileSwitches(state_subblock=64), CutileSwitches()
    label = "b8-l4096-h80-p64-g1-n128-c256"
    assert "state_subblock=64" in record_key("fwd_pass_state", sw, label, "bfloat16")
    assert record_key("fwd_pass_state", sw, label, "bfloat16", code_tricks=False) == \
        record_key("fwd_pass_state", base, label, "bfloat16", code_tricks=False)
    assert record_key("compute_out", sw, label, "bfloat16") == record_key("compute_out", base, label, "bfloat16")
    assert dataclasses.replace(sw, state_subblock=0) == base
