"""GPU correctness of the cuTile backend: every stage and the full forward against the float64 reference.

Variants: the defaults, each code switch off alone, all off. Cases: the headline S1 shape and shapes covering the
contract (seqlen not a multiple of chunk, ngroups 8, seq_idx with 3 sequences, cu_seqlens, initial states + z +
per-channel D + fp32 states, per-head D with x and z as strided views of one fused projection, headdim/dstate not
powers of two). Outputs are NaN-poisoned (tests.common uses impls.tolerance.poisoned_allocations).

Compilation dominates the run time; CUTILE_TEST_SHARD="i/n" runs every n-th test so n processes can share the GPU
and compile in parallel (e.g. `for i in 0..7: CUTILE_TEST_SHARD=$i/8 pytest tests/gpu/test_cutile.py &`).
"""

from __future__ import annotations

import pytest

from tests.common import (
    GPU_CONTRACT_CASES,
    INNER_CHUNK_CASES,
    assert_inner_chunk_matches_float64,
    assert_matches_float64,
    switch_variant_params,
)

pytestmark = pytest.mark.gpu


CASES = GPU_CONTRACT_CASES
OFF = {"transposed_layout": False, "operand_swap": False, "latency_hints": False, "tma": False, "exp2": False,
       "decay_factor": False, "cb_precision": "fp32"}
