"""The Triton backend's backward (impls/triton/backward/) under the Triton interpreter (CPU).

Every gradient through `impls.ssd` is judged by the gradient gate (harness/gradient_gate.py: float64 autograd
through the chunked reference as the truth, K × the same computation's error at the backend's precision as the
bound, block by block, every allocation NaN-poisoned before the kernels write) on fresh random inputs at tiny fp32
and fp16 shapes covering the contract: ngroups 1, 2 and 4 (heads sharing B and C), seqlen not a multiple of the chunk,
with and without z, D per head or per channel, dt_bias, softplus, dt_limit (binding on some tokens), initial states,
seq_idx (one batch row numbering its sequences from 1), cu_seqlens, fp32 states, dims that are not powers of two.
Then: the backward as the derivative of our own forward (central differences, fp32), a gradient from the final
states alone, determinism, saved vs recomputed states, switches, that the gate fails a backward a little off, and
that every kernel compiles for sm_90 at S1's blocks (the interpreter accepts programs the compiler rejects).
One initial state per packed sequence is refused before the backward, by the forward's own check.

bf16 runs on the GPU only (the interpreter's bf16 dots are wrong): tests/gpu/test_triton_backward.py. At these tiny
sizes the per-head sums (dA, dD, ddt_bias) sit closest to the gate: the same-precision computation's error is one
draw per head (at fp32, rounding noise), and at fp16 on (2, 40, 8, 16, 2, 16, 16) mamba-ssm's backward failed it on 3
of 8 seeds, ours on 4 (dA or ddt_bias each time); so the seeds are fixed.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

if "impls.triton" not in sys.modules:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import impls  # noqa: E402
from harness.calls import forward_arguments  # noqa: E402
from harness.gradient_gate import check_gradients, output_gradients  # noqa: E402
from impls.api import GRAD_INPUTS  # noqa: E402
from impls.inputs import make_inputs  # noqa: E402
from impls.problem import Problem, Shape  # noqa: E402
from impls.registry import get_backend  # noqa: E402
from impls.tolerance import poisoned_allocations, rel_err  # noqa: E402
from impls.triton.target import interpreting  # noqa: E402

pytestmark = pytest.mark.skipif(not interpreting(), reason="impls.triton was imported without TRITON_INTERPRET=1"
                                " (its kernels are compiled, not interpreted): run the CPU suite on its own")

HEADLINE = Problem(Shape(2, 40, 4, 16, 1, 16, 16), dtype="float32")  # softplus, dt_bias, D per head; 3 chunks
RICH = Problem(Shape(1, 70, 4, 16, 2, 16, 32), dtype="float32", has_z=True, D_per_channel=True,
               has_initial_states=True, nseqs=3)  # seq_idx, 70 = 2 chunks + 6
CASES = [
    pytest.param(HEADLINE, 2, id="headline-g1", marks=pytest.mark.quick),  # the quick tier
    pytest.param(RICH, 2, id="z-Dchannel-init-seq_idx-g2"),
    # chunk 32 over 16-wide tiles: the chunk kernel's row tiles below the diagonal of full chunks take the unmasked
    # path, the short last chunk (72 = 2 chunks + 8) and the diagonal the masked one
    pytest.param(Problem(Shape(1, 72, 4, 16, 1, 16, 32), dtype="float32"), 4, id="below-diagonal-tiles"),
    pytest.param(Problem(Shape(2, 50, 4, 16, 2, 16, 16), dtype="float32", has_initial_states=True, nseqs=3), 3,
                 id="seq_idx-per-row-init"),
    pytest.param(Problem(Shape(1, 70, 4, 16, 4, 16, 32), dtype="float32", has_z=True, has_initial_states=True,
                         nseqs=3, varlen=True), 2, id="cu_seqlens-init-z-g4"),
    # fp32 noise per head: over seeds 0-11, 2 fail dA or ddt_bias (1.1-1.4x) with dΛ_last's parts apart, 2 (1.1, 2.6x)
    # with it whole
    pytest.param(Problem(Shape(1, 40, 4, 16, 2, 16, 16), dtype="float32", dt_softplus=False, has_D=False,
                         dt_limit=(0.005, 0.05)), 3, id="limit-no-softplus-no-D"),
    pytest.param(Problem(Shape(1, 40, 4, 16, 1, 16, 16), dtype="float32", dt_limit=(0.0, 0.02)), 1,
                 id="softplus-limit-binding"),
    pytest.param(Problem(Shape(1, 37, 3, 12, 1, 10, 16), dtype="float32", has_z=True), 1, id="dims-not-pow2"),
    pytest.param(Problem(Shape(1, 40, 4, 16, 2, 16, 16), dtype="float32", state_dtype="float32",
                         has_initial_states=True, has_dt_bias=False), 3, id="fp32-states-no-bias"),
    pytest.param(dataclasses.replace(RICH, dtype="float16"), 1, id="fp16-z-Dchannel-init-seq_idx-g2"),
    pytest.param(Problem(Shape(2, 40, 8, 16, 2, 16, 16), dtype="float16", has_z=True, has_initial_states=True), 2,
                 id="fp16-z-init-g2"),
    # 8 chunks: dA and ddt_bias, sums over a head of terms that cancel, where dΛ_last's two parts must cancel to the
    # bit (impls/README.md, "The chunked backward", step 2); formed whole from the stored S_{c+1} they were 3.0x and
    # 1.7x their bounds here
    pytest.param(Problem(Shape(1, 128, 8, 16, 2, 16, 16), dtype="float16"), 0, id="fp16-8-chunks-g2"),
]


def expected_gradients(problem: Problem) -> set[str]:
    names = {"dx", "ddt", "dA", "dB", "dC"}
    names |= {f"d{n}" for n, on in (("D", problem.has_D), ("z", problem.has_z), ("dt_bias", problem.has_dt_bias),
                                    ("initial_states", problem.has_initial_states)) if on}
    return names


def assert_gate(backend, problem: Problem, seed: int) -> dict:
    report = check_gradients(backend, make_inputs(problem, seed=seed), problem.torch_dtype, seed=seed)
    assert set(report) == expected_gradients(problem), report
    failing = {name: (round(r["bound_ratio"], 3), r["where"]) for name, r in report.items() if not r["ok"]}
    assert not failing, failing
    return report


@pytest.mark.parametrize("problem, seed", CASES)
def test_every_gradient_passes_the_gate(problem, seed):
    assert_gate("triton", problem, seed)


@pytest.mark.parametrize("switches", [
    pytest.param({"exp2": False, "transposed_layout": False}, id="no-exp2-states-headdim-major"),
    pytest.param({"fuse_state_out": True, "tma": False, "bwd_recompute_states": True}, id="fused-forward-recompute"),
    pytest.param({"state_pass": "chunk_parallel", "tma": False}, id="chunk-parallel-stage-2"),
])
def test_switches_keep_the_gradients_in_the_gate(switches):
    assert_gate(get_backend("triton", **switches), RICH, 2)


BWD_CB_CASES = [
    pytest.param(RICH, 2, id="z-Dchannel-init-seq_idx-g2"),
    # chunk 32 over 16-wide tiles: the chunk kernel's row tiles below the diagonal of full chunks take the unmasked
    # path, the short last chunk (72 = 2 chunks + 8) and the diagonal the masked one
    pytest.param(Problem(Shape(1, 72, 4, 16, 1, 16, 32), dtype="float32"), 4, id="below-diagonal-tiles"),
    pytest.param(dataclasses.replace(RICH, dtype="float16"), 1, id="fp16-z-Dchannel-init-seq_idx-g2"),
    pytest.param(Problem(Shape(2, 40, 8, 16, 2, 16, 16), dtype="float16", has_z=True, has_initial_states=True), 2,
                 id="fp16-z-init-g2-4-heads-per-group"),
]


@pytest.mark.parametrize("problem, seed", BWD_CB_CASES)
def test_bwd_cb_shared_keeps_the_gradients_in_the_gate(problem, seed, monkeypatch):
    """Switch bwd_cb='shared': bwd_chunk loads the groups' C·Bᵀ from cb_kernel's buffer instead of forming it per
    head. Here the buffer's tiles are 16 × 16 and bwd_chunk's row tiles 32 high, so that at chunk 32 the first row
    tile of source tile 1 covers the tile above the diagonal, which stays unwritten (NaN under the gate's poisoned
    allocations): only its causal elements may be read."""
    from impls.triton import compute_out
    from impls.triton.backward import tune

    monkeypatch.setattr(compute_out, "CB_BLOCK", 16)
    monkeypatch.setitem(tune.FALLBACK["interpreter"], tune.CHUNK,
                        {**tune.FALLBACK["interpreter"][tune.CHUNK], "block_rows": 32})
    calls = []
    cb_matrix = compute_out.cb_matrix

    def counted(*args, **kwargs):
        calls.append(kwargs.get("lower"))
        return cb_matrix(*args, **kwargs)

    monkeypatch.setattr("impls.triton.backward.chunk.cb_matrix", counted)
    assert_gate(get_backend("triton", bwd_cb="shared"), problem, seed)
    assert calls == [True], calls  # once per backward, the lower triangle only


def test_bwd_cb_shared_reads_the_buffer(monkeypatch):
    """The same backward with the shared C·Bᵀ scaled by 1.01 fails the gate at dx: bwd_chunk reads it."""
    from impls.triton.backward import chunk

    cb_matrix = chunk.cb_matrix
    monkeypatch.setattr(chunk, "cb_matrix", lambda *a, **k: cb_matrix(*a, **k) * 1.01)
    report = check_gradients(get_backend("triton", bwd_cb="shared"), make_inputs(RICH, seed=2), torch.float32,
                             seed=2)
    assert not report["dx"]["ok"], report


def test_bwd_cb_enters_the_chunk_kernels_record_key_only():
    """'shared' changes bwd_chunk's code only: its record key, not the other kernels' (whose records it keeps)."""
    from impls.triton.backward import tune

    shape = Shape(1, 256, 4, 16, 1, 16, 64)
    keys = {v: {s: tune.record_key(get_backend("triton", bwd_cb=v).switches, shape, "float32", {}, s)
                for s in tune.STAGES} for v in ("inline", "shared")}
    assert [s for s in tune.STAGES if keys["inline"][s] != keys["shared"][s]] == [tune.CHUNK]
    assert "bwd_cb" not in keys["inline"][tune.CHUNK] and "shared" in keys["shared"][tune.CHUNK]


# switch bwd_state_split: the state pass's weighted dŷ as hi + lo operands into one fp32 accumulator
FP16_CARRY = Problem(Shape(2, 40, 8, 16, 2, 16, 16), dtype="float16", has_z=True, has_initial_states=True)


def test_bwd_state_split_takes_da_and_dinitial_states_well_inside_the_gate():
    """fp16, 3 chunks, seed 2: dA's carried term d_c ⟨R, S_c⟩ and dinitial_states read the carried R. With the
    weighted dŷ rounded once (off) dA sits at 0.97 of its bound and dinitial_states at 0.30; split, at 0.37 and 0."""
    ratios = {}
    for split in (True, False):
        report = check_gradients(get_backend("triton", bwd_state_split=split), make_inputs(FP16_CARRY, seed=2),
                                 torch.float16, seed=2)
        ratios[split] = {name: round(r["bound_ratio"], 3) for name, r in report.items()}
        assert split is False or all(r["ok"] for r in report.values()), ratios
    print("bwd_state_split on:", ratios[True], "off:", ratios[False])
    assert ratios[True]["dA"] < 0.6 * ratios[False]["dA"], ratios
    assert ratios[True]["dinitial_states"] < 0.5 * ratios[False]["dinitial_states"], ratios


def _launches_of(monkeypatch, *names: str) -> list[tuple]:
    """Every launch of the kernels named, as (name, grid, args, kwargs), from here on; each is still carried out."""
    from impls.triton import launcher

    seen = []
    launch = launcher.launch

    def recorded(kernel, grid, *args, **kwargs):
        if kernel.fn.__name__ in names:
            seen.append((kernel.fn.__name__, grid, args, kwargs))
        return launch(kernel, grid, *args, **kwargs)

    monkeypatch.setattr(launcher, "launch", recorded)
    return seen


def test_bwd_state_split_reaches_the_state_pass_kernel(monkeypatch):
    """The launch's SPLIT constexpr: on for 16-bit inputs by default, off with the switch off, off for fp32 inputs
    (whose operand is not rounded)."""
    seen = _launches_of(monkeypatch, "bwd_state_pass_kernel")
    for dtype, switches in (("float16", {}), ("float16", {"bwd_state_split": False}), ("float32", {})):
        inputs = make_inputs(Problem(Shape(1, 16, 2, 16, 1, 16, 16), dtype=dtype), seed=2)  # one chunk
        _triton_gradients(get_backend("triton", **switches), inputs, output_gradients(inputs, 2))
    assert [kwargs["SPLIT"] for *_, kwargs in seen] == [True, False, False], seen


def test_bwd_state_split_enters_the_state_pass_record_key_only_when_off():
    """Off changes bwd_state_pass's code: its record key (the defaults' keys, and the other kernels', unchanged)."""
    from impls.triton.backward import tune

    shape = Shape(1, 256, 4, 16, 1, 16, 64)
    keys = {v: {s: tune.record_key(get_backend("triton", bwd_state_split=v).switches, shape, "float16", {}, s)
                for s in tune.STAGES} for v in (True, False)}
    assert [s for s in tune.STAGES if keys[True][s] != keys[False][s]] == [tune.STATE_PASS]
    assert not any("bwd_state_split" in key for key in keys[True].values())
    assert "bwd_state_split=False" in keys[False][tune.STATE_PASS]


