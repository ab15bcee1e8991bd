"""The backward's contract on CPU: `impls.ssd` (the differentiable twin of ssd_forward), its ground truth (float64
autograd through the chunked reference, checked against the sequential definition's autograd), and the gradient
gate (harness/gradient_gate.py) passing correct backwards and failing planted gradient faults."""

from __future__ import annotations

import dataclasses
import gc
import weakref

import pytest
import torch

import impls
from harness.calls import forward_arguments
from harness.gradient_gate import check_gradients, ground_truth, output_gradients, reference_gradients
from impls.inputs import make_inputs
from impls.problem import Problem, Shape
from impls.reference import ssd_sequential
from impls.reference.backend import ReferenceBackend
from impls.reference.sampled_backward import sampled_gradients
from impls.registry import Backend, BackendUnavailable
from impls.tolerance import SAME_PRECISION_K, rel_err
from tests.faults import GRADIENT_FAULTS, CorrectBf16Backward

TINY = Problem(Shape(2, 40, 4, 8, 2, 8, 16), dtype="float64", has_initial_states=True, has_z=True)


def _kwargs(inputs, requires_grad=True) -> dict:
    kw = forward_arguments(inputs)
    if requires_grad:
        for name in impls.api.GRAD_INPUTS:
            if kw.get(name) is not None:
                kw[name] = kw[name].clone().requires_grad_()
    return kw


def test_ground_truth_matches_the_sequential_definitions_autograd():
    inputs = make_inputs(dataclasses.replace(TINY, dt_softplus=True, has_dt_bias=True), seed=3)
    grads_in = output_gradients(inputs)
    truth = reference_gradients(inputs, grads_in)
    kw = _kwargs(inputs.to(dtype=torch.float64))
    names = [n for n in impls.api.GRAD_INPUTS if kw.get(n) is not None]
    seq_kw = {k: v for k, v in kw.items() if k not in ("chunk_size", "state_dtype")}
    seq = ssd_sequential(**seq_kw)
    found = torch.autograd.grad([seq.y, seq.final_states], [kw[n] for n in names],
                                [grads_in["y"], grads_in["final_states"]])
    errors = {n: rel_err(truth[f"d{n}"], g) for n, g in zip(names, found)}
    assert set(errors) >= {"x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states"}
    assert max(errors.values()) < 1e-10, errors


def test_the_ground_truth_row_by_row_is_the_whole_batchs():
    from harness.gradient_gate import _gradients

    inputs = make_inputs(dataclasses.replace(TINY, dt_softplus=True, has_dt_bias=True), seed=4)
    grads_in = output_gradients(inputs)
    kw = forward_arguments(inputs.to(dtype=torch.float64))
    whole = _gradients(lambda **a: impls.ssd(**a, backend="reference"), kw, grads_in)
    rows = reference_gradients(inputs, grads_in)
    assert {k for k, g in rows.items() if g is not None} == {k for k, g in whole.items() if g is not None}
    assert max(rel_err(rows[k], g) for k, g in whole.items() if g is not None) < 1e-13


@pytest.mark.parametrize("shape, change", [
    pytest.param({}, {}, id="batch-rows"),
    pytest.param({"batch": 1}, {"varlen": True, "nseqs": 3}, id="packed"),
    pytest.param({"seqlen": 45}, {}, id="short-last-chunk"),
])
def test_da_terms_kept_by_the_ground_truth_sum_to_da(shape, change):
    """The terms the gate floors dA by (harness/gradient_gate.py DecayTerms): per head their sum over batch and
    time is the ground truth's dA."""
    problem = dataclasses.replace(TINY, shape=dataclasses.replace(TINY.shape, **shape), dt_softplus=True,
                                  has_dt_bias=True, **change)
    inputs = make_inputs(problem, seed=6)
    truth = ground_truth(inputs, output_gradients(inputs))
    terms = truth.terms["dA"]
    assert terms.shape[:2] == (inputs.x.shape[0], inputs.x.shape[2])
    assert rel_err(terms.sum(dim=(0, 2, 3)), truth.grads["dA"]) < 1e-12
    assert terms.abs().amin(dim=(0, 2, 3)).lt(terms.abs().amax(dim=(0, 2, 3))).all()  # per position, not per head