# each code switch away from its default (operand_swap defaults to off: its variant turns it on), then all off;
# heads_per_tile 2 (one C·Bᵀ shared by two heads) lowered as one batched MMA; C·Bᵀ once per group by its own kernel
# (cb_mode shared) and inside the main kernel (inline); the factored decay (decay_factor) alone, with the swap, with
# the shared C·Bᵀ, with 32-row blocks (8 blocks per chunk of 256: 7 factored source blocks for the last) and all off;
# heads per tile lowered per head (head_mma per_head: one 2-D MMA chain per head, C·Bᵀ shared) with 2 heads, with the
# factored decay, the shared C·Bᵀ, all off, and with 4 heads (on the cases whose groups hold a multiple of 4 heads);
# the heads-first program order (heads_first) alone, with 2 heads per tile, with all off and the shared C·Bᵀ, and
# with small row and headdim blocks (several of each per chunk and head); the skip term before the source loop
# (skip_first) alone, with the swap (transposed accumulator), with 2 heads per tile and 32 headdim columns (the
# arrangement without spills in the loop at occupancy 3), with the factored decay and all off, with heads_first;
# stage 2 chunk-parallel (state_pass: local states at once, then the pass across chunks), with the swap and all off;
# stage 2's own kernel at the 32-wide blocks its search takes (docs/perf-notes.md, version 23): 32 dstate columns,
# with the swap and the row-major layout, and 32 headdim by 32 dstate columns under version 13's switches;
# compute_out's head loop (head_loop: a program walks up to N heads of a group, heads_per_tile per step) with one head
# per step (the fallback tiles), 2 heads per step per head and batched, with the swap, the factored decay and
# skip_first, the shared C·Bᵀ, heads_first with pdl, and all off; loops of 4, 8 and 16 over
# groups of 2, 4 and 80 heads: one shorter block where the loop is longer than a group (and, below, a loop that does
# not divide a group of 12);
# stages 2 and 3 as programmatic dependent launches (pdl) alone, with the shared C·Bᵀ (its kernel launched normally in
# between), with stage 2 chunk-parallel (two dependent kernels) and with 2 heads per tile; each other opt_level;
# stage 2's local state as a main loop over 64- and 128-position sub-blocks (state_subblock) alone, under sm_90's
# defaults, chunk-parallel with the swap, and all off (on the cases whose chunk the sub-block divides)
# the exponent fold (exp_fold: fold_kernel's q read in dt's place) alone, with the swap, with exp2_ftz and 2 heads per
# tile per head (S1's record), with the factored decay and the shared C·Bᵀ, with the head loop and pdl (fold_kernel
# launched normally before the dependent main kernel), and all off (q in base e);
# the forward's stages at an internal chunk of 128 and 64 (inner_chunk; the stage calls keep the case's chunk), under
# sm_90's defaults, and chunk-parallel with the swap (on the cases whose chunk is larger than the inner one)
PER_HEAD = {"heads_per_tile": 2, "head_mma": "per_head"}
# the C·Bᵀ kernel's switches (cb_occupancy, cb_lower_triangle), C·Bᵀ shared: each alone, together, the lower triangle
# with the factored decay and the swap (transposed reads of the pairs), with 32-row blocks (36 of 64 pairs of a chunk
# of 256), with the head loop and two heads per tile per head, and with all off; the pairs above the diagonal are
# left unwritten in a poisoned buffer, so a read of one shows as NaN
CB_SHARED = {"cb_mode": "shared"}
CB_KERNEL_VARIANTS = {
    "cb-occupancy4": {**CB_SHARED, "cb_occupancy": 4}, "cb-occupancy2": {**CB_SHARED, "cb_occupancy": 2},
    "cb-lower": {**CB_SHARED, "cb_lower_triangle": True},
    "cb-lower-occupancy4": {**CB_SHARED, "cb_lower_triangle": True, "cb_occupancy": 4},
    "cb-lower-decay_factor-swap": {**CB_SHARED, "cb_lower_triangle": True, "decay_factor": True,
                                   "operand_swap": True},
    "cb-lower-rows32": {**CB_SHARED, "cb_lower_triangle": True, "block_rows": 32},
    "cb-lower-head_loop4-heads2-per_head": {**CB_SHARED, **PER_HEAD, "cb_lower_triangle": True, "head_loop": 4},
    "cb-lower-occupancy4-all-off": {**OFF, **CB_SHARED, "cb_lower_triangle": True, "cb_occupancy": 4},
}
# the factored decay in one accumulator (decay_single, with decay_factor): alone, under sm_90's defaults with the fold
# and the flush at one head per tile (the issue's arrangement) and at two per head, with the swap, with the shared C·Bᵀ
# and 32-row blocks, with the head loop, and all off (exp, per-thread loads, no hints)
SINGLE = {"decay_factor": True, "decay_single": True}
SM90 = {"heads_first": True, "skip_first": True, "pdl": True}
DECAY_SINGLE_VARIANTS = {
    "decay-single": dict(SINGLE),
    "decay-single-sm90-fold-ftz-heads1": {**SINGLE, **SM90, "exp_fold": True, "exp2_ftz": True, "heads_per_tile": 1},
    "decay-single-sm90-fold-ftz-heads2-per_head": {**SINGLE, **SM90, **PER_HEAD, "exp_fold": True, "exp2_ftz": True},
    "decay-single-swap": {**SINGLE, "operand_swap": True},
    "decay-single-cb-shared-rows32": {**SINGLE, "cb_mode": "shared", "block_rows": 32},
    "decay-single-head_loop4-skip_first": {**SINGLE, "head_loop": 4, "skip_first": True},
    "decay-single-all-off": {**OFF, **SINGLE},
}
VARIANTS = {"defaults": {}, "no-transposed_layout": {"transposed_layout": False},
            "operand_swap": {"operand_swap": True},
            **{f"no-{k}": {k: OFF[k]} for k in ("latency_hints", "tma", "exp2", "cb_precision")},
            "all-off": dict(OFF), "heads2": {"heads_per_tile": 2, "head_mma": "batched"},
            "heads2-swap": {"heads_per_tile": 2, "operand_swap": True, "head_mma": "batched"},
            "cb-shared": {"cb_mode": "shared"}, "cb-shared-swap": {"cb_mode": "shared", "operand_swap": True},
            "cb-shared-all-off": {"cb_mode": "shared", **OFF}, "cb-inline": {"cb_mode": "inline"},
            "decay_factor": {"decay_factor": True}, "decay_factor-swap": {"decay_factor": True, "operand_swap": True},
            "decay_factor-cb-shared": {"decay_factor": True, "cb_mode": "shared"},
            "decay_factor-rows32": {"decay_factor": True, "block_rows": 32},
            "decay_factor-all-off": {**OFF, "decay_factor": True},
            "heads2-per_head": dict(PER_HEAD), "heads2-per_head-decay_factor": {**PER_HEAD, "decay_factor": True},
            "heads2-per_head-cb-shared": {**PER_HEAD, "cb_mode": "shared"},
            "heads2-per_head-all-off": {**OFF, **PER_HEAD}, "heads4-per_head": {**PER_HEAD, "heads_per_tile": 4},
            "heads_first": {"heads_first": True}, "heads_first-heads2-per_head": {**PER_HEAD, "heads_first": True},
            "heads_first-cb-shared-all-off": {**OFF, "cb_mode": "shared", "heads_first": True},
            "heads_first-rows32-headdim32": {"heads_first": True, "block_rows": 32, "block_headdim": 32},
            "skip_first": {"skip_first": True}, "skip_first-swap": {"skip_first": True, "operand_swap": True},
            "skip_first-heads2-per_head-headdim32": {**PER_HEAD, "skip_first": True, "block_headdim": 32},
            "skip_first-decay_factor-all-off": {**OFF, "decay_factor": True, "skip_first": True},
            "skip_first-heads_first-heads2-batched": {"skip_first": True, "heads_first": True, "heads_per_tile": 2,
                                                      "head_mma": "batched"},
            "head_loop4": {"head_loop": 4},
            "head_loop8-heads2-per_head": {**PER_HEAD, "head_loop": 8},
            "head_loop4-heads2-batched": {"head_loop": 4, "heads_per_tile": 2, "head_mma": "batched"},
            "head_loop4-swap": {"head_loop": 4, "operand_swap": True},
            "head_loop4-heads2-per_head-decay_factor-skip_first": {**PER_HEAD, "head_loop": 4, "decay_factor": True,
                                                                   "skip_first": True},
            "head_loop16-cb-shared": {"head_loop": 16, "cb_mode": "shared"},
            "head_loop4-heads_first-pdl": {"head_loop": 4, "heads_first": True, "pdl": True},
            "head_loop4-all-off": {**OFF, "head_loop": 4},
            "dstate32": {"block_dstate": 32}, "dstate32-swap-rowmajor": {"block_dstate": 32, "operand_swap": True,
                                                                      "transposed_layout": False},
            "headdim32-dstate32-heads_first-skip_first-pdl": {"block_headdim": 32, "block_dstate": 32,
                                                              "heads_first": True, "skip_first": True, "pdl": True},
            "state_pass-chunk_parallel": {"state_pass": "chunk_parallel"},
            "state_pass-chunk_parallel-swap": {"state_pass": "chunk_parallel", "operand_swap": True},
            "state_pass-chunk_parallel-all-off": {"state_pass": "chunk_parallel", **OFF},
            "pdl": {"pdl": True}, "pdl-cb-shared": {"pdl": True, "cb_mode": "shared"},
            "pdl-state_pass-chunk_parallel": {"pdl": True, "state_pass": "chunk_parallel"},
            "pdl-heads2-per_head": {**PER_HEAD, "pdl": True},
            **{f"opt_level{v}": {"opt_level": v} for v in (0, 1, 2)},
            **CB_KERNEL_VARIANTS,
            "state_subblock64": {"state_subblock": 64}, "state_subblock128": {"state_subblock": 128},
            "state_subblock64-sm90": {"state_subblock": 64, "heads_first": True, "skip_first": True, "pdl": True},
            "state_subblock64-chunk_parallel-swap": {"state_subblock": 64, "state_pass": "chunk_parallel",
                                                     "operand_swap": True},
            "state_subblock128-rowmajor-all-off": {**OFF, "state_subblock": 128},
            "exp_fold": {"exp_fold": True}, "exp_fold-swap": {"exp_fold": True, "operand_swap": True},
            "exp_fold-ftz-heads2-per_head": {**PER_HEAD, "exp_fold": True, "exp2_ftz": True},
            "exp_fold-decay_factor-cb-shared": {"exp_fold": True, "decay_factor": True, "cb_mode": "shared"},
            "exp_fold-head_loop4-pdl": {"exp_fold": True, "head_loop": 4, "pdl": True},
            "exp_fold-all-off": {**OFF, "exp_fold": True},
            "inner-chunk128": {"inner_chunk": 128}, "inner-chunk64": {"inner_chunk": 64},
            "inner-chunk128-sm90": {"inner_chunk": 128, "heads_first": True, "skip_first": True, "pdl": True},
            "inner-chunk64-chunk_parallel-swap": {"inner_chunk": 64, "state_pass": "chunk_parallel",
                                                  "operand_swap": True},
            **DECAY_SINGLE_VARIANTS}
