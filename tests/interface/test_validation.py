"""Every validation rule raises ValueError naming the argument, before any backend runs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import impls
from impls.inputs import make_inputs
from impls.problem import Problem
from tests.common import TINY

pytestmark = pytest.mark.quick  # the quick tier: pytest -m quick


def inputs(**changes):
    problem = Problem(dataclasses.replace(TINY, batch=1), has_z=True, has_initial_states=True)
    kw = make_inputs(problem, seed=0, dtype=torch.float32).forward_kwargs()
    kw.update(changes)
    return kw


def _call(**changes):
    return impls.ssd_forward(**inputs(**changes))


S = TINY
BAD_FORWARD = [
    pytest.param("x", {"x": torch.randn(1, S.seqlen, S.nheads)}, id="x-3d"),
    pytest.param("x", {"x": torch.zeros(1, S.seqlen, S.nheads, S.headdim, dtype=torch.int32)}, id="x-int"),
    pytest.param("x: expected a dense", {"x": torch.randn(1, S.seqlen, S.nheads, S.headdim).to_sparse()},
                 id="x-sparse"),
    pytest.param("B", {"B": torch.randn(1, S.seqlen + 1, S.ngroups, S.dstate)}, id="B-seqlen"),
    pytest.param("B", {"B": torch.randn(1, S.seqlen, 3, S.dstate), "C": torch.randn(1, S.seqlen, 3, S.dstate)},
                 id="ngroups-not-dividing-nheads"),
    pytest.param("C", {"C": torch.randn(1, S.seqlen, S.ngroups, S.dstate + 1)}, id="C-shape"),
    pytest.param("dt", {"dt": torch.randn(1, S.seqlen, S.nheads + 1)}, id="dt-shape"),
    pytest.param(r"A: expected shape \(4,\), got \(4, 1\)", {"A": torch.randn(S.nheads, 1)}, id="A-shape"),
    pytest.param("chunk_size", {"chunk_size": 24}, id="chunk-not-power-of-two"),
    pytest.param("chunk_size", {"chunk_size": 8}, id="chunk-below-16"),
    # a numpy or torch int, or 16.0, was refused as "expected a power of two >= 16, got 16"
    pytest.param("chunk_size: expected a Python int .* of type int64", {"chunk_size": np.int64(16)},
                 id="chunk-numpy-int"),
    pytest.param("chunk_size: expected a Python int .* of type Tensor", {"chunk_size": torch.tensor(16)},
                 id="chunk-tensor"),
    pytest.param("chunk_size: expected a Python int .* of type float", {"chunk_size": 16.0}, id="chunk-float"),
    pytest.param("dt_limit", {"dt_limit": (0.1, 0.01)}, id="dt_limit-unordered"),
    pytest.param("dt_limit", {"dt_limit": (-1.0, 1.0)}, id="dt_limit-negative"),
    pytest.param("dt_limit", {"dt_limit": "12"}, id="dt_limit-string"),  # was read as (1, 2)
    pytest.param("dt_bias", {"dt_bias": torch.randn(S.nheads + 1)}, id="dt_bias-shape"),
    pytest.param("D", {"D": torch.randn(S.headdim)}, id="D-shape"),
    pytest.param("z", {"z": torch.randn(1, S.seqlen, S.nheads, S.headdim + 1)}, id="z-shape"),
    pytest.param("initial_states", {"initial_states": torch.randn(1, S.nheads, S.headdim, S.dstate + 1)},
                 id="initial-states-shape"),
    pytest.param("seq_idx", {"seq_idx": torch.zeros(1, S.seqlen, dtype=torch.float32)}, id="seq_idx-float"),
    pytest.param("seq_idx", {"seq_idx": torch.zeros(1, S.seqlen + 1, dtype=torch.int32)}, id="seq_idx-shape"),
    pytest.param("cu_seqlens", {"cu_seqlens": torch.tensor([0], dtype=torch.int32)}, id="cu_seqlens-short"),
    pytest.param("state_dtype", {"state_dtype": torch.int8}, id="state_dtype-int"),
    pytest.param("dt_softplus", {"dt_softplus": "no"}, id="dt_softplus-string"),
    pytest.param("dt_softplus", {"dt_softplus": None}, id="dt_softplus-None"),
    pytest.param("x", {"x": torch.randn(1, 0, S.nheads, S.headdim), "dt": torch.randn(1, 0, S.nheads),
                       "B": torch.randn(1, 0, S.ngroups, S.dstate), "C": torch.randn(1, 0, S.ngroups, S.dstate),
                       "z": None}, id="empty-sequence"),
    # named as the tensor whose dimension is empty (was "x/B")
    pytest.param("x", {"x": torch.randn(1, S.seqlen, S.nheads, 0), "z": None}, id="headdim-0"),
    pytest.param("B", {"B": torch.randn(1, S.seqlen, S.ngroups, 0), "C": torch.randn(1, S.seqlen, S.ngroups, 0)},
                 id="dstate-0"),
    pytest.param("B", {"B": torch.randn(1, S.seqlen, 0, S.dstate), "C": torch.randn(1, S.seqlen, 0, S.dstate)},
                 id="ngroups-0"),
]


@pytest.mark.parametrize("arg, changes", BAD_FORWARD)
def test_forward_rejects(arg, changes):
    with pytest.raises(ValueError, match=rf"^{arg}"):
        _call(**changes)


def test_cu_seqlens_needs_batch_1():
    kw = make_inputs(Problem(TINY), seed=0, dtype=torch.float32).forward_kwargs()
    kw["cu_seqlens"] = torch.tensor([0, 10, S.seqlen], dtype=torch.int32)
    with pytest.raises(ValueError, match="^cu_seqlens: expected batch == 1"):
        impls.ssd_forward(**kw)


@pytest.mark.parametrize("arg, changes", [
    pytest.param("x", {"x": torch.full((1, S.seqlen, S.nheads, S.headdim), float("nan"))}, id="x-nan"),
    pytest.param("dt", {"dt": torch.full((1, S.seqlen, S.nheads), float("inf"))}, id="dt-inf"),
    pytest.param("seq_idx", {"seq_idx": torch.arange(S.seqlen, 0, -1, dtype=torch.int32)[None]},
                 id="seq_idx-decreasing"),
    pytest.param("cu_seqlens", {"cu_seqlens": torch.tensor([0, 10, S.seqlen - 1], dtype=torch.int32)},
                 id="cu_seqlens-not-ending-at-seqlen"),
    pytest.param("seq_idx", {"seq_idx": torch.zeros(1, S.seqlen, dtype=torch.int32),
                             "cu_seqlens": torch.tensor([0, 10, S.seqlen], dtype=torch.int32)},
                 id="seq_idx-disagrees-with-cu_seqlens"),
])
def test_value_checks(arg, changes):
    with pytest.raises(ValueError, match=rf"^{arg}"):
        impls.ssd_forward(**inputs(**changes), check_values=True)


def test_value_checks_are_opt_in():
    """Without check_values nothing reads tensor data: NaN input just flows through (no sync)."""
    out = impls.ssd_forward(**inputs(x=torch.full((1, S.seqlen, S.nheads, S.headdim), float("nan"))))
    assert torch.isnan(out.y).any()


STAGE_ERRORS = [
    pytest.param(lambda kw, r: impls.chunk_cumsum(kw["dt"], kw["A"], 48), "chunk_size", id="chunk_cumsum-chunk"),
    pytest.param(lambda kw, r: impls.chunk_cumsum(kw["dt"][0], kw["A"], 32), "dt", id="chunk_cumsum-dt-2d"),
    pytest.param(lambda kw, r: impls.chunk_cumsum(kw["dt"][:, :0], kw["A"], 32), "dt", id="chunk_cumsum-seqlen-0"),
    pytest.param(lambda kw, r: impls.chunk_cumsum(kw["dt"][:0], kw["A"], 32), "dt", id="chunk_cumsum-batch-0"),
    pytest.param(lambda kw, r: impls.chunk_cumsum(kw["dt"], kw["A"], 32, dt_softplus="yes"), "dt_softplus",
                 id="chunk_cumsum-dt_softplus-string"),
    pytest.param(lambda kw, r: impls.chunk_cumsum(kw["dt"], kw["A"].to("meta"), 32), r"A: .*\(the device of dt\)",
                 id="chunk_cumsum-A-device"),
    pytest.param(lambda kw, r: impls.fwd_pass_state(kw["B"], kw["x"], r.dt[:, :, :-1], r.dA_cumsum), "dt",
                 id="fwd_pass_state-nchunks"),
    pytest.param(lambda kw, r: impls.fwd_pass_state(kw["B"], kw["x"], r.dt, r.dA_cumsum.double()[..., :16]),
                 "dA_cumsum", id="fwd_pass_state-dA-shape"),
    pytest.param(lambda kw, r: impls.fwd_pass_state(kw["B"], kw["x"], *(t.reshape(1, S.nheads, -1, 8)[:, :, :13]
                                                                        for t in (r.dt, r.dA_cumsum))),
                 r"dt \(dimension 3: chunk_size\)", id="fwd_pass_state-chunk-8"),
    pytest.param(lambda kw, r: impls.compute_out(kw["C"], kw["B"], kw["x"], r.dt, r.dA_cumsum, r.states[:, :1]),
                 "states", id="compute_out-states"),
    pytest.param(lambda kw, r: impls.compute_out(kw["C"], kw["B"], kw["x"], r.dt.half(), r.dA_cumsum, r.states),
                 "dt", id="compute_out-dt-fp16"),
]


@pytest.mark.parametrize("call, arg", STAGE_ERRORS)
def test_stage_rejects(call, arg):
    kw = inputs()
    ref = impls.ssd_forward(**kw)
    with pytest.raises(ValueError, match=rf"^{arg}"):
        call(kw, ref)


def test_unknown_backend_and_switch():
    with pytest.raises(ValueError, match="^backend"):
        impls.get_backend("no_such_backend")
    with pytest.raises(ValueError, match="^switch 'nope'"):
        impls.get_backend("mamba_ssm", nope=True)
    with pytest.raises(ValueError, match="^switch 'fused'"):
        impls.get_backend("reference", fused=True)


@pytest.mark.parametrize("switch, value, expected", [
    pytest.param("decay_factor", "no", "a bool", id="bool-switch-string"),  # "no" would read as on
    pytest.param("decay_factor", 1, "a bool", id="bool-switch-int"),
    pytest.param("heads_per_tile", True, r"one of \(0, 1, 2\)", id="int-choice-bool"),  # True == 1
    pytest.param("num_warps", 4.0, r"one of \(0, 1, 2, 4, 8, 16\)", id="int-choice-float"),
    pytest.param("cb_precision", "TF32", r"one of \('tf32', 'fp32'\)", id="str-choice-case"),
])
def test_switch_of_the_wrong_type_is_refused(switch, value, expected):
    """A switch value is checked against its type, not only its truthiness or `==`: the row records what ran."""
    with pytest.raises(ValueError, match=rf"^switch '{switch}' of backend 'triton': expected {expected}, got"):
        impls.get_backend("triton", **{switch: value})


def _no_softplus(**changes):
    kw = inputs(dt_softplus=False, dt_bias=None)
    kw.update(changes)
    return kw


@pytest.mark.parametrize("arg, changes", [
    pytest.param("A", {"A": torch.full((S.nheads,), 0.5)}, id="A-positive"),
    pytest.param("dt", {"dt": -torch.rand(1, S.seqlen, S.nheads)}, id="dt-negative-without-softplus"),
])
def test_decay_factor_refuses_increasing_decay(arg, changes):
    """The factored decay assumes dA_cumsum non-increasing in a chunk: check_values and the harness's gate refuse
    inputs that break it, naming the argument; the same inputs are fine for a backend without the switch."""
    from harness import correctness

    kw = _no_softplus(**changes)
    factored = impls.get_backend("triton", decay_factor=True)
    with pytest.raises(ValueError, match=rf"^{arg}: .*decay_factor"):
        impls.ssd_forward(**kw, backend=factored, check_values=True)
    problem = Problem(dataclasses.replace(TINY, batch=1), dtype="float32", dt_softplus=False, has_dt_bias=False,
                      has_z=True, has_initial_states=True)
    drawn = make_inputs(problem, seed=0)
    drawn.dt, drawn.A = kw["dt"], kw["A"]
    with pytest.raises(ValueError, match=rf"^{arg}: .*decay_factor"):
        correctness.refuse_unsafe_inputs(factored, drawn)
    impls.ssd_forward(**kw, backend="reference", check_values=True)


def test_the_backwards_factored_decay_refuses_a_negative_dt_and_takes_a_positive_A():
    """Switch bwd_decay_factor factors the backward's decays at a pivot: dA_cumsum must be monotone inside a chunk.
    A negative dt (no softplus, no clamp) is refused by check_values and the gate, naming dt and the switch; A > 0
    with dt >= 0 (a growing but monotone decay) is not the switch's concern."""
    from harness import correctness

    kw = _no_softplus(dt=-torch.rand(1, S.seqlen, S.nheads))
    factored = impls.get_backend("triton", bwd_decay_factor=True)
    with pytest.raises(ValueError, match=r"^dt: .*bwd_decay_factor"):
        impls.ssd_forward(**kw, backend=factored, check_values=True)
    problem = Problem(dataclasses.replace(TINY, batch=1), dtype="float32", dt_softplus=False, has_dt_bias=False)
    drawn = make_inputs(problem, seed=0)
    drawn.dt = kw["dt"]
    with pytest.raises(ValueError, match=r"^dt: .*bwd_decay_factor"):
        correctness.refuse_unsafe_inputs(factored, drawn)
    growing = _no_softplus(A=torch.full((S.nheads,), 0.5), dt=0.1 * torch.rand(1, S.seqlen, S.nheads))
    impls.ssd_forward(**growing, backend=factored, check_values=True)


