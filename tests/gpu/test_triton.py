"""GPU correctness of the Triton backend: every stage and the full forward against the float64 reference (on the GPU),
plus the 1,048,576-token problem checked on sampled chunks and its final state.

Variants: the defaults, each code switch off alone (cb_precision "fp32" is its "off"), all off, and the switches that
are off by default turned on (cb_mode shared, decay_factor, tma (descriptors made in the kernel or on the host),
fuse_state_out, heads_per_tile 2, heads_first, occupancy, exp_fold, decay_single, some together), and
stage 2 as one serial kernel (state_pass serial). Cases: the headline S1 shape and shapes covering the contract
(seqlen not a multiple of chunk, ngroups 8, seq_idx with 3 sequences, cu_seqlens, initial states + z + per-channel D +
fp32 states, per-head D with x and z as strided views of one fused projection, headdim/dstate not powers of two).
Outputs are NaN-poisoned (tests.common uses impls.tolerance.poisoned_allocations). fp32 with cb_precision "tf32" is
held to the tf32 tolerance.

TRITON_TEST_SHARD="i/n" runs every n-th test, so n processes can share the GPU and compile in parallel.

The million-token problem (test_million_tokens): a float64 reference of the whole problem does not fit the
budget, and building the reference state entering a sampled chunk from the backend's own earlier states would not
be independent. So the reference is the chunked PyTorch reference run in float32 on the GPU, chunk group by chunk
group (impls.reference stages on slices: chunk_local_states, then pass_states carrying the state between groups),
from the raw inputs: its states entering the sampled chunks and its final state are independent of the backend.
Checked against it: the backend's dt/dA_cumsum (everywhere), its fp32 chunk-local states (sampled chunks), the
entering states (sampled chunks), y on the sampled chunks (reference compute_out in float64 on the chunk's slice,
from the float32 reference's entering state) and the final state. The sampled chunks include those where
x's, the states' and y's element offsets cross 2^31 (the 64-bit-offset paths).
"""

from __future__ import annotations

import pytest
import torch

import impls
from impls.inputs import make_inputs
from impls.problem import Problem, Shape
from impls.tolerance import rel_err, tolerance
from tests.common import (
    GPU_CONTRACT_CASES,
    GPU_SMALL,
    INNER_CHUNK_CASES,
    assert_inner_chunk_matches_float64,
    assert_matches_float64,
    float64_forward,
    switch_variant_params,
)
from tests.gpu.long_sequence import MILLION, MILLION_SAMPLED, long_inputs, long_sequence_errors

pytestmark = pytest.mark.gpu

SMALL = GPU_SMALL