# variants run in fp32 (tf32 MMAs) as well as bf16, beyond the fp16/fp32 runs of switch_variant_params
FP32_VARIANTS = ("heads2-per_head", "heads_first", "skip_first", "state_pass-chunk_parallel", "exp_fold",
                 "head_loop8-heads2-per_head", "cb-lower-occupancy4", "state_subblock64")


def _skip(case: str, variant: str) -> bool:
    """The big shape: a few variants only (its float64 reference is heavy); heads_per_tile must divide the heads
    of a group, and state_subblock the chunk."""
    if case == "S1" and variant not in ("defaults", "all-off", "cb-shared", "decay_factor", "heads2-per_head",
                                        "heads_first-heads2-per_head", "skip_first-heads2-per_head-headdim32",
                                        "state_pass-chunk_parallel", "head_loop8-heads2-per_head",
                                        "cb-lower-occupancy4", "state_subblock64-sm90",
                                        "exp_fold-ftz-heads2-per_head", "inner-chunk128",
                                        "decay-single-sm90-fold-ftz-heads1"):
        return True
    shape = CASES[case].shape
    inner = VARIANTS[variant].get("inner_chunk", 0)
    if inner and shape.chunk_size <= inner:  # the switch changes nothing
        return True
    sub = VARIANTS[variant].get("state_subblock", 0)
    if sub and shape.chunk_size % sub:
        return True
    return (shape.nheads // shape.ngroups) % VARIANTS[variant].get("heads_per_tile", 1) != 0


def _params() -> list:
    extra = [pytest.param(case, variant, "float32", id=f"{case}-{variant}-float32")
             for case in CASES for variant in FP32_VARIANTS if case != "S1" and not _skip(case, variant)]
    return switch_variant_params(CASES, VARIANTS, skip=_skip) + extra





@pytest.mark.parametrize("case,variant,dtype", _params())
def test_cutile_matches_float64(case, variant, dtype, request):
    from impls.cutile import CutileBackend

    ok, reason = CutileBackend.available()
    if not ok:
        pytest.skip(reason)
    backend = CutileBackend(**VARIANTS[variant])
    assert_matches_float64(backend, CASES[case], dtype, f"cutile {case} {variant} {dtype}",
                           fused_views=case.startswith("Dhead-noncontig"))


@pytest.mark.parametrize("case", list(INNER_CHUNK_CASES))
@pytest.mark.parametrize("inner", [64, 128])
def test_cutile_inner_chunk_returns_the_callers_chunk(case, inner):
    """inner_chunk: the whole ForwardResult (y, final and per-sequence states, and dt, dA_cumsum, states converted to
    the caller's chunk) against the float64 reference at the caller's chunk."""
    from impls.cutile import CutileBackend

    ok, reason = CutileBackend.available()
    if not ok:
        pytest.skip(reason)
    assert_inner_chunk_matches_float64(CutileBackend(inner_chunk=inner), INNER_CHUNK_CASES[case], "bfloat16",
                                       f"cutile inner_chunk={inner} {case}")


# 12 heads in one group (and 6 in each of two) with a loop of 8: blocks of 8 and 4 heads (of 6: one shorter block);
# seq_idx, z and initial states present
HEAD_LOOP_TAILS = {"g1-h12": (1, 12), "g2-h12": (2, 12)}


@pytest.mark.parametrize("shape", list(HEAD_LOOP_TAILS))
@pytest.mark.parametrize("switches", [pytest.param({"head_loop": 8}, id="loop8"),
                                      pytest.param({**PER_HEAD, "head_loop": 8}, id="loop8-heads2-per_head"),
                                      pytest.param({"head_loop": 8, "decay_factor": True, "operand_swap": True},
                                                   id="loop8-decay_factor-swap")])
def test_cutile_head_loop_tail_matches_float64(shape, switches):
    """The head loop where it does not divide the heads of a group: the group's last program walks fewer heads."""
    from impls.cutile import CutileBackend
    from impls.problem import Problem, Shape

    ok, reason = CutileBackend.available()
    if not ok:
        pytest.skip(reason)
    ngroups, nheads = HEAD_LOOP_TAILS[shape]
    problem = Problem(Shape(2, 600, nheads, 64, ngroups, 64, 128), nseqs=2, has_z=True, has_initial_states=True)
    assert_matches_float64(CutileBackend(**switches), problem, "bfloat16", f"cutile head_loop tail {shape} {switches}")


@pytest.mark.heavy
@pytest.mark.parametrize("cb_mode", ["inline", "shared"])
def test_million_tokens(cb_mode):
    """1,048,576 tokens x 80 heads (5.4e9 elements of x): the int64-indexed kernels (tests/gpu/long_sequence.py
    says what is checked; cuTile's fused fwd_pass_state keeps no chunk-local states to compare)."""
    import torch

    from impls.cutile import CutileBackend
    from impls.tolerance import tolerance
    from tests.gpu.long_sequence import MILLION, MILLION_SAMPLED, long_inputs, long_sequence_errors

    ok, reason = CutileBackend.available()
    if not ok:
        pytest.skip(reason)
    backend = CutileBackend(cb_mode=cb_mode)
    errors = long_sequence_errors(backend, long_inputs(MILLION, "cuda", torch.bfloat16), MILLION_SAMPLED)
    tol = tolerance(torch.bfloat16)
    bad = {k: v for k, v in errors.items() if not v <= tol}
    print(f"[cutile] million tokens: worst {max(errors, key=errors.get)}={max(errors.values()):.2e} "
          f"{backend.describe()['stages']}")
    assert not bad, f"over tolerance: {bad} (all: {errors})"


def test_search_resume_record_on_gpu(tmp_path, monkeypatch):
    """tuning="search" over a small space (most size switches pinned): every config timed by cuda.tile.tune one at
    a time, the best confirmed as whole stages (compute_out), stored with the stack; "resume" and "record" then
    read the records back and the forward stays correct."""
    import torch

    from impls import tuning
    from impls.cutile import CutileBackend
    from impls.problem import Problem, Shape
    from tests.common import failures, run_case

    ok, reason = CutileBackend.available()
    if not ok:
        pytest.skip(reason)
    monkeypatch.setenv("SSD_TUNING_DIR", str(tmp_path))
    pins = dict(block_heads=8, block_headdim=64, block_dstate=64, block_rows=64, heads_per_tile=1)
    problem = Problem(Shape(2, 512, 8, 64, 2, 64, 128))
    searched = CutileBackend(tuning="search", **pins)
    assert not failures(run_case(searched, problem, torch.bfloat16, device="cuda"), torch.bfloat16)
    stages = searched.describe()["stages"]
    assert {info["source"] for info in stages.values()} == {"search"}, stages
    record = tuning.lookup("cutile", "compute_out", torch.cuda.get_device_name(), stages["compute_out"]["key"])
    assert record["confirmed"] and record["versions"]["cuda-tile"] and record["measurements"]
    for mode in ("resume", "record"):
        again = CutileBackend(tuning=mode, **pins)
        assert not failures(run_case(again, problem, torch.bfloat16, device="cuda"), torch.bfloat16)
        assert {s: i["config"] for s, i in again.describe()["stages"].items()} == {
            s: i["config"] for s, i in stages.items()}
        assert {i["source"] for i in again.describe()["stages"].values()} == {"record"}