def test_decay_factor_accepts_negative_raw_dt_under_softplus():
    from impls import validate

    dt = -torch.rand(1, S.seqlen, S.nheads)
    validate.decay_factor_inputs(-torch.rand(S.nheads), dt, None, True, (0.0, float("inf")))
    validate.decay_factor_inputs(-torch.rand(S.nheads), dt, None, False, (0.0, 0.1))  # clamped to >= 0


def test_compute_out_with_decay_factor_refuses_an_increasing_dA_cumsum():
    kw = inputs()
    ref = impls.ssd_forward(**kw)
    dA = ref.dA_cumsum.clone()
    dA[0, 0, 0, 5] += 1.0
    with pytest.raises(ValueError, match="^dA_cumsum: .*decay_factor"):
        impls.compute_out(kw["C"], kw["B"], kw["x"], ref.dt, dA, ref.states, backend=impls.get_backend(
            "triton", decay_factor=True), check_values=True)


@pytest.mark.parametrize("arg", ["dt", "dA_cumsum"])
def test_stage_2_refuses_a_padded_tail_that_is_not_flat(arg):
    """Stage 2 reads dA_cumsum at position chunk_size - 1: the padded tail must be flat (dt 0 there)."""
    kw = inputs()
    ref = impls.ssd_forward(**kw)
    impls.fwd_pass_state(kw["B"], kw["x"], ref.dt, ref.dA_cumsum, check_values=True)  # the reference's: flat
    bad = {"dt": ref.dt.clone(), "dA_cumsum": ref.dA_cumsum.clone()}
    bad[arg][..., -1, -1] += 0.1  # seqlen 100, chunk 32: positions 4..31 of the last chunk are padding
    with pytest.raises(ValueError, match=rf"^{arg}: .*past seqlen"):
        impls.fwd_pass_state(kw["B"], kw["x"], bad["dt"], bad["dA_cumsum"], check_values=True)


