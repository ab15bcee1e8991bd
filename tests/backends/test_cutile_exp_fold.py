"""CPU tests of the cuTile exponent fold (switch exp_fold): compute_out run under emulation against the float64
reference (instruments/cutile/emulate.py), its kernels compiled for sm_90 and sm_100, its record key and refusals."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("cuda.tile")

from harness.correctness import refuse_unsafe_inputs  # noqa: E402
from impls.cutile import tune  # noqa: E402
from impls.cutile.backend import CutileBackend  # noqa: E402
from impls.cutile.switches import CutileSwitches  # noqa: E402
from impls.inputs import make_inputs  # noqa: E402
from impls.problem import Problem, Shape  # noqa: E402
from impls.tolerance import rel_err, tolerance  # noqa: E402
from instruments.cutile.aot import build_call, export  # noqa: E402
from instruments.sass import cuobjdump_path, disassemble, facts, sass_instructions  # noqa: E402
from tests.common import emulated_cutile_compute_out, float64_forward  # noqa: E402

SHAPE = Shape(1, 100, 4, 32, 2, 32, 64)  # two chunks, the last one short; two groups of two heads
TILES = {"block_rows": 32, "block_headdim": 32, "heads_per_tile": 1}
NO_SOFTPLUS = {"dt_softplus": False, "has_dt_bias": False}  # stage 1 passes dt through (no clamp either)


def _zero_dt(inputs):
    """dt = 0 at every third position."""
    inputs.dt[:, ::3] = 0.0
    return inputs


CASES = [
    pytest.param({}, Problem(SHAPE, has_z=True, nseqs=2), None, {}, id="defaults-seq_idx-z"),
    pytest.param({"operand_swap": True, "decay_factor": True}, Problem(SHAPE, has_z=True), None, {},
                 id="swap-decay_factor"),
    pytest.param({"exp2": False, "cb_mode": "shared"}, Problem(SHAPE), None, {}, id="no-exp2-cb-shared"),
    pytest.param({"head_mma": "per_head"}, Problem(SHAPE, nseqs=2), None, {"heads_per_tile": 2},
                 id="heads2-per_head"),
    pytest.param({"head_loop": 2}, Problem(SHAPE), None, {}, id="head_loop2"),
    pytest.param({"exp2_ftz": True}, Problem(SHAPE, **NO_SOFTPLUS), _zero_dt, {}, id="dt-zero-ftz"),
]


@pytest.mark.parametrize("switches,problem,edit,tiles", CASES)
def test_emulated_compute_out_matches_float64(switches, problem, edit, tiles):
    """compute_out with exp_fold (fold_kernel, then the main kernel reading q in dt's place), emulated on CPU, fed
    the float64 reference's stage-1 and stage-2 outputs, against its y (tf32 MMAs: tf32's tolerance); with the swap
    and the factored decay, without exp2 and with the shared C·Bᵀ, two heads per tile per head, the head loop, and
    dt = 0 at a third of the positions (q = +inf: zero terms, no NaN)."""
    inputs = make_inputs(problem, seed=11, dtype=torch.float32)
    if edit is not None:
        inputs = edit(inputs)
    ref = float64_forward(inputs)
    if edit is not None:
        assert bool((ref.dt == 0).any()), "the case must hand compute_out a dt of 0"
    y = emulated_cutile_compute_out(inputs, ref, CutileSwitches(exp_fold=True, **switches), {**TILES, **tiles})
    assert rel_err(y, ref.y) <= tolerance(torch.float32, True), rel_err(y, ref.y)


def test_a_negative_dt_is_refused_by_the_gate_and_gives_nan_unchecked():
    """The contract lets dt + dt_bias be negative without softplus and dt_limit; q has no value there. The gate
    refuses such inputs naming dt (the default switches take them), and the kernels, unchecked, give NaN in the
    rows that read it, not a wrong number."""
    inputs = make_inputs(Problem(SHAPE, **NO_SOFTPLUS), seed=5, dtype=torch.float32)
    inputs.dt[:, 7] = -0.01
    with pytest.raises(ValueError, match=r"^dt: .*exp_fold"):
        refuse_unsafe_inputs(CutileBackend(exp_fold=True), inputs)
    refuse_unsafe_inputs(CutileBackend(), inputs)
    ref = float64_forward(inputs)
    y = emulated_cutile_compute_out(inputs, ref, CutileSwitches(exp_fold=True), TILES)
    assert bool(y[:, 7:64].isnan().all()) and not bool(y[:, :7].isnan().any())


def test_exp_fold_is_refused_with_fuse_state_out():
    with pytest.raises(ValueError, match=r"exp_fold.*fuse_state_out"):
        CutileSwitches(exp_fold=True, fuse_state_out=True)


def test_record_key_keys_exp_fold_and_borrows_the_tiles_of_the_key_without_it():
    """compute_out's record key names exp_fold when on; the key it borrows from (code_tricks=False) is the
    defaults'; the other stages' keys are unchanged (their code is)."""
    fold, defaults = CutileSwitches(exp_fold=True), CutileSwitches()
    assert tune.record_key("compute_out", fold, "S1", "bfloat16") != tune.record_key("compute_out", defaults, "S1",
                                                                                     "bfloat16")
    assert "exp_fold" in tune.record_key("compute_out", fold, "S1", "bfloat16")
    assert tune.record_key("compute_out", fold, "S1", "bfloat16", code_tricks=False) == \
        tune.record_key("compute_out", defaults, "S1", "bfloat16")
    for other in ("chunk_cumsum", "fwd_pass_state"):
        assert tune.record_key(other, fold, "S1", "bfloat16") == tune.record_key(other, defaults, "S1", "bfloat16")


def _fmul_and_ex2(text: str) -> tuple[int, int]:
    code = sass_instructions(text)
    return (sum(1 for i in code if i.base == "FMUL"), sum(1 for i in code if i.op.startswith("MUFU.EX2")))


@pytest.mark.skipif(cuobjdump_path() is None, reason="cuobjdump not installed")
@pytest.mark.parametrize("arch", ["sm_90", "sm_100"])
def test_exp_fold_kernels_compile(arch):
    """fold_kernel and compute_out with exp_fold compile (bf16, every optional input); on sm_90 the main kernel
    keeps its MUFU.EX2s and loses FMULs (dt's per score, log2(e)'s per source value), on sm_100 it keeps its
    tcgen05 MMAs."""
    sw = CutileSwitches(exp_fold=True)
    fold = facts(disassemble(export(build_call("compute_out_fold", torch.bfloat16, sw), arch)))
    assert fold["instructions"] > 0
    main = disassemble(export(build_call("compute_out", torch.bfloat16, sw), arch))
    if arch == "sm_100":
        assert facts(main)["UTCMMA"] > 0
        return
    plain = disassemble(export(build_call("compute_out", torch.bfloat16, CutileSwitches()), arch))
    (fold_fmul, fold_ex2), (plain_fmul, plain_ex2) = _fmul_and_ex2(main), _fmul_and_ex2(plain)
    assert fold_ex2 == plain_ex2 > 0 and fold_fmul < plain_fmul, (fold_fmul, plain_fmul)