# switch bwd_group_split: each group's heads over k programs (partials summed without atomics); bwd_atomics: their
# dC and dB added atomically
GROUP_SPLIT_CASES = [
    pytest.param(HEADLINE, 2, {"bwd_group_split": 2}, id="group-split-2-of-4-heads"),
    pytest.param(Problem(Shape(1, 37, 3, 12, 1, 10, 16), dtype="float32", has_z=True), 1, {"bwd_group_split": 2},
                 id="group-split-2-of-3-heads-not-dividing"),
    pytest.param(Problem(Shape(1, 70, 8, 16, 2, 16, 32), dtype="float32", has_initial_states=True, nseqs=3,
                         varlen=True), 2, {"bwd_group_split": 8}, id="group-split-8-of-4-heads-cu_seqlens"),
    pytest.param(RICH, 2, {"bwd_group_split": 2, "bwd_atomics": True}, id="group-split-2-atomics-z-seq_idx-g2"),
]


@pytest.mark.parametrize("problem, seed, switches", GROUP_SPLIT_CASES)
def test_bwd_group_split_keeps_the_gradients_in_the_gate(problem, seed, switches):
    """k programs per group, heads [p·H/k, (p+1)·H/k) each: shares of 2 + 2, of 1 + 2 (3 heads), of 0 or 1 head
    (8 programs for 4 heads, the per-sequence states' term of dB added to the partials' sum), and atomic adds."""
    assert_gate(get_backend("triton", **switches), problem, seed)


