"""Switch inner_chunk (cuTile and Triton): the forward's stages at an internal chunk, its result at the caller's.

The conversion of the per-chunk outputs (impls/inner_chunk.py) on the float64 reference's; the Triton backend under
the interpreter against the float64 reference at the caller's chunk (seqlen not a multiple of it, packed sequences,
cu_seqlens, initial states, z), its parts and describe(), its backward; the cuTile backend's forward path with the
reference's stages standing in for its kernels (which run on a GPU only; tests/gpu/test_cutile.py runs them); the
refusals."""

from __future__ import annotations

import dataclasses
import os
import sys

if "impls.triton" not in sys.modules:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import impls  # noqa: E402
from impls.inner_chunk import caller_states, stage_chunk, to_caller_chunk  # noqa: E402
from impls.inputs import make_inputs  # noqa: E402
from impls.problem import Problem, Shape  # noqa: E402
from impls.registry import get_backend  # noqa: E402
from impls.tolerance import poisoned_allocations, rel_err  # noqa: E402
from impls.triton.target import interpreting  # noqa: E402
from tests.common import failures, float64_forward  # noqa: E402

# seqlen 300 at chunk 128: three caller chunks, the last one 44 tokens long; at 64 five inner chunks, the last
# partly padded, and the caller's padded tail one whole inner chunk longer than the inner chunks' end
PLAIN = Problem(Shape(1, 300, 2, 16, 1, 16, 128))
RICH = Problem(Shape(1, 300, 4, 16, 2, 16, 128), has_z=True, has_initial_states=True, nseqs=3, varlen=True,
               initial_states_per_sequence=True, D_per_channel=True)
VARLEN = dataclasses.replace(RICH, initial_states_per_sequence=False)  # one initial state: what Triton takes
SEQ = Problem(Shape(2, 200, 2, 16, 1, 16, 128), has_initial_states=True, nseqs=2)
OUTPUTS = ("y", "final_states", "varlen_states", "dt", "dA_cumsum", "states")
interpreted = pytest.mark.skipif(not interpreting(), reason="impls.triton was imported without TRITON_INTERPRET=1")


def _errors(out, ref) -> dict[str, float]:
    return {name: rel_err(getattr(out, name), getattr(ref, name)) for name in OUTPUTS
            if getattr(ref, name) is not None}


# --- the conversion, on the reference's outputs ------------------------------------------------------------------
@pytest.mark.parametrize("problem", [pytest.param(PLAIN, id="plain"), pytest.param(RICH, id="varlen-init-z"),
                                     pytest.param(SEQ, id="seq_idx-batch2")])
@pytest.mark.parametrize("inner", [32, 64])
def test_the_converted_intermediates_are_the_callers_chunk(problem, inner):
    """The float64 reference run at the inner chunk, converted: dt equal, dA_cumsum and states equal to float64's
    rounding, at the caller's chunk (y and the final states are the same math, checked by the backends' tests)."""
    inputs = make_inputs(problem, seed=1, dtype=torch.float64)
    kw = inputs.forward_kwargs()
    ref = impls.ssd_forward(**kw, backend="reference")
    out = to_caller_chunk(impls.ssd_forward(**{**kw, "chunk_size": inner}, backend="reference"), kw["chunk_size"])
    assert out.dt.shape == ref.dt.shape and out.states.shape == ref.states.shape
    assert torch.equal(out.dt, ref.dt)
    torch.testing.assert_close(out.dA_cumsum, ref.dA_cumsum, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out.states, ref.states, rtol=1e-12, atol=1e-12)
    flat = out.dA_cumsum[..., -1, problem.shape.seqlen % 128:]  # the padded tail of the last caller chunk
    assert torch.equal(flat, flat[..., :1].expand_as(flat))


def test_the_states_are_a_view_of_the_inner_ones():
    states = torch.randn(1, 6, 2, 4, 8).transpose(-1, -2).contiguous().transpose(-1, -2)  # dstate-major
    out = caller_states(states, 2)
    assert out.data_ptr() == states.data_ptr() and out.stride(-2) == 1 and torch.equal(out, states[:, [0, 2, 4]])
    assert caller_states(None, 2) is None


def test_the_stage_chunk_and_its_refusal():
    assert stage_chunk(0, 256, "triton") == 256
    assert stage_chunk(128, 256, "triton") == 128
    assert stage_chunk(128, 128, "cutile") == 128 and stage_chunk(128, 64, "cutile") == 64  # no larger: no change
    with pytest.raises(ValueError, match=r"inner_chunk=64 of backend 'cutile'.*chunk_size=96"):
        stage_chunk(64, 96, "cutile")