def test_ssd_gradcheck_on_the_reference():
    inputs = make_inputs(Problem(Shape(1, 40, 2, 4, 1, 4, 16), dtype="float64", has_initial_states=True), seed=0)
    kw = _kwargs(inputs)

    def outputs(x, dt, A, B, C, initial_states):
        out = impls.ssd(**{**kw, "x": x, "dt": dt, "A": A, "B": B, "C": C, "initial_states": initial_states})
        return out.y, out.final_states

    assert torch.autograd.gradcheck(outputs, tuple(kw[n] for n in ("x", "dt", "A", "B", "C", "initial_states")),
                                    fast_mode=True)


def test_ssd_without_gradients_is_ssd_forward_and_keeps_nothing():
    inputs = make_inputs(TINY, seed=1)
    kw = _kwargs(inputs)
    with torch.no_grad():
        out = impls.ssd(**kw)
    assert out.y.grad_fn is None and out.final_states.grad_fn is None
    assert torch.equal(out.y, impls.ssd_forward(**_kwargs(inputs, requires_grad=False)).y)


def test_a_backwarded_graph_is_freed():
    """The autograd node keeps its outputs as saved tensors, not in ctx: kept there they formed a cycle through C++
    that gc cannot free, and a training loop kept every step's graph (and its activations) alive."""
    kw = _kwargs(make_inputs(TINY, seed=1))
    out = impls.ssd(**kw)
    run = weakref.ref(out.y.grad_fn.run)
    (out.y.sum() + out.final_states.sum()).backward()
    del out
    gc.collect()
    assert run() is None


class _ForwardOnly(ReferenceBackend):
    """The reference's forward claiming kernels without autograd and without a backward (what our kernels were)."""

    DIFFERENTIABLE = False
    forward_for_backward = Backend.forward_for_backward


def test_ssd_forward_on_inputs_requiring_grad_names_impls_ssd():
    kw = _kwargs(make_inputs(TINY, seed=1))
    with pytest.raises(RuntimeError, match=r"x, dt, A, B, C, D, z, dt_bias, initial_states require grad.*impls\.ssd"):
        impls.ssd_forward(**kw, backend=_ForwardOnly())
    with torch.no_grad():
        impls.ssd_forward(**kw, backend=_ForwardOnly())  # no gradients wanted: runs


def test_a_backend_without_a_backward_raises_naming_itself():
    kw = _kwargs(make_inputs(TINY, seed=1))
    with pytest.raises(BackendUnavailable, match="backend 'reference' has no backward: its kernels are forward only"):
        impls.ssd(**kw, backend=_ForwardOnly())


def test_final_states_gradient_flows_alone():
    """Only d final_states flowing in (y unused): dx comes from the state path alone, as float64 autograd says."""
    inputs = make_inputs(TINY, seed=2)
    kw = _kwargs(inputs)
    out = impls.ssd(**kw)
    (dx,) = torch.autograd.grad(out.final_states.sum(), [kw["x"]])
    ref_kw = _kwargs(inputs)
    seq = ssd_sequential(**{k: v for k, v in ref_kw.items() if k not in ("chunk_size", "state_dtype")})
    (expected,) = torch.autograd.grad(seq.final_states.sum(), [ref_kw["x"]])
    assert rel_err(dx, expected) < 1e-10