# --- switch bwd_dcb_sources='chunk': the dcb kernel's row tile against the whole chunk of sources per head --------
DCB_SOURCES_CASES = [
    pytest.param(Problem(Shape(1, 72, 4, 16, 1, 16, 32), dtype="float32"), 4, {}, id="headline-short-last-chunk"),
    pytest.param(RICH, 2, {}, id="z-Dchannel-init-seq_idx-g2"),
    pytest.param(RICH, 2, {"bwd_group_split": 2, "bwd_atomics": True}, id="group-split-2-atomics-z-seq_idx-g2"),
    # chunk 64 over 16-row tiles: row tiles 0, 1 and 2–3 read the chunk's first 16, 32 and 64 sources
    pytest.param(Problem(Shape(1, 136, 4, 16, 1, 16, 64), dtype="float32"), 3, {}, id="three-source-widths"),
]


@pytest.mark.parametrize("problem, seed, switches", DCB_SOURCES_CASES)
def test_bwd_dcb_sources_chunk_keeps_the_gradients_in_the_gate(problem, seed, switches):
    """Row tiles of 16 against chunks of 32 (and 64) sources, each against the sources up to its causal width: the
    products above the diagonal masked, a short last chunk, seq_idx's other sequences masked, the entering states'
    term in the same head walk, the heads split."""
    assert_gate(get_backend("triton", bwd_dcb_sources="chunk", **switches), problem, seed)


