"""The Mamba-2 layer (models/mamba2.py) on the CPU against its float64 reference (models/mamba2_reference.py, the
SSD as the sequential recurrence).

What runs here: the layer on backends reference, triton and mamba_ssm (both Triton ones under the interpreter) in
fp32 and fp16 (the reference also in float64), outputs NaN-poisoned, out and every final state judged by relative
error with the tolerance table, on cases that cover the block (packed sequences with the conv reset, initial
states for the SSD and the conv, cu_seqlens, per-channel D, the norm before the gate, dt_limit, biases); a packed
row against its sequences run one by one; the gradients of the reference backend against the float64 reference's;
the gradients through mamba-ssm's and our Triton backward; refusals: gradients on a backend without a backward, bad
config values, bad inputs, unknown backends and switches.

bf16 is GPU-only (the interpreter computes bf16 dots wrongly): tests/gpu/test_mamba2_layer.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest
import torch

from impls.registry import BackendUnavailable
from impls.tolerance import poisoned_allocations, rel_err, tolerance
from models.mamba2 import Mamba2, Mamba2Config
from models.mamba2_reference import layer_errors, layer_tolerance, mamba2_float64

# d_inner 64, 4 heads of 16, 2 groups, 3 chunks of 32 at seqlen 100 (the last one partial)
CONFIG = Mamba2Config(d_model=32, d_state=16, headdim=16, ngroups=2, chunk_size=32)
# row 0: sequences 0, 1, 2 (one starts at the chunk boundary 64); row 1 numbered from 1 (its initial states dropped)
SEQ_IDX = [[0] * 37 + [1] * 27 + [2] * 36, [1] * 5 + [2] * 66 + [3] * 29]
CU_SEQLENS = [0, 2, 50, 100]  # a first sequence shorter than the conv's width


@dataclass(frozen=True)
class Case:
    batch: int = 2
    seqlen: int = 100
    packed: str = ""  # "", "seq_idx" or "cu_seqlens"
    initial_states: bool = False  # the SSD's and the conv's
    config: dict = field(default_factory=dict)


CASES = [
    pytest.param(Case(), id="plain"),
    pytest.param(Case(packed="seq_idx", initial_states=True), id="seq_idx-3-seqs-initial-states"),
    pytest.param(Case(batch=1, packed="cu_seqlens"), id="cu_seqlens-3-seqs"),
    pytest.param(Case(config=dict(D_per_channel=True, norm_before_gate=True, dt_limit=(0.005, 0.05), bias=True,
                                  conv_bias=False)), id="D-per-channel-norm-first-dt_limit-bias"),
]
DTYPE_IDS = {torch.float64: "fp64", torch.float32: "fp32", torch.float16: "fp16"}
# The kernel backends run under the interpreter (seconds a case): every case once (the plain one in fp32 through the
# workload's gate with every backend: tests/interface/test_contract.py).
KERNEL_DTYPES = {"plain": (torch.float16,), "seq_idx-3-seqs-initial-states": (torch.float32,),
                 "cu_seqlens-3-seqs": (torch.float16,), "D-per-channel-norm-first-dt_limit-bias": (torch.float16,)}


def _runs():
    """(case, backend, dtype): the reference backend on every case in float64, fp32 and fp16; triton and
    mamba_ssm on KERNEL_DTYPES."""
    out = []
    for case in CASES:
        name = case.id
        runs = [("reference", dtype) for dtype in DTYPE_IDS]
        runs += [(backend, dtype) for backend in ("triton", "mamba_ssm") for dtype in KERNEL_DTYPES[name]]
        out += [pytest.param(case.values[0], backend, dtype, id=f"{name}-{backend}-{DTYPE_IDS[dtype]}")
                for backend, dtype in runs]
    return out


def build(backend, dtype=torch.float32, seed: int = 0, **config) -> Mamba2:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return Mamba2(dataclasses.replace(CONFIG, **config), backend, dtype=dtype)


def arguments(case: Case, layer: Mamba2, dtype: torch.dtype, seed: int = 1) -> dict:
    """Fresh random inputs (never zeros) of `case` for `layer`."""
    gen = torch.Generator().manual_seed(seed)
    c = layer.config
    args = {"u": torch.randn(case.batch, case.seqlen, c.d_model, generator=gen).to(dtype)}
    if case.packed == "seq_idx":
        args["seq_idx"] = torch.tensor(SEQ_IDX[: case.batch], dtype=torch.int32)
    if case.packed == "cu_seqlens":
        args["cu_seqlens"] = torch.tensor(CU_SEQLENS, dtype=torch.int32)
    if case.initial_states:
        state_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        args["initial_states"] = 0.5 * torch.randn(case.batch, c.nheads, c.headdim, c.d_state, generator=gen,
                                                   dtype=state_dtype)
        args["conv_initial_states"] = torch.randn(case.batch, c.conv_dim, c.d_conv - 1, generator=gen).to(dtype)
    return args


@pytest.mark.parametrize("case, backend, dtype", _runs())
def test_layer_matches_float64(case, backend, dtype):
    layer = build(backend, dtype, **case.config)
    args = arguments(case, layer, dtype)
    expected = mamba2_float64(layer, **args)
    with torch.inference_mode(), poisoned_allocations():
        got = layer(**args, return_final_states=True)
    errors = layer_errors(got, expected, layer.config.chunk_size)
    tol = layer_tolerance(layer, dtype, "cpu")
    assert errors and all(name in errors for name in ("out", "final_states")), errors
    assert all(err <= tol for err in errors.values()), f"over {tol}: {errors}"
    assert got.out.dtype == dtype and got.out.shape == args["u"].shape
    assert (got.varlen_states is None) == (case.packed != "cu_seqlens")
    assert (got.conv_final_states is None) == bool(case.packed)


def test_a_packed_row_is_its_sequences_one_by_one():
    """The conv and the SSD restart at every sequence: the layer over a packed row equals the layer over each
    sequence alone (float64, reference backend), final states included."""
    layer = build("reference", torch.float64)
    u = torch.randn(1, 100, CONFIG.d_model, dtype=torch.float64)
    bounds = CU_SEQLENS
    with torch.no_grad():
        packed = layer(u, cu_seqlens=torch.tensor(bounds), return_final_states=True)
        alone = [layer(u[:, s:e], return_final_states=True) for s, e in zip(bounds[:-1], bounds[1:])]
    assert rel_err(packed.out, torch.cat([a.out for a in alone], dim=1)) <= tolerance(torch.float64)
    assert rel_err(packed.varlen_states, torch.cat([a.final_states for a in alone])) <= tolerance(torch.float64)
    # and the packing matters: without the reset the second sequence's output differs
    with torch.no_grad():
        unreset = layer(u)
    assert rel_err(unreset[:, 2:50], alone[1].out) > 1e-3


def test_conv_state_carries_a_split_sequence():
    """Two calls, the second given the first's SSD and conv final states, equal one call over the whole sequence."""
    layer = build("reference", torch.float64)
    u = torch.randn(2, 100, CONFIG.d_model, dtype=torch.float64)
    with torch.no_grad():
        whole = layer(u, return_final_states=True)
        first = layer(u[:, :45], return_final_states=True)
        second = layer(u[:, 45:], initial_states=first.final_states, conv_initial_states=first.conv_final_states,
                       return_final_states=True)
    assert rel_err(torch.cat([first.out, second.out], dim=1), whole.out) <= tolerance(torch.float64)
    assert rel_err(second.final_states, whole.final_states) <= tolerance(torch.float64)


