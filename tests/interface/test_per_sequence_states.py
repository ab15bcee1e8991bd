"""One initial state per packed sequence (initial_states (nseqs, ...) with cu_seqlens): the chunked reference against
the sequential definition (forward and gradients), the argument checks, and the backends that refuse it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import impls
from harness.calls import forward_arguments
from harness.gradient_gate import output_gradients, reference_gradients
from impls.api import GRAD_INPUTS
from impls.inputs import make_inputs
from impls.problem import Problem, Shape
from impls.reference import ssd_sequential
from impls.registry import BackendUnavailable
from impls.tolerance import rel_err

PACKED = Problem(Shape(1, 100, 4, 8, 2, 8, 16), dtype="float64", has_initial_states=True,
                 initial_states_per_sequence=True, nseqs=5, varlen=True, has_z=True)


def _kwargs(inputs) -> dict:
    return forward_arguments(inputs)


def _sequential(kw):
    return ssd_sequential(**{k: v for k, v in kw.items() if k not in ("chunk_size", "state_dtype")},
                          chunk_size=kw["chunk_size"])


def _hand_made(cu_seqlens: list[int]) -> dict:
    """PACKED's inputs re-cut at `cu_seqlens` (empty sequences and chunk-boundary starts allowed)."""
    kw = _kwargs(make_inputs(PACKED, seed=0))
    kw["cu_seqlens"] = torch.tensor(cu_seqlens, dtype=torch.int32)
    kw["seq_idx"] = impls.seq_idx_from_cu_seqlens(kw["cu_seqlens"], kw["x"].shape[1])
    kw["initial_states"] = torch.randn(len(cu_seqlens) - 1, *kw["initial_states"].shape[1:], dtype=torch.float64)
    return kw


@pytest.mark.parametrize("kw", [
    pytest.param(lambda s=s: _kwargs(make_inputs(PACKED, seed=s)), id=f"random-cuts-seed{s}") for s in range(3)
] + [
    pytest.param(lambda: _hand_made([0, 16, 16, 40, 47, 100]), id="empty-sequence-and-chunk-boundary-start"),
    pytest.param(lambda: _hand_made([0, 3, 100]), id="second-sequence-spans-every-chunk"),
])
def test_chunked_matches_the_definition(kw):
    kw = kw()
    out, seq = impls.ssd_forward(**kw), _sequential(kw)
    errors = {"y": rel_err(out.y, seq.y), "final_states": rel_err(out.final_states, seq.final_states),
              "varlen_states": rel_err(out.varlen_states, seq.varlen_states),
              "states": rel_err(out.states, seq.chunk_states)}
    assert max(errors.values()) < 1e-12, errors


def test_every_sequence_starts_from_its_own_state():
    """Not the row's initial state applied to sequence 0 only: changing sequence 2's initial state changes y from
    sequence 2's first token on, and nothing before it."""
    kw = _hand_made([0, 20, 45, 100])
    base = impls.ssd_forward(**kw).y
    kw["initial_states"] = kw["initial_states"].clone()
    kw["initial_states"][2] += 1.0
    moved = (impls.ssd_forward(**kw).y - base).abs().amax(dim=(0, 2, 3))
    assert moved[:45].max() == 0 and bool((moved[45:] > 0).all())


def test_gradients_match_the_definitions_autograd():
    inputs = make_inputs(PACKED, seed=1)
    grads_in = output_gradients(inputs)
    truth = reference_gradients(inputs, grads_in)
    kw = _kwargs(inputs)
    names = [n for n in GRAD_INPUTS if kw.get(n) is not None]
    for n in names:
        kw[n] = kw[n].clone().requires_grad_()
    seq = _sequential(kw)
    found = torch.autograd.grad([seq.y, seq.final_states, seq.varlen_states], [kw[n] for n in names],
                                [grads_in["y"], grads_in["final_states"], grads_in["varlen_states"]])
    errors = {n: rel_err(truth[f"d{n}"], g) for n, g in zip(names, found)}
    assert truth["dinitial_states"].shape[0] == 5 and max(errors.values()) < 1e-10, errors


def test_a_count_that_is_neither_the_batch_nor_the_sequences_is_refused():
    kw = _kwargs(make_inputs(PACKED, seed=0))
    kw["initial_states"] = kw["initial_states"][:3]
    with pytest.raises(ValueError, match=r"initial_states: expected 1 or 5 rows \(the batch, or one per sequence"):
        impls.ssd_forward(**kw)


def test_one_per_row_without_cu_seqlens_only():
    problem = Problem(Shape(2, 40, 2, 4, 1, 4, 16), dtype="float64", has_initial_states=True)
    kw = _kwargs(make_inputs(problem, seed=0))
    kw["initial_states"] = torch.cat([kw["initial_states"]] * 2)
    with pytest.raises(ValueError, match=r"initial_states: expected 2 rows \(the batch\)"):
        impls.ssd_forward(**kw)


@pytest.mark.parametrize("backend, words", [
    pytest.param("mamba_ssm", "apply a row's to its first sequence only", id="mamba_ssm"),
    pytest.param("triton", "one initial state per batch row", id="triton"),
])
def test_backends_without_it_refuse_with_their_reason(backend, words):
    kw = _kwargs(make_inputs(dataclasses.replace(PACKED, dtype="float32"), seed=0))
    with pytest.raises(BackendUnavailable, match=f"one initial state per sequence: .*{words}"):
        impls.ssd_forward(**kw, backend=backend)