# --- switch bwd_decay_factor: the decays of the row tiles below the diagonal as an outer product ------------------
@pytest.mark.parametrize("problem, seed, switches, factored", [
    # chunk 32 over 16-wide tiles: row tile 1 of source tile 0 lies below the diagonal of the two full chunks
    pytest.param(Problem(Shape(1, 72, 4, 16, 1, 16, 32), dtype="float32"), 4, {}, True, id="below-diagonal-tiles"),
    pytest.param(Problem(Shape(1, 72, 4, 16, 1, 16, 32), dtype="float32"), 4, {"bwd_cb": "shared"}, True,
                 id="below-diagonal-tiles-bwd_cb-shared"),
    pytest.param(RICH, 2, {}, False, id="z-Dchannel-init-seq_idx-g2"),
])
def test_bwd_decay_factor_keeps_the_gradients_in_the_gate_and_reaches_the_kernel(problem, seed, switches, factored):
    """Every gradient within the gate with the factored decays; dx not bit-for-bit the unfactored one where row tiles
    lie below the diagonal (the factored branch ran), the same bits with seq_idx (every tile masked)."""
    backends = [get_backend("triton", bwd_decay_factor=f, **switches) for f in (False, True)]
    assert_gate(backends[1], problem, seed)
    inputs = make_inputs(problem, seed=seed)
    grads_in = output_gradients(inputs, seed)
    dx = [_triton_gradients(b, inputs, grads_in)["x"] for b in backends]
    assert torch.equal(dx[0], dx[1]) != factored