def test_reference_backend_gradients_match_float64():
    """The reference backend is autograd-safe (Backend.DIFFERENTIABLE): its gradients through the chunked SSD
    equal those through the float64 sequential reference, for the input, the initial states and every parameter."""
    case = Case(packed="seq_idx", initial_states=True, config=dict(bias=True))
    layer = build("reference", torch.float64, **case.config)
    args = arguments(case, layer, torch.float64)
    args["u"].requires_grad_(True)
    args["initial_states"].requires_grad_(True)
    wrt = [args["u"], args["initial_states"], *layer.parameters()]
    names = ["u", "initial_states", *(name for name, _ in layer.named_parameters())]
    weights = torch.randn(args["u"].shape, dtype=torch.float64)
    got = torch.autograd.grad((layer(**args) * weights).sum(), wrt)
    expected = torch.autograd.grad((mamba2_float64(layer, **args).out * weights).sum(), wrt)
    errors = {n: rel_err(g, e) for n, g, e in zip(names, got, expected)}
    assert all(e.abs().sum() > 0 for e in expected)
    assert all(err <= tolerance(torch.float64) for err in errors.values()), errors


def test_a_backend_without_a_backward_refuses_gradients():
    from impls.registry import Backend
    from impls.triton.backend import TritonBackend

    class ForwardOnly(TritonBackend):
        """Our Triton forward claiming no backward (what it was before impls/triton/backward/)."""

        forward_for_backward = Backend.forward_for_backward

    layer = build(ForwardOnly())
    u = torch.randn(1, 40, CONFIG.d_model)
    with pytest.raises(BackendUnavailable, match="backend 'triton' has no backward: its kernels are forward only"):
        layer(u)
    layer.requires_grad_(False)
    with pytest.raises(BackendUnavailable, match="backend 'triton' has no backward"):
        layer(u.requires_grad_(True))
    with torch.no_grad():
        assert layer(u).shape == u.shape