@pytest.mark.parametrize("changed", ["dt", "B", "seq_idx"])
def test_a_backward_after_an_input_changed_in_place_raises(changed):
    """The backward reads the inputs again (our kernels' backwards read x, dt, z, ... as they are when it runs): one
    changed in place after the forward raises, naming it, as torch's ops do for what they save, instead of giving
    the gradients at the new values (tests/backends/test_triton_backward.py shows those on our Triton)."""
    kw = _kwargs(make_inputs(dataclasses.replace(TINY, nseqs=2), seed=1))
    out = impls.ssd(**kw)
    with torch.no_grad():
        kw[changed].mul_(2)
    with pytest.raises(RuntimeError, match=f"impls.ssd: {changed} was modified by an inplace operation after"):
        out.y.sum().backward()


# --- the gradient gate ----------------------------------------------------------------------------------------
def test_gate_passes_the_reference_at_its_own_precision():
    problem = Problem(Shape(2, 48, 4, 16, 2, 16, 16), dtype="bfloat16", has_initial_states=True, has_z=True,
                      dt_softplus=True, has_dt_bias=True)
    report = check_gradients("reference", make_inputs(problem, seed=1), torch.bfloat16)
    assert set(report) == {"dx", "ddt", "dA", "dB", "dC", "dD", "dz", "ddt_bias", "dinitial_states"}
    assert all(r["ok"] for r in report.values()), report


# S1's block sizes (chunk 256 x headdim 64, dstate 128), three packed sequences with one initial state each, bf16
S1_BLOCKS = Problem(Shape(batch=1, seqlen=1024, nheads=4, headdim=64, ngroups=1, dstate=128, chunk_size=256),
                    dtype="bfloat16", has_initial_states=True, initial_states_per_sequence=True, nseqs=3, varlen=True)


@pytest.fixture(scope="module")
def s1_blocks():
    inputs = make_inputs(S1_BLOCKS, seed=4)
    return inputs, ground_truth(inputs, output_gradients(inputs))


def test_a_correct_bf16_backward_passes_with_room(s1_blocks):
    inputs, truth = s1_blocks
    report = check_gradients(CorrectBf16Backward(), inputs, torch.bfloat16, truth=truth)
    assert all(r["ok"] for r in report.values()), report
    assert max(r["bound_ratio"] for r in report.values()) <= 1.05 / SAME_PRECISION_K, report


@pytest.mark.parametrize("fault, spoiled", [
    pytest.param("one-heads-share-of-dB-dropped", "dB", id="dB-one-head-dropped"),
    pytest.param("one-chunk-of-one-heads-dx-x1.02", "dx", id="dx-one-chunk-x1.02"),
    pytest.param("one-sequences-dinitial_states-x1.05", "dinitial_states", id="dinitial-one-sequence-x1.05"),
    pytest.param("one-chunk-of-one-heads-dA-dropped", "dA", id="dA-one-chunk-of-one-head-dropped"),
    pytest.param("one-chunk-of-one-heads-dD-dropped", "dD", id="dD-one-chunk-of-one-head-dropped"),
])
def test_gradient_fault_fails_the_gate(fault, spoiled, s1_blocks):
    inputs, truth = s1_blocks
    report = check_gradients(GRADIENT_FAULTS[fault](), inputs, torch.bfloat16, truth=truth)
    assert not report[spoiled]["ok"], report[spoiled]
    assert all(r["ok"] for name, r in report.items() if name != spoiled), report


# --- the streamed ground truth (problems whose float64 graph does not fit: the 2^20-token problem) --------------
@pytest.mark.parametrize("group", [1, 2, 8], ids=lambda g: f"{g}-chunks-a-piece")
def test_streamed_gradients_equal_the_whole_graphs(group):
    problem = Problem(Shape(2, 75, 4, 8, 2, 6, 16), dtype="float64", has_initial_states=True, has_z=True,
                      has_D=True, dt_softplus=True, has_dt_bias=True)
    inputs = make_inputs(problem, seed=5)
    grads_in = output_gradients(inputs)
    whole = ground_truth(inputs, grads_in)
    truth = whole.grads
    streamed = sampled_gradients(**forward_arguments(inputs), dy=grads_in["y"],
                                 dfinal_states=grads_in["final_states"], chunks=(0, 2, 4), group=group)
    assert set(streamed.grads) == {name for name, g in truth.items() if g is not None}
    errors = {name: rel_err(g, streamed.pick(name, truth[name])) for name, g in streamed.grads.items()}
    assert max(errors.values()) < 1e-12, errors
    # dA's terms, kept piece by piece: the same norm per head as the whole graph's (the streamed gate's dA floor)
    assert rel_err(streamed.terms_norm["dA"], whole.terms["dA"].square().sum(dim=(0, 2, 3)).sqrt()) < 1e-12