def test_bwd_decay_factor_enters_the_chunk_kernels_record_key_only():
    from impls.triton.backward import tune

    shape = Shape(1, 256, 4, 16, 1, 16, 64)
    keys = {v: {s: tune.record_key(get_backend("triton", bwd_decay_factor=v).switches, shape, "float32", {}, s)
                for s in tune.STAGES} for v in (False, True)}
    assert [s for s in tune.STAGES if keys[False][s] != keys[True][s]] == [tune.CHUNK]


# --- switch bwd_entry_term: dΛ's entering-state term in the state pass or dcb instead of the chunk kernel -----------
@pytest.mark.parametrize("problem, seed, term, switches", [
    pytest.param(Problem(Shape(1, 72, 4, 16, 1, 16, 32), dtype="float32"), 4, "state_pass", {},
                 id="state_pass-short-last-chunk-g1"),
    pytest.param(RICH, 2, "state_pass", {}, id="state_pass-z-Dchannel-init-seq_idx-g2", marks=pytest.mark.slow),
    pytest.param(Problem(Shape(1, 72, 4, 16, 1, 16, 32), dtype="float32"), 4, "dcb", {}, id="dcb-short-last-chunk-g1"),
    pytest.param(RICH, 2, "dcb", {"bwd_dcb_sources": "chunk"}, id="dcb-chunk-sources-z-Dchannel-init-seq_idx-g2"),
    pytest.param(RICH, 2, "dcb", {"bwd_group_split": 2}, id="dcb-split2-z-Dchannel-init-seq_idx-g2",
                 marks=pytest.mark.slow),
])
def test_bwd_entry_term_away_from_the_chunk_kernel_keeps_the_gradients_in_the_gate(problem, seed, term, switches):
    """Every gradient within the gate with the term formed by the reverse state pass or the dcb kernel and added by the
    cumsum kernel; dt's gradient not bit-for-bit the chunk kernel's (the term summed in another order): the other
    kernel's branch ran."""
    backends = [get_backend("triton", bwd_entry_term=v, **switches) for v in ("chunk", term)]
    assert_gate(backends[1], problem, seed)
    inputs = make_inputs(problem, seed=seed)
    grads_in = output_gradients(inputs, seed)
    ddt = [_triton_gradients(b, inputs, grads_in)["dt"] for b in backends]
    assert not torch.equal(ddt[0], ddt[1])


def test_bwd_entry_term_enters_every_kernels_key_but_db():
    from impls.triton.backward import tune

    shape = Shape(1, 256, 4, 16, 1, 16, 64)
    keys = {v: {s: tune.record_key(get_backend("triton", bwd_entry_term=v).switches, shape, "float32", {}, s)
                for s in tune.STAGES} for v in ("chunk", "state_pass", "dcb")}
    for value in ("state_pass", "dcb"):
        assert [s for s in tune.STAGES if keys["chunk"][s] != keys[value][s]] == [
            tune.STATE_PASS, tune.CHUNK, tune.DCB, tune.CUMSUM], value