# --- the Triton backend under the interpreter ----------------------------------------------------------------------
@interpreted
@pytest.mark.parametrize("problem", [pytest.param(PLAIN, id="plain"), pytest.param(VARLEN, id="varlen-init-z"),
                                     pytest.param(SEQ, id="seq_idx-batch2")])
def test_triton_forward_at_the_inner_chunk(problem):
    """y, the final and per-sequence states and the converted intermediates against the float64 reference at the
    caller's chunk; describe() names the inner chunk and the records looked up at it."""
    backend = get_backend("triton", inner_chunk=64)
    inputs = make_inputs(problem, seed=3, dtype=torch.float32)
    with poisoned_allocations():
        out = impls.ssd_forward(**inputs.forward_kwargs(), backend=backend)
    errors = _errors(out, float64_forward(inputs))
    assert not failures(errors, torch.float32), errors
    described = backend.describe()
    assert described["inner_chunk"] == {"chunk": 64, "caller_chunk": 128}
    sources = described["tuning_sources"]
    assert {"inner_chunk_cumsum", "inner_compute_out"} <= set(sources), sources
    assert all("-c64|" in info["key"] for info in sources.values()), sources
    assert "compute_out" not in described["stages"]  # what ran at the caller's chunk only (nothing here)


@interpreted
def test_triton_fused_forward_at_the_inner_chunk():
    """With fuse_state_out the fused kernel runs at the inner chunk; its parts are the fused kernel's and the
    conversion."""
    backend = get_backend("triton", inner_chunk=64, fuse_state_out=True, tma=False)
    inputs = make_inputs(SEQ, seed=7, dtype=torch.float32)
    with poisoned_allocations():
        out = impls.ssd_forward(**inputs.forward_kwargs(), backend=backend)
    errors = _errors(out, float64_forward(inputs))
    assert not failures(errors, torch.float32), errors
    assert "inner_fused_state_out" in backend.describe()["tuning_sources"]
    assert list(backend.forward_parts(**inputs.forward_kwargs())) == ["inner_fused_state_out", "to_caller_chunk"]


@interpreted
def test_triton_inner_chunk_no_larger_than_the_chunk_changes_nothing():
    inputs = make_inputs(dataclasses.replace(PLAIN, shape=dataclasses.replace(PLAIN.shape, chunk_size=64)), seed=2,
                         dtype=torch.float32)
    plain = impls.ssd_forward(**inputs.forward_kwargs(), backend=get_backend("triton"))
    backend = get_backend("triton", inner_chunk=64)
    same = impls.ssd_forward(**inputs.forward_kwargs(), backend=backend)
    assert all(torch.equal(getattr(same, n), getattr(plain, n)) for n in ("y", "dt", "dA_cumsum", "states"))
    assert "inner_chunk" not in backend.describe()


@interpreted
def test_triton_parts_at_the_inner_chunk():
    """The harness's parts: each stage at the inner chunk and the conversion; the caller-chunk stage calls keep
    their own describe() entries."""
    from harness.workloads import get

    backend = get_backend("triton", inner_chunk=64)
    inputs = make_inputs(PLAIN, seed=4, dtype=torch.float32)
    workload = get("ssd")
    kw = workload.arguments(inputs)
    dt, _ = impls.chunk_cumsum(inputs.dt, inputs.A, 128, inputs.dt_bias, inputs.dt_softplus, backend=backend)
    assert dt.shape[-1] == 128  # the stage entries run at the chunk they are given
    parts = workload.parts(backend, kw)
    assert list(parts) == ["inner_chunk_cumsum", "inner_fwd_pass_state", "inner_compute_out", "to_caller_chunk"]
    assert parts["inner_chunk_cumsum"]()[0].shape[-1] == 64
    converted = parts["to_caller_chunk"]()
    ref = float64_forward(inputs)
    assert not failures(_errors(converted, ref), torch.float32)
    described = backend.describe()
    assert "-c128|" in described["stages"]["chunk_cumsum"]["key"]
    assert "-c64|" in described["tuning_sources"]["inner_chunk_cumsum"]["key"]