CASES = {
    **GPU_CONTRACT_CASES,
    "p256-n256-fp32-smem": Problem(Shape(1, 300, 2, 256, 1, 256, 128), has_initial_states=True),
}
OFF = {"transposed_layout": False, "operand_swap": False, "exp2": False, "cb_precision": "fp32"}
VARIANTS = {"defaults": {}, **{f"no-{k}": {k: v} for k, v in OFF.items()}, "all-off": dict(OFF),
            "cb-shared": {"cb_mode": "shared"}, "cb-shared-no-swap": {"cb_mode": "shared", "operand_swap": False},
            "decay_factor": {"decay_factor": True},
            "decay_factor-no-swap": {"decay_factor": True, "operand_swap": False},
            "decay_factor-cb-shared": {"decay_factor": True, "cb_mode": "shared"},
            # the factored decay in one accumulator (decay_single): alone, without the swap, with TMA and two heads per
            # program, with the fold and the shared C·Bᵀ
            "decay-single": {"decay_factor": True, "decay_single": True},
            "decay-single-no-swap": {"decay_factor": True, "decay_single": True, "operand_swap": False},
            "decay-single-tma-heads2": {"decay_factor": True, "decay_single": True, "tma": True, "heads_per_tile": 2},
            "decay-single-exp_fold-cb-shared": {"decay_factor": True, "decay_single": True, "exp_fold": True,
                                                "cb_mode": "shared"},
            "tma": {"tma": True}, "tma-no-swap": {"tma": True, "operand_swap": False},
            "tma-no-transposed": {"tma": True, "transposed_layout": False},
            "fused": {"fuse_state_out": True}, "fused-no-swap": {"fuse_state_out": True, "operand_swap": False},
            "fused-tma": {"fuse_state_out": True, "tma": True},
            "fused-tma-decay_factor": {"fuse_state_out": True, "tma": True, "decay_factor": True},
            "fused-chunk": {"fuse_state_out": True, "fused_program": "chunk"},
            "fused-chunk-no-swap": {"fuse_state_out": True, "fused_program": "chunk", "operand_swap": False},
            "fused-chunk-tma-host": {"fuse_state_out": True, "fused_program": "chunk", "tma": True,
                                     "tma_descriptors": "host"},
            "fused-chunk-tma-host-cb-shared": {"fuse_state_out": True, "fused_program": "chunk", "tma": True,
                                               "tma_descriptors": "host", "cb_mode": "shared"},
            "fused-tma-host": {"fuse_state_out": True, "tma": True, "tma_descriptors": "host"},
            "heads2": {"heads_per_tile": 2}, "heads2-no-swap": {"heads_per_tile": 2, "operand_swap": False},
            "heads2-tma-occupancy3": {"heads_per_tile": 2, "tma": True, "occupancy": 3},
            "heads_first": {"heads_first": True}, "heads_first-heads2": {"heads_first": True, "heads_per_tile": 2},
            "heads_first-tma-no-swap": {"heads_first": True, "tma": True, "operand_swap": False},
            "state_pass-serial": {"state_pass": "serial"},
            "state_pass-serial-all-off": {"state_pass": "serial", **OFF},
            "state_pass-serial-tma": {"state_pass": "serial", "tma": True},
            "state_pass-serial-tma-host": {"state_pass": "serial", "tma": True, "tma_descriptors": "host"},
            "tma-host": {"tma": True, "tma_descriptors": "host"},
            "tma-host-no-swap": {"tma": True, "tma_descriptors": "host", "operand_swap": False},
            "tma-host-no-transposed": {"tma": True, "tma_descriptors": "host", "transposed_layout": False},
            "tma-host-heads2-decay_factor": {"tma": True, "tma_descriptors": "host", "heads_per_tile": 2,
                                             "decay_factor": True},
            "launch-cached": {"launch_path": "cached"},
            "launch-cached-tma-host-serial": {"launch_path": "cached", "tma": True, "tma_descriptors": "host",
                                              "state_pass": "serial"},
            # the C·Bᵀ tiles above the diagonal left unwritten (poisoned): 128-row programs span two tile rows
            "cb-shared-lower": {"cb_mode": "shared", "cb_lower_triangle": True},
            "cb-shared-lower-rows128": {"cb_mode": "shared", "cb_lower_triangle": True, "block_rows": 128,
                                        "block_positions": 64},
            "cb-shared-lower-no-swap-decay_factor-heads2": {"cb_mode": "shared", "cb_lower_triangle": True,
                                                            "operand_swap": False, "decay_factor": True,
                                                            "heads_per_tile": 2},
            "exp_fold": {"exp_fold": True}, "exp_fold-all-off": {**OFF, "exp_fold": True},
            "exp_fold-tma-host-heads2-decay_factor": {"exp_fold": True, "tma": True, "tma_descriptors": "host",
                                                      "heads_per_tile": 2, "decay_factor": True},
            "exp_fold-no-ftz-cb-shared": {"exp_fold": True, "exp2_ftz": False, "cb_mode": "shared"},
            # the forward's stages at an internal chunk (inner_chunk; the stage calls keep the case's chunk)
            "inner-chunk128": {"inner_chunk": 128}, "inner-chunk64": {"inner_chunk": 64},
            "inner-chunk128-tma-host-serial": {"inner_chunk": 128, "tma": True, "tma_descriptors": "host",
                                               "state_pass": "serial"},
            "inner-chunk64-fused": {"inner_chunk": 64, "fuse_state_out": True},
            }





def _backend(**switches):
    from impls.triton import TritonBackend
    from impls.triton.target import interpreting

    if interpreting():
        pytest.skip("impls.triton was imported under TRITON_INTERPRET=1: run `pytest tests/gpu` on its own")
    ok, reason = TritonBackend.available()
    if not ok:
        pytest.skip(reason)
    return TritonBackend(**switches)


def _skip(case, variant):
    # the big shape: defaults and all-off only (its float64 reference is heavy); the largest tiles: do they fit
    # shared memory (fp32 especially). Tensor descriptors cannot read x and z as unaligned views of one projection
    # (refused with the tensor's name, tested on CPU); every other case's strides are 16-byte multiples.
    if "tma" in variant and case.startswith("Dhead-noncontig"):
        return True
    chunk = CASES[case].shape.chunk_size
    inner = VARIANTS[variant].get("inner_chunk", 0)
    if inner and chunk <= inner:  # the switch changes nothing there
        return True
    return (case == "S1" or case.startswith("p256")) and variant not in ("defaults", "all-off", "cb-shared",
                                                                                  "decay_factor", "tma", "fused",
                                                                                  "fused-tma", "fused-chunk",
                                                                                  "fused-chunk-tma-host", "heads2",
                                                                                  "heads_first-heads2",
                                                                                  "state_pass-serial", "tma-host",
                                                                                  "inner-chunk128")


