"""Property tests (hypothesis): random valid problems agree between the float64 reference and our Triton backend
under the interpreter (fp32); random invalid arguments raise the documented ValueError naming the argument.
Example counts are bounded so the CPU suite stays fast."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import impls
from impls.inputs import make_inputs
from impls.problem import Problem, Shape
from tests.common import as_fused_projection_views, failures, float64_forward, forward_errors

FAST = settings(max_examples=6, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def problems(draw):
    nheads = draw(st.sampled_from([1, 2, 4]))
    ngroups = draw(st.sampled_from([g for g in (1, 2, 4) if nheads % g == 0]))
    chunk = draw(st.sampled_from([16, 32]))
    layout = draw(st.sampled_from(["single", "seq_idx", "cu_seqlens"]))
    batch = 1 if layout == "cu_seqlens" else draw(st.integers(1, 2))
    seqlen = draw(st.integers(3 if layout != "single" else 1, 80))
    shape = Shape(batch, seqlen, nheads, draw(st.sampled_from([16, 24, 32])), ngroups,
                  draw(st.sampled_from([16, 32])), chunk)
    d_shape = draw(st.sampled_from(["none", "head", "channel"]))
    problem = Problem(
        shape, dtype="float32",
        dt_softplus=draw(st.booleans()), has_dt_bias=draw(st.booleans()),
        has_D=d_shape != "none", D_per_channel=d_shape == "channel",
        has_z=draw(st.booleans()), has_initial_states=draw(st.booleans()) and layout != "cu_seqlens",
        nseqs=draw(st.integers(2, 3)) if layout != "single" else 1, varlen=layout == "cu_seqlens",
    )
    return problem, draw(st.booleans()), draw(st.integers(0, 2**16))


@FAST
@given(case=problems())
def test_triton_agrees_with_reference_on_random_problems(case):
    problem, strided, seed = case
    backend = impls.get_backend("triton")
    inputs = make_inputs(problem, seed=seed, dtype=torch.float32)
    if strided:
        inputs = as_fused_projection_views(inputs)
    errors = forward_errors(backend, inputs, float64_forward(inputs))
    assert not failures(errors, torch.float32), (problem, errors)


def _valid_kwargs():
    problem = Problem(Shape(1, 40, 4, 16, 2, 16, 16), dtype="float32", has_z=True, has_initial_states=True)
    return make_inputs(problem, seed=1, dtype=torch.float32).forward_kwargs()


def _bad(kw, arg, draw):
    """One way of breaking argument `arg`, drawn at random."""
    t = kw[arg]
    if arg == "chunk_size":
        return draw(st.sampled_from([0, 8, 24, 48, 4096, -16]))
    if arg == "dt_limit":
        return draw(st.sampled_from([(0.1, 0.01), (-1.0, 1.0), (0.5, 0.5), (float("nan"), 1.0)]))
    if arg == "dt_softplus":
        return draw(st.sampled_from(["no", None, 1]))
    how = draw(st.sampled_from(["shape", "dtype", "rank"]))
    if how == "shape":
        dims = list(t.shape)
        i = draw(st.integers(0, len(dims) - 1))
        dims[i] += draw(st.integers(1, 3))
        return torch.randn(*dims, dtype=t.dtype)
    if how == "dtype":
        return t.to(torch.int32)
    return t.reshape(-1) if t.dim() > 1 else t[None, None]


ARGS = ["x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states", "chunk_size", "dt_limit", "dt_softplus"]


@settings(max_examples=40, deadline=None, derandomize=True)
@given(data=st.data())
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_invalid_arguments_raise_naming_them(backend, data):
    kw = _valid_kwargs()
    arg = data.draw(st.sampled_from(ARGS))
    kw[arg] = _bad(kw, arg, data.draw)
    with pytest.raises(ValueError) as info:
        impls.ssd_forward(**kw, backend=backend)
    named = str(info.value).split(":")[0]
    assert named == arg or named in ALSO_NAMED.get(arg, ()), (arg, str(info.value))


# Breaking x makes every other argument disagree with it, and a B with another (valid) ngroups makes C the odd one
# out: the error may then name the argument that no longer matches.
ALSO_NAMED = {"x": ARGS, "B": ["C"]}