@pytest.mark.parametrize("backend", ["mamba_ssm", "triton"])
def test_the_layer_trains_on_a_kernel_backward(backend):
    """One training step's gradients through the layer with mamba-ssm's SSD (its own backward) or ours (the Triton
    backward), under the interpreter, against the float64 sequential reference, for the input and every parameter
    (fp32, tf32 off)."""
    case = Case(initial_states=True, config=dict(bias=True))
    layer = build(backend, torch.float32, **case.config)
    args = arguments(case, layer, torch.float32)
    args["u"].requires_grad_(True)
    wrt = [args["u"], *layer.parameters()]
    names = ["u", *(name for name, _ in layer.named_parameters())]
    weights = torch.randn(args["u"].shape, dtype=torch.float32)
    got = torch.autograd.grad((layer(**args) * weights).sum(), wrt)
    twin = build("reference", torch.float64, **case.config)
    twin.load_state_dict({k: v.double() for k, v in layer.state_dict().items()})
    args64 = {k: v.double().detach().requires_grad_(v.requires_grad) if torch.is_tensor(v) and v.is_floating_point()
              else v for k, v in args.items()}
    wrt64 = [args64["u"], *twin.parameters()]
    expected = torch.autograd.grad((mamba2_float64(twin, **args64).out * weights.double()).sum(), wrt64)
    errors = {n: rel_err(g, e) for n, g, e in zip(names, got, expected)}
    assert all(e.abs().sum() > 0 for e in expected)
    assert max(errors.values()) < 1e-4, errors


BAD_CONFIGS = [
    pytest.param(dict(d_model=0), "d_model", id="d_model-0"),
    pytest.param(dict(d_state=2.0), "d_state", id="d_state-float"),
    pytest.param(dict(d_conv=0), "d_conv", id="d_conv-0"),
    pytest.param(dict(expand=True), "expand", id="expand-bool"),
    pytest.param(dict(headdim=24), "headdim", id="headdim-not-dividing-d_inner"),
    pytest.param(dict(ngroups=3), "ngroups", id="ngroups-not-dividing-nheads"),
    pytest.param(dict(chunk_size=48), "chunk_size", id="chunk_size-not-power-of-two"),
    pytest.param(dict(dt_min=0.2), "dt_min", id="dt_min-above-dt_max"),
    pytest.param(dict(dt_max=float("nan")), "dt_max", id="dt_max-nan"),
    pytest.param(dict(dt_init_floor=-1e-4), "dt_init_floor", id="dt_init_floor-negative"),
    pytest.param(dict(A_init_range=(0.0, 16.0)), "A_init_range", id="A_init_range-zero"),
    pytest.param(dict(A_init_range=(1.0,)), "A_init_range", id="A_init_range-not-a-pair"),
    pytest.param(dict(A_init_range="12"), "A_init_range", id="A_init_range-string"),  # was read as (1, 2)
    pytest.param(dict(dt_limit=(0.1, 0.05)), "dt_limit", id="dt_limit-reversed"),
    pytest.param(dict(norm_eps=0.0), "norm_eps", id="norm_eps-0"),
    pytest.param(dict(D_per_channel="yes"), "D_per_channel", id="D_per_channel-string"),
    pytest.param(dict(norm_before_gate=1), "norm_before_gate", id="norm_before_gate-int"),
]