@interpreted
def test_triton_backward_at_the_callers_chunk_on_the_converted_intermediates():
    """impls.ssd with inner_chunk: the backward reads the converted dt, dA_cumsum and states at the caller's chunk;
    its gradients are those without the switch, to fp32's rounding."""
    inputs = make_inputs(Problem(Shape(1, 150, 2, 16, 1, 16, 128), has_initial_states=True), seed=5,
                         dtype=torch.float32)
    kw = inputs.forward_kwargs()
    grads = []
    for inner in (0, 64):
        leaves = {n: kw[n].detach().clone().requires_grad_() for n in ("x", "B", "C", "dt", "initial_states")}
        out = impls.ssd(**{**kw, **leaves}, backend=get_backend("triton", inner_chunk=inner))
        (out.y.square().sum() + out.final_states.sum()).backward()
        grads.append({n: t.grad for n, t in leaves.items()})
    errors = {n: rel_err(grads[1][n], grads[0][n]) for n in grads[0]}
    assert max(errors.values()) < 1e-5, errors


# --- the cuTile backend's forward path --------------------------------------------------------------------------------
def _cutile_on_reference(**switches):
    """The cuTile backend's forward path (its ssd_forward, forward_parts, describe()) with the reference's stages in
    place of its kernels, on the CPU; its stages record a source as the kernels' do."""
    pytest.importorskip("cuda.tile")
    from impls.cutile.backend import CutileBackend

    class OnReference(CutileBackend):
        def check_device(self, device):
            return True, ""

        def chunk_cumsum(self, dt, A, chunk_size, *args):
            self._sources["chunk_cumsum"] = {"source": "reference", "chunk": chunk_size}
            return get_backend("reference").chunk_cumsum(dt, A, chunk_size, *args)

        def fwd_pass_state(self, *args):
            return get_backend("reference").fwd_pass_state(*args)

        def compute_out(self, *args, **kw):
            return get_backend("reference").compute_out(*args, **kw)

    return OnReference(**switches)


@pytest.mark.parametrize("problem", [pytest.param(VARLEN, id="varlen-init-z"), pytest.param(SEQ, id="seq_idx-batch2")])
def test_cutile_forward_path_at_the_inner_chunk(problem):
    backend = _cutile_on_reference(inner_chunk=64)
    inputs = make_inputs(problem, seed=6, dtype=torch.float64)
    out = backend.ssd_forward(**inputs.forward_kwargs())
    errors = _errors(out, float64_forward(inputs))
    assert max(errors.values()) < 1e-12, errors
    described = backend.describe()
    assert described["inner_chunk"] == {"chunk": 64, "caller_chunk": 128}
    assert described["tuning_sources"]["inner_chunk_cumsum"]["chunk"] == 64 and described["stages"] == {}
    parts = backend.forward_parts(**inputs.forward_kwargs())
    assert list(parts) == ["inner_chunk_cumsum", "inner_fwd_pass_state", "inner_compute_out", "to_caller_chunk"]


def test_cutile_switch_is_declared_with_its_choices():
    pytest.importorskip("cuda.tile")
    from impls.cutile.switches import CutileSwitches
    from impls.registry import make_switches

    assert CutileSwitches().inner_chunk == 0
    with pytest.raises(ValueError, match=r"inner_chunk.*one of \(0, 64, 128\)"):
        make_switches("cutile", CutileSwitches, {}, {"inner_chunk": 32}, {})


def test_cutile_backward_reads_the_converted_intermediates_under_emulation(monkeypatch):
    """impls.ssd on the cuTile backend with inner_chunk: its backward kernels (emulated on the CPU) run at the
    caller's chunk on the converted dt, dA_cumsum and the states' view; the gradients are those without the switch,
    to fp32's rounding."""
    pytest.importorskip("cuda.tile")
    from harness.calls import forward_arguments
    from instruments.cutile.emulate import emulated_launches
    from tests.backends.test_cutile_backward import SMALL, _emulated, _leaves

    inputs = make_inputs(Problem(Shape(1, 150, 2, 32, 1, 32, 128), dtype="float32", has_initial_states=True), seed=5)
    kw = forward_arguments(inputs)
    grads = []
    for inner in (0, 64):
        leaves = _leaves(kw)
        with emulated_launches():
            out = impls.ssd(**{**kw, **leaves}, backend=_emulated(monkeypatch, SMALL, inner_chunk=inner))
            (out.y.square().sum() + out.final_states.sum()).backward()
        grads.append({n: t.grad for n, t in leaves.items()})
    errors = {n: rel_err(grads[1][n], grads[0][n]) for n in grads[0]}
    assert max(errors.values()) < 1e-5, errors


def test_cutile_refuses_a_sub_block_longer_than_the_inner_chunk():
    pytest.importorskip("cuda.tile")
    from impls.cutile.switches import CutileSwitches

    with pytest.raises(ValueError, match=r"inner_chunk=64 and state_subblock=128 of backend 'cutile'"):
        CutileSwitches(inner_chunk=64, state_subblock=128)
    CutileSwitches(inner_chunk=128, state_subblock=128)
