"""GPU correctness of the cuTile fused forward (switch fuse_state_out: chunk_cumsum, then stages 2 and 3 in one
kernel, impls/cutile/fused.py, or with fused_program='chunk' impls/cutile/fused_chunk.py) against the float64
reference, y and the final state; the stage calls of the same backend keep the three-stage contract and are checked
too (tests.common.forward_errors).

Cases: the contract's GPU cases without packed sequences (the fused kernel refuses seq_idx / cu_seqlens), the
headline S1 shape (heavy), and a shape whose last chunk is partial with the full set of optional inputs. Variants,
for each program arrangement (serial, chunk): the fallback tiles, 64-column blocks (more registers: the compiler
spills), 32-row blocks, every code switch off. The chunk arrangement also returns the per-chunk states, checked
against the reference in every dtype (the hand-off from chunk to chunk is what they show), and leaves its sync array
zero, so that one launch can be repeated on it with the same results; at 32 chunks and thousands of programs (most
of them waiting on an earlier chunk), 20 launches on one set of buffers give the same bits.

    python -m pytest tests/gpu/test_cutile_fused.py -m gpu -q [-k chunk]
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from impls.problem import Shape
from tests.common import GPU_CONTRACT_CASES, assert_matches_float64, switch_variant_params

pytestmark = pytest.mark.gpu

OFF = {"latency_hints": False, "tma": False, "exp2": False, "cb_precision": "fp32"}  # what the fused kernel reads
CASES = {name: p for name, p in GPU_CONTRACT_CASES.items() if not p.has_seq_idx}
CASES["partial-chunk-init-z-Dchannel"] = dataclasses.replace(
    GPU_CONTRACT_CASES["init-z-Dchannel-fp32states"], shape=Shape(2, 1000, 8, 64, 2, 64, 128))
VARIANTS = {"defaults": {"fuse_state_out": True}, "p64": {"fuse_state_out": True, "block_headdim": 64},
            "rows32": {"fuse_state_out": True, "block_rows": 32}, "all-off": {"fuse_state_out": True, **OFF}}
VARIANTS.update({f"chunk-{name}" if name != "defaults" else "chunk": dict(sw, fused_program="chunk")
                 for name, sw in list(VARIANTS.items())})
ONE_S1 = ("defaults", "chunk")  # the variants run at S1 (heavy)


@pytest.mark.parametrize(
    "case,variant,dtype",
    switch_variant_params(CASES, VARIANTS, skip=lambda case, variant: case == "S1" and variant not in ONE_S1),
)
def test_fused_matches_float64(case, variant, dtype):
    from impls.cutile import CutileBackend

    ok, reason = CutileBackend.available()
    if not ok:
        pytest.skip(reason)
    backend = CutileBackend(**VARIANTS[variant])
    assert_matches_float64(backend, CASES[case], dtype, f"cutile-fused {case} {variant} {dtype}",
                           fused_views=case.startswith("Dhead-noncontig"))


STATE_CASES = ("seqlen1000-chunk256", "ngroups8", "partial-chunk-init-z-Dchannel")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("case", [c for c in STATE_CASES if c in CASES])
def test_fused_chunk_states_match_float64(case, dtype):
    """The chunk arrangement's forward returns the state entering every chunk (each one handed from the program of
    the chunk before), in state_dtype: against the reference's, beside y and the final state (outputs poisoned)."""
    import impls
    from impls.cutile import CutileBackend
    from impls.tolerance import poisoned_allocations
    from tests.common import failures, float64_forward, judged, make_inputs

    ok, reason = CutileBackend.available()
    if not ok:
        pytest.skip(reason)
    backend = CutileBackend(**VARIANTS["chunk"])
    inputs = make_inputs(CASES[case], device="cuda", seed=2, dtype=getattr(torch, dtype))
    ref = float64_forward(inputs)
    with poisoned_allocations():
        out = impls.ssd_forward(**inputs.forward_kwargs(), backend=backend)
    assert out.states is not None and out.states.dtype == (inputs.state_dtype or inputs.x.dtype)
    errors = {}
    for name, got, want in (("y", out.y, ref.y), ("final_states", out.final_states, ref.final_states),
                            ("states", out.states, ref.states)):
        errors[f"forward.{name}"], errors[f"forward.{name}[blocks]"] = judged(name, got, want, inputs.chunk_size)
    bad = failures(errors, inputs.x.dtype, backend, "cuda")
    assert not bad, f"over tolerance: {bad} (all: {errors})"