@pytest.mark.parametrize("change, arg", BAD_CONFIGS)
def test_bad_config_values_raise_naming_them(change, arg):
    with pytest.raises(ValueError, match=f"^{arg}: expected"):
        dataclasses.replace(CONFIG, **change)


def _bad_input(name: str, layer: Mamba2) -> dict:
    c = layer.config
    args = {"u": torch.randn(2, 40, c.d_model)}
    if name == "u-2d":
        args["u"] = args["u"][0]
    elif name == "u-d_model":
        args["u"] = torch.randn(2, 40, c.d_model + 1)
    elif name == "u-dtype":
        args["u"] = args["u"].half()
    elif name == "u-seqlen-0":
        args["u"] = args["u"][:, :0]
    elif name == "seq_idx-shape":
        args["seq_idx"] = torch.zeros(2, 41, dtype=torch.int32)
    elif name == "seq_idx-dtype":
        args["seq_idx"] = torch.zeros(2, 40)
    elif name == "cu_seqlens-batch-2":
        args["cu_seqlens"] = torch.tensor([0, 40], dtype=torch.int32)
    elif name == "initial_states-shape":
        args["initial_states"] = torch.zeros(2, c.nheads, c.headdim, c.d_state + 1)
    elif name == "conv_initial_states-shape":
        args["conv_initial_states"] = torch.zeros(2, c.conv_dim, c.d_conv)
    elif name == "conv_initial_states-dtype":  # u's dtype, not cast silently
        args["conv_initial_states"] = torch.zeros(2, c.conv_dim, c.d_conv - 1, dtype=torch.float64)
    elif name == "return_final_states-string":
        args["return_final_states"] = "no"
    elif name == "check_values-string":
        args["check_values"] = "no"
    return args


BAD_INPUTS = ["u-2d", "u-d_model", "u-dtype", "u-seqlen-0", "seq_idx-shape", "seq_idx-dtype", "cu_seqlens-batch-2",
              "initial_states-shape", "conv_initial_states-shape", "conv_initial_states-dtype",
              "return_final_states-string",
              "check_values-string"]


@pytest.mark.parametrize("dtype", [torch.int64, "float32", torch.complex64], ids=["int64", "string", "complex64"])
def test_a_bad_layer_dtype_is_named(dtype):
    with pytest.raises(ValueError, match="^dtype: expected None or one of"):
        Mamba2(CONFIG, "reference", dtype=dtype)


@pytest.mark.parametrize("name", [pytest.param(n, id=n) for n in BAD_INPUTS])
def test_bad_inputs_raise_naming_the_argument(name):
    layer = build("reference")
    arg = name.split("-")[0]
    with torch.no_grad(), pytest.raises(ValueError, match=f"^{arg}: expected"):
        layer(**_bad_input(name, layer))


def test_backend_by_name_or_instance_never_replaced():
    from impls.registry import get_backend

    with pytest.raises(ValueError, match="backend: expected one of"):
        build("no_such_backend")
    with pytest.raises(ValueError, match="switch 'no_such_switch'"):
        Mamba2(CONFIG, "triton", {"no_such_switch": True})
    with pytest.raises(ValueError, match="config: expected a Mamba2Config"):
        Mamba2({"d_model": 32}, "reference")
    built = get_backend("triton", exp2=False)
    layer = Mamba2(CONFIG, built)
    assert layer.backend is built
    # a problem the backend cannot run raises its reason at the call (mamba_ssm: float64), nothing else runs it
    with torch.no_grad(), pytest.raises(BackendUnavailable, match="float64"):
        build("mamba_ssm", torch.float64)(torch.randn(1, 40, CONFIG.d_model, dtype=torch.float64))


def test_describe_names_the_backend_its_switches_and_the_last_call():
    layer = Mamba2(CONFIG, "triton", {"exp2": False})
    with torch.no_grad():
        layer(torch.randn(1, 40, CONFIG.d_model), cu_seqlens=torch.tensor([0, 10, 40]))
    info = layer.describe()
    assert info["ssd"]["backend"] == "triton" and info["ssd"]["switches"]["exp2"] is False
    assert info["config"]["d_model"] == CONFIG.d_model and info["param_dtype"] == "float32"
    assert info["last_call"]["cu_seqlens"] and info["last_call"]["conv"].startswith("masked taps")
    assert info["ssd_call"]["D"] == "per head" and info["ssd_call"]["dt_softplus"] is True
