"""CPU tests of the cuTile factored decay in one accumulator (switch decay_single): compute_out run under emulation
against the float64 reference (instruments/cutile/emulate.py), its kernel compiled for sm_90, its key and refusal."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("cuda.tile")

from impls.cutile import tune  # noqa: E402
from impls.cutile.switches import CutileSwitches  # noqa: E402
from impls.inputs import make_inputs  # noqa: E402
from impls.problem import Problem, Shape  # noqa: E402
from impls.tolerance import rel_err, tolerance  # noqa: E402
from instruments.cutile.aot import build_call, export  # noqa: E402
from instruments.cutile.spills import shape_dims  # noqa: E402
from instruments.sass import cubin_facts, cuobjdump_path, mma_loops  # noqa: E402
from tests.common import emulated_cutile_compute_out, float64_forward  # noqa: E402

# two chunks of four 16-row blocks, the last chunk short (36 rows: its last block partly past the end); two groups
SHAPE = Shape(1, 100, 4, 32, 2, 32, 64)
TILES = {"block_rows": 16, "block_headdim": 32, "heads_per_tile": 1}
SINGLE = {"decay_factor": True, "decay_single": True}
NO_SOFTPLUS = {"dt_softplus": False, "has_dt_bias": False}  # stage 1 passes dt through (no clamp either)


def _zero_dt(inputs):
    """dt = 0 at every third position."""
    inputs.dt[:, ::3] = 0.0
    return inputs


CASES = [
    pytest.param({}, Problem(SHAPE, has_z=True, has_initial_states=True, D_per_channel=True), None, {},
                 id="z-initial-states-D-per-channel"),
    pytest.param({"skip_first": True}, Problem(SHAPE, nseqs=3, has_initial_states=True), None, {},
                 id="seq_idx-skip_first"),
    pytest.param({"operand_swap": True}, Problem(SHAPE, has_z=True, has_initial_states=True), None, {}, id="swap"),
    pytest.param({"exp_fold": True, "exp2_ftz": True}, Problem(SHAPE, has_initial_states=True, **NO_SOFTPLUS),
                 _zero_dt, {}, id="dt-zero-exp_fold-ftz"),
    pytest.param({"exp2": False, "cb_mode": "shared"}, Problem(SHAPE, nseqs=2, has_initial_states=True), None, {},
                 id="no-exp2-cb-shared-seq_idx"),
    pytest.param({"head_mma": "per_head", "skip_first": True, "exp_fold": True},
                 Problem(SHAPE, nseqs=2, has_initial_states=True), None, {"heads_per_tile": 2},
                 id="heads2-per_head-exp_fold"),
    pytest.param({"head_loop": 2, "heads_first": True}, Problem(SHAPE, has_initial_states=True), None, {},
                 id="head_loop2"),
]


@pytest.mark.parametrize("switches,problem,edit,tiles", CASES)
def test_emulated_compute_out_matches_float64(switches, problem, edit, tiles):
    """compute_out with the factored decay in one accumulator, emulated on the CPU, fed the float64 reference's
    stage-1 and stage-2 outputs (initial states: an off-chunk term in the first chunk too), against its y: with z and
    D per channel, seq_idx (rows whose sequence began in the chunk take no off-chunk term) and the skip term first,
    the swapped operands, dt = 0 with the exponent fold and the flush, without exp2 and with the shared C·Bᵀ, two
    heads per tile per head, the head loop; a short last chunk throughout."""
    inputs = make_inputs(problem, seed=13, dtype=torch.float32)
    if edit is not None:
        inputs = edit(inputs)
    ref = float64_forward(inputs)
    y = emulated_cutile_compute_out(inputs, ref, CutileSwitches(**SINGLE, **switches), {**TILES, **tiles})
    assert rel_err(y, ref.y) <= tolerance(torch.float32, True), rel_err(y, ref.y)


def test_decay_single_is_refused_without_decay_factor():
    with pytest.raises(ValueError, match=r"decay_single.*decay_factor"):
        CutileSwitches(decay_single=True)


def test_record_key_keys_decay_single_and_borrows_the_tiles_of_decay_factor():
    """compute_out's record key names decay_single when on; the near key (the set without its tile-borrowing tricks)
    is decay_factor's own key; the other stages' keys are unchanged."""
    single, factor = CutileSwitches(**SINGLE), CutileSwitches(decay_factor=True)
    key = tune.record_key("compute_out", single, "S1", "bfloat16")
    assert "decay_single" in key and key != tune.record_key("compute_out", factor, "S1", "bfloat16")
    assert tune.near_key("compute_out", single, "S1", "bfloat16") == tune.record_key("compute_out", factor, "S1",
                                                                                      "bfloat16")
    for other in ("chunk_cumsum", "fwd_pass_state"):
        assert tune.record_key(other, single, "S1", "bfloat16") == tune.record_key(other, factor, "S1", "bfloat16")


@pytest.mark.skipif(cuobjdump_path() is None, reason="cuobjdump not installed")
def test_one_accumulator_compiles_without_spills_at_one_head_per_tile():
    """bf16 compute_out at S1's sizes and the sm_90 record's 64 × 64 tiles, occupancy 3, C·Bᵀ shared, one head per
    tile, under sm_90's defaults with the fold and the flush: the factored decay in two accumulators spills
    (decay_factor), in one it does not, keeps 80 registers and warp specialisation, and its source loop is shorter."""
    config = {"block_rows": 64, "block_headdim": 64, "heads_per_tile": 1, "occupancy": 3, "shared_cb": True}
    base = {"heads_first": True, "skip_first": True, "pdl": True, "exp_fold": True, "exp2_ftz": True,
            "decay_factor": True}
    built = {}
    for name, sw in (("two", CutileSwitches(**base)), ("one", CutileSwitches(**base, decay_single=True))):
        call = build_call("compute_out", torch.bfloat16, sw, dims=shape_dims("S1"), config=config, optional=False,
                          d_mode=1)
        built[name] = cubin_facts(export(call, "sm_90"))
    two, one = built["two"], built["one"]
    assert two.ldl + two.stl > 0 and one.ldl + one.stl == 0, (two.ldl, two.stl, one.ldl, one.stl)
    assert one.registers == two.registers == 80 and one.warp_specialized
    (loop_two,), (loop_one,) = mma_loops(two.sass), mma_loops(one.sass)
    assert loop_one.instructions < loop_two.instructions and loop_one.ex2 == loop_two.ex2 > 0