VARLEN = Problem(dataclasses.replace(TINY, batch=1, seqlen=40, chunk_size=16), varlen=True, nseqs=3)


@pytest.mark.parametrize("bounds", [
    pytest.param([0, 10, 50], id="past-seqlen"),
    pytest.param([0, 10, 30], id="short-of-seqlen"),
    pytest.param([5, 10, 40], id="not-from-0"),
    pytest.param([0, 30, 10, 40], id="decreasing"),
])
@pytest.mark.parametrize("backend", ["reference", "triton", "mamba_ssm", "mamba_ssm-stages"])
def test_bad_cu_seqlens_are_refused_without_check_values(backend, bounds):
    """Every backend reads cu_seqlens on the host for the per-sequence states (upstream's varlen kernel would
    read past the chunks at an offset past seqlen): a bad one is refused on every call, naming it."""
    kw = make_inputs(VARLEN, seed=3, dtype=torch.float32).forward_kwargs()
    kw.update(cu_seqlens=torch.tensor(bounds, dtype=torch.int32), seq_idx=None)
    if backend == "mamba_ssm-stages":  # upstream's kernels stage by stage, its varlen kernel called on its own
        backend = impls.get_backend("mamba_ssm", fused=False)
    with pytest.raises(ValueError, match=r"^cu_seqlens: expected 0 = cu_seqlens\[0\]"):
        impls.ssd_forward(**kw, backend=backend)