STREAMED = Problem(Shape(batch=2, seqlen=1000, nheads=4, headdim=64, ngroups=1, dstate=128, chunk_size=256),
                   dtype="bfloat16", has_initial_states=True)


@pytest.mark.parametrize("fault, spoiled", [
    pytest.param(None, None, id="correct"),
    pytest.param("one-heads-share-of-dB-dropped", "dB", id="dB-one-head-dropped"),
    pytest.param("one-sequences-dinitial_states-x1.05", "dinitial_states", id="dinitial-one-row-x1.05"),
    pytest.param("one-chunk-of-one-heads-dA-dropped", "dA", id="dA-one-chunk-of-one-head-dropped"),
])
def test_streamed_gate_passes_a_correct_backward_and_fails_a_spoiled_gradient(fault, spoiled):
    backend = CorrectBf16Backward() if fault is None else GRADIENT_FAULTS[fault]()
    report = check_gradients(backend, make_inputs(STREAMED, seed=6), torch.bfloat16, reference="sampled")
    assert set(report) == {"dx", "ddt", "dA", "dB", "dC", "dD", "ddt_bias", "dinitial_states"}
    assert all(r["ok"] for name, r in report.items() if name != spoiled), report
    if spoiled is not None:
        assert not report[spoiled]["ok"], report[spoiled]


# --- the peers' backwards: what they refuse, with the reason ---------------------------------------------------
@pytest.mark.parametrize("backend, words", [
    pytest.param("vllm", "vLLM is an inference engine", id="vllm"),
    pytest.param("fla", "FLA #640", id="fla-hopper-refusal"),
])
def test_peers_without_a_backward_say_why(backend, words):
    from impls.registry import backend_class

    cls = backend_class(backend)
    with pytest.raises(BackendUnavailable, match=f"backend '{backend}' has no backward: .*{words}"):
        cls.forward_for_backward(cls.__new__(cls), {}, {})


@pytest.mark.parametrize("change, words", [
    pytest.param({"z": torch.ones(1)}, "no z gate", id="z"),
    pytest.param({"D": torch.ones(2, 2)}, "per-head D only", id="D-per-channel"),
    pytest.param({"state_dtype": torch.float32}, "no state_dtype", id="state_dtype"),
])
def test_tilegyms_backward_refuses_what_it_has_no_gradient_for(change, words):
    from impls.tilegym.backward import forward_for_backward

    args = {"z": None, "D": None, "state_dtype": None, **change}
    with pytest.raises(BackendUnavailable, match=f"'tilegym' has no backward for this call: .*{words}"):
        forward_for_backward(None, args, {})


class _TiledSkipSums(ReferenceBackend):
    """The reference's backward with dD summed as our kernels sum it: fp32 sums of dŷ ⊙ x over tiles of 16 positions,
    the tiles' partials (and a per-head D's channels) added in float64. A correct fp32 backward in another order."""

    def forward_for_backward(self, args, needs):
        run = super().forward_for_backward(args, needs)
        backward = run.backward

        def tiled(grads_in):
            grads = backward(grads_in)
            x, z, D = args["x"].float(), args["z"], args["D"]
            dyh = grads_in["y"].float() * (1.0 if z is None else z.float() * torch.sigmoid(z.float()))
            prod = torch.nn.functional.pad(dyh * x, (0, 0, 0, 0, 0, -x.shape[1] % 16))
            parts = prod.unflatten(1, (-1, 16)).sum(dim=2).double().sum(dim=(0, 1))  # (nheads, headdim)
            grads["D"] = (parts if D.dim() == 2 else parts.sum(dim=-1)).to(D.dtype)
            return grads

        run.backward = tiled
        return run