@pytest.mark.parametrize("case,variant,dtype", switch_variant_params(CASES, VARIANTS, skip=_skip))
def test_triton_matches_float64(case, variant, dtype, request):
    backend = _backend(**VARIANTS[variant])
    assert_matches_float64(backend, CASES[case], dtype, f"triton {case} {variant} {dtype}",
                           fused_views=case.startswith("Dhead-noncontig"))


@pytest.mark.parametrize("case", list(INNER_CHUNK_CASES))
@pytest.mark.parametrize("switches", [pytest.param({"inner_chunk": 64}, id="inner-chunk64"),
                                      pytest.param({"inner_chunk": 128}, id="inner-chunk128"),
                                      pytest.param({"inner_chunk": 64, "fuse_state_out": True},
                                                   id="inner-chunk64-fused")])
def test_triton_inner_chunk_returns_the_callers_chunk(case, switches):
    """inner_chunk: the whole ForwardResult (y, final and per-sequence states, and dt, dA_cumsum, states converted to
    the caller's chunk) against the float64 reference at the caller's chunk."""
    assert_inner_chunk_matches_float64(_backend(**switches), INNER_CHUNK_CASES[case], "bfloat16",
                                       f"triton {switches} {case}")


@pytest.mark.parametrize("switches", [{}, {"tma": True, "tma_descriptors": "host", "state_pass": "serial"},
                                      {"fuse_state_out": True},
                                      {"fuse_state_out": True, "fused_program": "chunk", "tma": True,
                                       "tma_descriptors": "host"}],
                         ids=["defaults", "tma-host-serial", "fused", "fused-chunk-tma-host"])
def test_cached_launch_matches_triton_bitwise(switches):
    """launch_path='cached' launches the same compiled kernels with the same arguments: the first call (through
    Triton), a repeat (from the cache) and a call on new inputs (from the cache, new tensors and descriptors) give
    the bits of launch_path='triton', and those match the float64 reference."""
    import triton.runtime.jit as jit

    from impls.tolerance import poisoned_allocations
    from impls.triton import launcher

    plain, cached = _backend(**switches), _backend(launch_path="cached", **switches)
    first, second = (make_inputs(Problem(SMALL), device="cuda", seed=s, dtype=torch.bfloat16) for s in (4, 5))
    runs, real_run = [0], jit.JITFunction.run

    def counted(self, *args, **kwargs):
        runs[0] += 1
        return real_run(self, *args, **kwargs)

    launcher.clear()
    jit.JITFunction.run = counted
    try:
        with poisoned_allocations():
            for call, inputs in enumerate((first, first, second)):
                want = impls.ssd_forward(**inputs.forward_kwargs(), backend=plain)
                before = runs[0], len(launcher._COMPILED)
                got = impls.ssd_forward(**inputs.forward_kwargs(), backend=cached)
                if call:  # the repeat and the new inputs: every launch from the cache, none through Triton
                    assert (runs[0], len(launcher._COMPILED)) == before
                else:
                    assert runs[0] > before[0] and len(launcher._COMPILED) > before[1]
                assert torch.equal(got.y, want.y) and torch.equal(got.final_states, want.final_states)
                assert torch.equal(got.states, want.states)
                assert rel_err(got.y, float64_forward(inputs).y) <= tolerance(torch.bfloat16)
    finally:
        jit.JITFunction.run = real_run


def test_search_then_record_on_gpu(tmp_path, monkeypatch, request):
    """tuning="search" times a small declared space (most fields pinned) with do_bench and stores records;
    "record" then reads them back; results stay correct."""
    monkeypatch.setenv("SSD_TUNING_DIR", str(tmp_path))
    pins = dict(block_rows=64, block_positions=64, block_headdim=64, block_dstate=64, block_heads=8,
                num_stages=2)
    inputs = make_inputs(Problem(SMALL), device="cuda", seed=2, dtype=torch.bfloat16)
    ref = float64_forward(inputs)
    searched = _backend(tuning="search", **pins)
    out = impls.ssd_forward(**inputs.forward_kwargs(), backend=searched)
    assert rel_err(out.y, ref.y) <= tolerance(torch.bfloat16)
    stages = searched.describe()["stages"]
    assert {info["source"] for info in stages.values()} == {"search"}, stages
    assert len(list(tmp_path.rglob("triton_*.json"))) == 4
    recorded = _backend(tuning="record", **pins)
    out = impls.ssd_forward(**inputs.forward_kwargs(), backend=recorded)
    assert rel_err(out.y, ref.y) <= tolerance(torch.bfloat16)
    assert {info["source"] for info in recorded.describe()["stages"].values()} == {"record"}
    assert {s: i["config"] for s, i in recorded.describe()["stages"].items()} == {s: i["config"] for s, i in
                                                                                    stages.items()}