def test_bwd_group_split_launches_k_programs_per_group_into_partials(monkeypatch):
    """bwd_dcb and bwd_db launch k times the programs and write k fp32 partials per group (the partial buffers the
    host sums); under bwd_atomics one fp32 buffer per group, zeroed."""
    launches = _launches_of(monkeypatch, "bwd_dcb_kernel", "bwd_db_kernel")
    inputs = make_inputs(Problem(Shape(1, 32, 4, 16, 2, 16, 32), dtype="float32"), seed=2)  # one chunk, 2 groups
    for switches in ({}, {"bwd_group_split": 4}, {"bwd_group_split": 4, "bwd_atomics": True}):
        _triton_gradients(get_backend("triton", **switches), inputs, output_gradients(inputs, 2))
    outputs = [args[9] if name == "bwd_dcb_kernel" else args[8] for name, _, args, _ in launches]
    seen = [(name, grid[0], tuple(out.shape), out.dtype, kwargs["SPLIT"], kwargs["ATOMIC"])
            for (name, grid, _, kwargs), out in zip(launches, outputs)]
    programs, f32 = (32 // 16) * 2, torch.float32  # 2 row or source tiles of 16 per chunk of 32, 2 groups
    assert seen == [("bwd_dcb_kernel", programs, (1, 32, 2, 16), f32, 1, False),  # dC itself (fp32 inputs)
                    ("bwd_db_kernel", programs, (1, 32, 2, 16), f32, 1, False),
                    ("bwd_dcb_kernel", programs * 4, (1, 32, 2 * 4, 16), f32, 4, False),
                    ("bwd_db_kernel", programs * 4, (1, 32, 2 * 4, 16), f32, 4, False),
                    ("bwd_dcb_kernel", programs * 4, (1, 32, 2, 16), f32, 4, True),
                    ("bwd_db_kernel", programs * 4, (1, 32, 2, 16), f32, 4, True)], seen


def test_bwd_group_split_sums_every_partial():
    """The same backward with the last partial of each group dropped from the sum fails the gate at dC and dB."""
    from impls import chunked_backward

    def dropping(parts, ngroups, extra, dtype):
        kept = parts.unflatten(2, (ngroups, -1))[:, :, :, :-1].flatten(2, 3)
        return sum_partials(kept, ngroups, extra, dtype)

    sum_partials = chunked_backward.sum_partials
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("impls.triton.backward.dcb.sum_partials", dropping)
        mp.setattr("impls.triton.backward.db.sum_partials", dropping)
        report = check_gradients(get_backend("triton", bwd_group_split=2), make_inputs(RICH, seed=2), torch.float32,
                                 seed=2)
    assert not report["dC"]["ok"] and not report["dB"]["ok"], report


def test_bwd_atomics_without_a_split_is_refused_naming_both_switches():
    with pytest.raises(ValueError, match="bwd_atomics.*bwd_group_split=1"):
        get_backend("triton", bwd_atomics=True)


def test_bwd_group_split_enters_the_per_group_kernels_record_keys_only():
    """bwd_group_split and bwd_atomics change bwd_dcb's and bwd_db's code: their record keys, not the other kernels'
    (whose records they keep); the defaults' keys name neither."""
    from impls.triton.backward import tune

    shape = Shape(1, 256, 4, 16, 1, 16, 64)
    keys = [{s: tune.record_key(get_backend("triton", **sw).switches, shape, "float32", {}, s) for s in tune.STAGES}
            for sw in ({}, {"bwd_group_split": 4}, {"bwd_group_split": 4, "bwd_atomics": True})]
    for away in keys[1:]:
        assert [s for s in tune.STAGES if keys[0][s] != away[s]] == [tune.DCB, tune.DB]
    assert len({k[tune.DCB] for k in keys}) == 3
    assert not any("bwd_group_split" in key or "bwd_atomics" in key for key in keys[0].values())


def _leaves(kw: dict) -> dict:
    return {name: kw[name].detach().clone().requires_grad_() for name in GRAD_INPUTS if kw.get(name) is not None}


def _triton_gradients(backend, inputs, grads_in) -> dict:
    kw = forward_arguments(inputs)
    leaves = _leaves(kw)
    with poisoned_allocations():
        out = impls.ssd(**{**kw, **leaves}, backend=backend)
        found = torch.autograd.grad([out.y, out.final_states], list(leaves.values()),
                                    [grads_in["y"].to(out.y.dtype), grads_in["final_states"].to(torch.float32)])
    return dict(zip(leaves, found))


def test_the_backward_is_the_derivative_of_our_forward():
    """⟨grad, v⟩ against (f(a + εv) − f(a − εv)) / 2ε for f = ⟨dy, y⟩ + ⟨dS, final states⟩ of the Triton forward
    itself, one random direction v per input (fp32; no clamp, whose kink central differences straddle)."""
    problem = dataclasses.replace(RICH, nseqs=2)
    inputs = make_inputs(problem, seed=11)
    grads_in = output_gradients(inputs, 11)
    found = _triton_gradients("triton", inputs, grads_in)
    kw = forward_arguments(inputs)
    gen = torch.Generator().manual_seed(12)

    def f(**changed) -> float:
        out = impls.ssd_forward(**{**kw, **changed}, backend="triton")
        return float((out.y.double() * grads_in["y"]).sum()
                     + (out.final_states.double() * grads_in["final_states"]).sum())

    for name, grad in found.items():
        base = kw[name]
        v = torch.randn(base.shape, generator=gen, dtype=torch.float64)
        eps = 1e-2 * float(base.double().abs().mean()) / float(v.abs().mean())
        plus = f(**{name: (base.double() + eps * v).to(base.dtype)})
        minus = f(**{name: (base.double() - eps * v).to(base.dtype)})
        numeric = (plus - minus) / (2 * eps)
        analytic = float((grad.double() * v).sum())
        assert abs(numeric - analytic) <= 2e-3 * max(abs(analytic), 1e-2 * grad.double().norm().item()), \
            (name, numeric, analytic)


def test_a_gradient_from_the_final_states_alone():
    """y unused: dx from the state path alone (the reverse pass's carry; the chunk kernel with dy = 0)."""
    inputs = make_inputs(RICH, seed=3)
    kw = forward_arguments(inputs)
    x = kw["x"].detach().clone().requires_grad_()
    with poisoned_allocations():
        (dx,) = torch.autograd.grad(impls.ssd(**{**kw, "x": x}, backend="triton").final_states.sum(), [x])
    ref = forward_arguments(inputs.to(dtype=torch.float64))
    ref["state_dtype"] = torch.float64
    x64 = ref["x"].detach().clone().requires_grad_()
    (expected,) = torch.autograd.grad(impls.ssd(**{**ref, "x": x64}).final_states.sum(), [x64])
    assert rel_err(dx, expected) < 1e-5


@pytest.mark.parametrize("changed", ["x", "seq_idx"])
def test_a_backward_after_an_input_changed_in_place_raises(changed):
    """The backward's kernels read x, B, C, dt, z, seq_idx, ... when they run: an input changed in place after the
    forward (here x doubled, or seq_idx cut to one sequence) raises, naming it; it used to give the gradients at the
    new values, silently (dB and dD 50 % off with x doubled)."""
    problem = Problem(Shape(1, 32, 2, 16, 1, 16, 16), dtype="float32", nseqs=2)
    kw = forward_arguments(make_inputs(problem, seed=1))
    leaves = _leaves(kw)
    x = leaves["x"] * 1.0  # a non-leaf input, as a layer's x is
    out = impls.ssd(**{**kw, **leaves, "x": x}, backend="triton")
    with torch.no_grad():
        (x if changed == "x" else kw["seq_idx"]).mul_(2 if changed == "x" else 0)
    with pytest.raises(RuntimeError, match=f"impls.ssd: {changed} was modified by an inplace operation"):
        torch.autograd.grad(out.y.sum(), [leaves["B"], leaves["D"]])


def test_two_calls_under_bwd_group_split_give_the_same_bits():
    """The split's partials are summed without atomics: two calls give the same bits (not so under bwd_atomics,
    whose order of adds is the GPU's: tests/gpu/test_triton_backward.py)."""
    inputs = make_inputs(HEADLINE, seed=5)
    grads_in = output_gradients(inputs, 5)
    backend = get_backend("triton", bwd_group_split=2)
    first, again = (_triton_gradients(backend, inputs, grads_in) for _ in range(2))
    for name, grad in first.items():
        assert torch.equal(grad, again[name]), name


def test_two_calls_and_saved_or_recomputed_states_give_the_same_bits():
    """Every reduction is partials summed in a fixed order; switch bwd_recompute_states recomputes with the same
    stage-2 kernel the forward ran, so the gradients are the same bits."""
    inputs = make_inputs(RICH, seed=5)
    grads_in = output_gradients(inputs, 5)
    first = _triton_gradients("triton", inputs, grads_in)
    again = _triton_gradients("triton", inputs, grads_in)
    recomputed = _triton_gradients(get_backend("triton", bwd_recompute_states=True), inputs, grads_in)
    for name, grad in first.items():
        assert torch.equal(grad, again[name]), name
        assert torch.equal(grad, recomputed[name]), name


def test_the_backward_kernels_report_their_launch_configurations():
    backend = get_backend("triton")
    _triton_gradients(backend, make_inputs(HEADLINE, seed=0), output_gradients(make_inputs(HEADLINE, seed=0)))
    stages = backend.describe()["stages"]
    assert {"bwd_state_pass", "bwd_chunk", "bwd_dcb", "bwd_db", "bwd_cumsum"} <= set(stages)
    assert stages["bwd_chunk"]["source"] == "fallback" and stages["bwd_chunk"]["config"]["block_sources"] == 16
    assert "reverse" in backend.BACKWARD and "no atomics" in backend.BACKWARD


@pytest.mark.parametrize("term", ["chunk", pytest.param("state_pass", marks=pytest.mark.slow),
                                  pytest.param("dcb", marks=pytest.mark.slow)])
def test_the_backward_search_keeps_configs_whose_buffers_are_written_in_part_by_design(monkeypatch, tmp_path, term):
    # (the entering-state terms' masking itself: tests/harness/test_tuning.py, written_elements)
    """The gate NaN-poisons every allocation, as a GPU's allocator may leave NaN in a reused block: the chunk kernel's
    row-sum partials above each source tile and past a short last chunk, dcb's d(C·Bᵀ) above the diagonal and the
    entering-state terms past the sequence (switch bwd_entry_term) stay unwritten by design, and the search must not
    take them for a miscompiled config (on an H100 every bwd_chunk config was refused so, the search failing)."""
    monkeypatch.setenv("SSD_TUNING_DIR", str(tmp_path))
    backend = get_backend("triton", tuning="search", bwd_entry_term=term)
    # 40 = one chunk of 32 + 8: two source tiles of 16 (the interpreter's tiles), dcb's tiles above the diagonal
    assert_gate(backend, Problem(Shape(1, 40, 2, 16, 1, 16, 32), dtype="float32"), 2)
    stages = backend.describe()["stages"]
    assert {stages[s]["source"] for s in ("bwd_state_pass", "bwd_chunk", "bwd_dcb", "bwd_db", "bwd_cumsum")} == {
        "search"}, stages


def test_the_gate_fails_a_backward_off_by_a_little():
    """The cases above can fail: the same backward with dB of one group scaled by 1.01 fails the gate at dB."""
    from impls.triton.backward import run

    class Spoiled(type(get_backend("triton"))):
        def forward_for_backward(self, args, needs):
            found = run.forward_for_backward(self, args, needs)
            inner = found.backward

            def backward(grads):
                out = inner(grads)
                out["B"][:, :, 1] *= 1.01
                return out

            found.backward = backward
            return found

    backend = Spoiled(get_backend("triton").switches)
    report = check_gradients(backend, make_inputs(RICH, seed=2), torch.float32, seed=2)
    assert not report["dB"]["ok"] and all(r["ok"] for name, r in report.items() if name != "dB"), report



def test_the_backward_kernels_compile_for_sm90():
    """bf16 at S1's blocks with the GPU fallback tiles, through ptxas for sm_90 (tests/backends/triton_backward_sm90.py,
    in a process without TRITON_INTERPRET); shared memory within a block's limit."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-m", "tests.backends.triton_backward_sm90"], capture_output=True,
                            text=True, env=env, cwd=Path(__file__).resolve().parents[2], timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    # bwd_chunk with bwd_cb 'inline' and 'shared' (and the C·Bᵀ kernel's lower triangle it reads) and with
    # bwd_decay_factor, bwd_dcb and bwd_db with bwd_group_split 1 and 4, bwd_dcb with bwd_dcb_sources 'chunk',
    # bwd_state_pass with bwd_state_split on and off, bwd_state_pass and bwd_chunk with bwd_entry_term 'state_pass',
    # bwd_dcb with 'dcb'
    assert result.stdout.count("ok  ") == 15, result.stdout
    wgmma = [int(line.split("wgmma=")[1].split()[0]) for line in result.stdout.splitlines()
             if " bwd_state_pass_kernel " in line]
    # the split's second dot (on, off), then the entering state's term's dot (bwd_entry_term 'state_pass')
    assert len(wgmma) == 3 and wgmma[0] > wgmma[1] > 0 and wgmma[2] > wgmma[0], result.stdout