@pytest.mark.parametrize("problem, seed", [
    pytest.param(Problem(Shape(1, 40, 8, 16, 8, 16, 16), dtype="float32"), 3, id="D-per-head-h8-g8"),
    pytest.param(Problem(Shape(2, 20, 2, 32, 1, 32, 128), dtype="float32"), 2, id="D-per-head-short-chunk"),
    pytest.param(Problem(Shape(1, 40, 4, 16, 2, 16, 16), dtype="float32", D_per_channel=True, has_z=True), 0,
                 id="D-per-channel-z"),
])
def test_a_correct_dd_summed_in_another_order_passes(problem, seed):
    """dD of a head is a sum over batch, time and headdim whose terms cancel: the same-precision computation's sum
    (torch's) can land near the truth by chance, and without a floor of fp32's unit roundoff times its terms' norm
    this tiled fp32 sum failed on the first two (1.07x and 1.9x its bound; our Triton's and, emulated, cuTile's dD
    1.07x and 3.55x there, by fp32 summation alone). A dropped chunk still fails
    (test_gradient_fault_fails_the_gate)."""
    report = check_gradients(_TiledSkipSums(), make_inputs(problem, seed=seed), torch.float32, seed=seed)
    assert report["dD"]["ok"], report["dD"]
    assert all(r["ok"] for r in report.values()), report


def test_the_reference_passes_its_own_gate_at_one_token():
    """seqlen 1 (cu_seqlens (0, 1)), fp32: ddt's blocks are one element each, and the same-precision computation's
    error of head 2 fell far below one rounding by chance (1e-8 relative), which the reference's own fp32 ddt (1.3
    roundings off) could not match: 1.25x its bound. Floored at fp32's unit roundoff, it passes."""
    problem = Problem(Shape(1, 1, 4, 16, 1, 16, 16), dtype="float32", nseqs=1, varlen=True)
    report = check_gradients("reference", make_inputs(problem, seed=3), torch.float32, seed=3)
    assert all(r["ok"] for r in report.values()), report


def test_a_summed_gradient_is_held_to_its_terms_error_not_less():
    """ddt_bias of a head is a sum of ddt over batch and time: where the terms nearly cancel, an error the size of
    the terms' own rounding (relative error × their norm) passes; ten times it fails."""
    from harness.gradient_gate import Truth, sum_floor
    from impls.tolerance import judge

    gen = torch.Generator().manual_seed(0)
    terms = torch.randn(2, 512, 4, generator=gen, dtype=torch.float64)
    terms[:, :, 2] -= terms[:, :, 2].mean()  # head 2's sum cancels to ~0
    truth = Truth({"ddt": terms, "ddt_bias": terms.sum(dim=(0, 1))}, {})
    same = Truth({"ddt": terms * (1 + 1e-3 * torch.randn(terms.shape, generator=gen, dtype=torch.float64)),
                  "ddt_bias": truth.grads["ddt_bias"].clone()}, {})  # exact sums: no block error of its own to scale
    floor = sum_floor("ddt_bias", truth, same)
    allowed = floor[2].item()
    exact, rounded = truth.grads["ddt_bias"], same.grads["ddt_bias"]
    for scale, passes in ((2.0, True), (10.0 * SAME_PRECISION_K, False)):
        got = exact.clone()
        got[2] += scale * allowed
        assert judge(got, exact, rounded, (1,), floor=floor).ok is passes, scale
    got = exact.clone()
    got[2] += 2.0 * allowed
    assert not judge(got, exact, rounded, (1,)).ok  # without the floor: held to exactness