def _chunk_launches(problem, launches: int):
    """The chunk kernel launched `launches` times on one set of buffers (as the tuning timer repeats one call), on
    stage 1's outputs of bf16 inputs of `problem`, at the fused fallback tiles, its outputs NaN-poisoned before each
    launch: asserts that every launch leaves the sync array zero and gives the bits of the first; -> (the backend,
    the inputs, the number of chunks, the grid, the first launch's (y, states, final))."""
    from impls.cutile import CutileBackend, fused_chunk, tune
    from impls.cutile.common import launch
    from tests.common import make_inputs

    ok, reason = CutileBackend.available()
    if not ok:
        pytest.skip(reason)
    backend = CutileBackend(**VARIANTS["chunk"])
    inputs = make_inputs(problem, device="cuda", seed=3, dtype=torch.bfloat16)
    dt, dA = backend.chunk_cumsum(inputs.dt, inputs.A, inputs.chunk_size, inputs.dt_bias, inputs.dt_softplus,
                                  inputs.dt_limit)
    config = tune.FALLBACK[9]["fused"]
    y, states, final, sync = fused_chunk.outputs(inputs.x, inputs.B, dt, inputs.state_dtype, config)
    call = fused_chunk.stage_call(inputs.C, inputs.B, inputs.x, dt, dA, inputs.initial_states, inputs.D, inputs.z,
                                  y, states, final, sync, backend.switches, config)
    assert sync.numel() > 1 + dt.shape[2]  # the counter and the flags of every (batch, head, headdim block, chunk)
    first = None
    for run in range(launches):
        for t in (y, states, final):
            t.fill_(float("nan"))
        launch(call)
        torch.cuda.synchronize()
        assert not sync.any(), f"launch {run}: sync array left non-zero at {sync.nonzero().flatten().tolist()[:8]}"
        if first is None:
            first = [t.clone() for t in (y, states, final)]
            continue
        same = [torch.equal(a, b) for a, b in zip(first, (y, states, final))]
        assert all(same), f"launch {run} differs from launch 0 in (y, states, final): {same}"
    return backend, inputs, dt.shape[2], call.grid, first


def test_fused_chunk_leaves_its_sync_array_zero_and_repeats():
    """One launch leaves the ticket counter and every flag zero, and a second launch on the same buffers (as the
    tuning timer repeats one call) gives the same outputs, bit for bit."""
    *_, first = _chunk_launches(CASES["partial-chunk-init-z-Dchannel"], 2)
    assert all(torch.isfinite(t.float()).all() for t in first)


def test_fused_chunk_runs_agree_bitwise():
    """The hand-off under real concurrency: 32 chunks and 4096 programs (at the fallback's 32-column blocks; far more
    than one GPU holds at once, so the programs of later chunks wait while earlier ones run), launched 20 times on the
    same buffers. Every launch leaves the sync array zero and gives the same bits (the order of every sum is fixed, so
    a race on a flag, on the hand-off slot or on the counter's reset shows as a difference, or as a NaN from the
    outputs poisoned before each launch), and the first matches float64."""
    from impls.problem import Problem
    from tests.common import failures, float64_forward, judged

    backend, inputs, nchunks, grid, first = _chunk_launches(
        Problem(Shape(4, 8192, 16, 64, 1, 128, 256), has_initial_states=True), 20)
    assert nchunks == 32 and grid[0] >= 2048, grid
    ref = float64_forward(inputs)
    errors = {}
    for name, got, want in (("y", first[0], ref.y), ("states", first[1], ref.states),
                            ("final_states", first[2], ref.final_states)):
        errors[f"forward.{name}"], errors[f"forward.{name}[blocks]"] = judged(name, got, want, inputs.chunk_size)
    bad = failures(errors, inputs.x.dtype, backend, "cuda")
    assert not bad, f"over tolerance: {bad} (all: {errors})"