STRESS_VARIANTS = {**{name: VARIANTS[name] for name in ("fused", "fused-chunk", "fused-tma-host",
                                                         "fused-chunk-tma-host-cb-shared")},
                   # two headdim tiles: two hand-off chains per head, under real concurrency
                   "fused-chunk-p32": {**VARIANTS["fused-chunk"], "block_headdim": 32}}


@pytest.mark.parametrize("variant", list(STRESS_VARIANTS))
def test_fused_runs_agree_bitwise(variant):
    """The fused kernel's hand-off under real concurrency: 20 runs of a problem with 32 chunks give the same bits
    (the order of every sum is fixed, so a race on a flag or on the hand-off slot would show as a difference or a
    NaN from the poisoned outputs), and the first matches the float64 reference. Both programs, with pointer loads
    and with TMA through host descriptors (the benchmarked arm's switches; C·Bᵀ from memory with 'chunk'), and
    'chunk' with two headdim tiles."""
    from impls.tolerance import poisoned_allocations

    backend = _backend(**STRESS_VARIANTS[variant])
    inputs = make_inputs(Problem(Shape(4, 8192, 16, 64, 1, 128, 256), has_initial_states=True), device="cuda",
                         seed=3, dtype=torch.bfloat16)
    with poisoned_allocations():
        runs = [impls.ssd_forward(**inputs.forward_kwargs(), backend=backend) for _ in range(20)]
    for out in runs[1:]:
        assert torch.equal(out.y, runs[0].y) and torch.equal(out.final_states, runs[0].final_states)
        assert torch.equal(out.states, runs[0].states)
    ref = float64_forward(inputs)
    assert rel_err(runs[0].y, ref.y) <= tolerance(torch.bfloat16)
    assert rel_err(runs[0].final_states, ref.final_states) <= tolerance(torch.bfloat16)


@pytest.mark.parametrize("variant", ["fused", "fused-chunk-tma-host"])
def test_fused_graph_replays_agree_bitwise(variant):
    """The fused forward captured in a CUDA graph (as the harness times it): the sync array's zero fill is captured
    with the kernel, so every replay starts from zero flags and gives the eager call's bits."""
    backend = _backend(**VARIANTS[variant])
    inputs = make_inputs(Problem(Shape(2, 4096, 8, 64, 1, 128, 256), has_initial_states=True), device="cuda",
                         seed=4, dtype=torch.bfloat16)
    kw = inputs.forward_kwargs()
    eager = impls.ssd_forward(**kw, backend=backend)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        impls.ssd_forward(**kw, backend=backend)  # warm-up off the default stream, as capture requires
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = impls.ssd_forward(**kw, backend=backend)
    for _ in range(5):
        captured.y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured.y, eager.y) and torch.equal(captured.final_states, eager.final_states)


def _triton_local_states(backend, inp, dt, dA):
    """The chunk-local states of the Triton backend's first fwd_pass_state kernel (fp32 scratch output)."""
    from impls.triton.fwd_pass_state import chunk_states

    return chunk_states(inp["B"], inp["x"], dt, dA, None, config=backend.describe()["stages"]["chunk_state"]["config"],
                        switches=backend.switches, empty=backend._empty, dot_precision=backend._dot_precision(inp["x"]))


@pytest.mark.heavy
def test_million_tokens(request):
    backend = _backend()
    errors = long_sequence_errors(backend, long_inputs(MILLION, "cuda", torch.bfloat16), MILLION_SAMPLED,
                                  local_states=lambda inp, dt, dA: _triton_local_states(backend, inp, dt, dA))
    tol = tolerance(torch.bfloat16)
    bad = {k: v for k, v in errors.items() if not v <= tol}
    print(f"[triton] million tokens: worst {max(errors, key=errors.get)}={max(errors.values()):.2e} "
          f"{backend.describe()['stages']}")
    assert not bad, f"over tolerance: {bad} (all: {errors})"
