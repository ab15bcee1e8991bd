"""The layer's Triton kernels (models/kernels/) under the interpreter, the layer's `glue` choice (models/glue.py) and
the non-SSD floor (models/floor.py), on the CPU.

Each kernel's forward and gradients against torch ops in float64 written out here (windows of the padded input for
the conv, the norm's formula), on random inputs, the kernels' allocations NaN-poisoned, in fp32, fp16 and bf16 (the
kernels have no dots, so the interpreter computes bf16 right), with the left context, seq_idx, strided inputs and
several programs per dimension; the layer with glue="triton" (and once "compile") against its float64 reference,
its gradients, the language model on it; the refusals; the floor's counts at the 2.7B layer.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from impls.registry import BackendUnavailable
from impls.tolerance import poisoned_allocations, rel_err, tolerance
from models.kernels import causal_conv, common, gated_norm
from models.mamba2 import Mamba2, Mamba2Config
from models.mamba2_reference import layer_errors, layer_tolerance, mamba2_float64

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "fp64": torch.float64}
# per packed row: three sequences in row 0, row 1 numbered from 1 (its context is sequence 0: never read)
SEQ_IDX = [[0] * 10 + [1] * 20 + [2] * 7, [1] * 3 + [2] * 34]


def _random(*shape, gen, dtype, scale=1.0):
    return (scale * torch.randn(*shape, generator=gen)).to(dtype)


def _grads(fn, inputs: list[torch.Tensor | None], dout: torch.Tensor):
    """fn(*inputs) and the gradients of <out, dout> for the inputs that are not None."""
    leaves = [None if t is None else t.detach().requires_grad_(True) for t in inputs]
    out = fn(*leaves)
    return out, torch.autograd.grad(out, [t for t in leaves if t is not None], dout.to(out.dtype))


# --- the conv -----------------------------------------------------------------------------------------------------

def conv_float64(x, weight, bias, context, seq_idx):
    """silu(bias + Σ_k w_k x[t − W + 1 + k]) in float64 from windows of the left-padded input, taps of another
    sequence (the context is sequence 0) zeroed."""
    batch, seqlen, channels = x.shape
    width = weight.shape[-1]
    left = x.new_zeros(batch, channels, width - 1) if context is None else context
    windows = torch.cat([left, x.transpose(1, 2)], dim=-1).unfold(-1, width, 1)  # (batch, channels, seqlen, W)
    if seq_idx is not None:
        seq = torch.cat([seq_idx.new_zeros(batch, width - 1), seq_idx], dim=-1).unfold(-1, width, 1)
        windows = windows * (seq == seq_idx[..., None]).to(torch.float64)[:, None]
    a = torch.einsum("bclk,ck->blc", windows, weight.reshape(channels, width))
    if bias is not None:
        a = a + bias
    return a * torch.sigmoid(a)


@dataclasses.dataclass(frozen=True)
class ConvCase:
    width: int = 4
    context: bool = False
    seq_idx: bool = False
    bias: bool = True
    strided: bool = False  # x a view of a wider tensor, as the layer's is of in_proj's output
    small_tiles: bool = False  # several programs over positions, channels and backward row ranges
    seqlen: int = 37


CONV_CASES = [
    pytest.param(ConvCase(), "fp32", id="W4-fp32", marks=pytest.mark.quick),
    pytest.param(ConvCase(width=2, context=True), "fp32", id="W2-context-fp32"),
    pytest.param(ConvCase(width=3, seq_idx=True, context=True, strided=True, small_tiles=True), "fp32",
                 id="W3-seq_idx-context-strided-small-tiles-fp32"),
    pytest.param(ConvCase(context=True, seq_idx=True, small_tiles=True), "fp16", id="W4-seq_idx-context-tiles-fp16"),
    pytest.param(ConvCase(context=True, bias=False, strided=True), "bf16", id="W4-context-no-bias-strided-bf16"),
    pytest.param(ConvCase(width=1, context=True), "fp32", id="W1-empty-context-fp32"),
    pytest.param(ConvCase(context=True, seq_idx=True, seqlen=2), "fp32", id="W4-seqlen-2-context-seq_idx-fp32"),
]


def conv_inputs(case: ConvCase, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    batch, seqlen, channels = 2, case.seqlen, 40
    x = _random(batch, seqlen, channels + 9, gen=gen, dtype=dtype)
    x = x[..., 3:3 + channels] if case.strided else x[..., :channels].contiguous()
    weight = _random(channels, 1, case.width, gen=gen, dtype=dtype, scale=0.5)
    bias = _random(channels, gen=gen, dtype=dtype) if case.bias else None
    context = _random(batch, channels, case.width - 1, gen=gen, dtype=dtype) if case.context else None
    seq_idx = torch.tensor(SEQ_IDX, dtype=torch.int32)[:, :seqlen] if case.seq_idx else None
    dout = _random(batch, seqlen, channels, gen=gen, dtype=torch.float64)
    return x, weight, bias, context, seq_idx, dout


@pytest.mark.parametrize("case, dtype_name", CONV_CASES)
def test_conv_kernels_match_float64(case, dtype_name, monkeypatch):
    dtype = DTYPES[dtype_name]
    if case.small_tiles:
        monkeypatch.setattr(causal_conv, "FWD_TILE", (8, 16, 1))
        monkeypatch.setattr(causal_conv, "BWD_TILE", (4, 16, 1))
        monkeypatch.setattr(causal_conv, "BWD_ROWS_PER_PROGRAM", 8)  # 5 row ranges, the first starting at −(W − 1)
    x, weight, bias, context, seq_idx, dout = conv_inputs(case, dtype)
    inputs = [x, weight, bias, context]
    with poisoned_allocations():
        out, grads = _grads(lambda *t: causal_conv.CausalConvSiLU.apply(*t, seq_idx), inputs, dout)
    expected, expected_grads = _grads(lambda *t: conv_float64(*t, seq_idx),
                                      [None if t is None else t.double() for t in inputs], dout)
    tol = tolerance(dtype)
    assert out.dtype == dtype and out.is_contiguous() and out.shape == x.shape
    errors = {"out": rel_err(out, expected)}
    names = ["dx", "dweight"] + ["dbias"] * (bias is not None) + ["dcontext"] * (context is not None)
    for name, got, want in zip(names, grads, expected_grads):
        assert got.dtype == dtype and (want.numel() == 0 or want.abs().sum() > 0)
        errors[name] = rel_err(got, want)
    assert all(err <= tol for err in errors.values()), f"over {tol}: {errors}"


@pytest.mark.quick
def test_conv_final_states_are_the_last_inputs():
    """The next call's context: the last W − 1 inputs, reaching into the context when seqlen < W − 1."""
    gen = torch.Generator().manual_seed(3)
    x, context = torch.randn(2, 2, 8, generator=gen), torch.randn(2, 8, 3, generator=gen)
    weight = torch.randn(8, 1, 4, generator=gen)
    _, final = causal_conv.causal_conv_silu(x, weight, None, context)
    assert torch.equal(final, torch.cat([context[..., 2:], x.transpose(1, 2)], dim=-1))
    x = torch.randn(2, 9, 8, generator=gen)
    _, final = causal_conv.causal_conv_silu(x, weight, None, context)
    assert torch.equal(final, x[:, -3:].transpose(1, 2))
    assert causal_conv.causal_conv_silu(x, weight, None, context, torch.zeros(2, 9, dtype=torch.int32))[1] is None


def test_the_kernels_compile_for_sm90_without_spills():
    """Every variant the layer launches at the 2.7B layer's size in bf16, through ptxas for sm_90 (the interpreter
    accepts programs the compiler rejects): no spills (instruments/triton/layer_kernels.py, in a process that does not
    interpret)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-m", "instruments.triton.layer_kernels"], capture_output=True, text=True,
                            env=env, cwd=Path(__file__).resolve().parents[2], timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("ok  ") == 12, result.stdout


# --- the gated norm -------------------------------------------------------------------------------------------------

def norm_float64(y, z, weight, eps, group_size, norm_before_gate):
    gate = z * torch.sigmoid(z)
    v = y if norm_before_gate else y * gate
    groups = v.unflatten(-1, (-1, group_size))
    normed = (groups / torch.sqrt(groups.square().mean(-1, keepdim=True) + eps)).flatten(-2) * weight
    return normed * gate if norm_before_gate else normed


NORM_CASES = [
    pytest.param(False, 1, "fp32", id="gate-then-norm-1-group-fp32", marks=pytest.mark.quick),
    pytest.param(False, 2, "fp16", id="gate-then-norm-2-groups-fp16"),
    pytest.param(True, 2, "fp32", id="norm-then-gate-2-groups-fp32"),
    pytest.param(True, 1, "bf16", id="norm-then-gate-1-group-bf16"),
    pytest.param(False, 3, "bf16", id="gate-then-norm-3-groups-bf16"),
]


@pytest.mark.parametrize("norm_before_gate, ngroups, dtype_name", NORM_CASES)
def test_gated_norm_kernels_match_float64(norm_before_gate, ngroups, dtype_name, monkeypatch):
    """Groups of 24 channels (a block of 32, masked), z a view of a wider tensor, 7 backward programs over 39 rows."""
    monkeypatch.setattr(gated_norm, "BWD_PROGRAMS", 7)
    dtype, group_size = DTYPES[dtype_name], 24
    width = ngroups * group_size
    gen = torch.Generator().manual_seed(ngroups)
    y = _random(3, 13, width, gen=gen, dtype=dtype)
    z = _random(3, 13, width + 11, gen=gen, dtype=dtype)[..., 5:5 + width]
    weight = (1 + 0.5 * torch.randn(width, generator=gen)).to(dtype)
    dout = _random(3, 13, width, gen=gen, dtype=torch.float64)
    with poisoned_allocations():
        out, grads = _grads(lambda *t: gated_norm.gated_rms_norm(*t, 1e-5, group_size, norm_before_gate),
                            [y, z, weight], dout)
    expected, expected_grads = _grads(lambda *t: norm_float64(*t, 1e-5, group_size, norm_before_gate),
                                      [y.double(), z.double(), weight.double()], dout)
    tol = tolerance(dtype)
    errors = {"out": rel_err(out, expected)}
    errors.update({name: rel_err(g, e) for name, g, e in zip(("dy", "dz", "dweight"), grads, expected_grads)})
    assert out.dtype == dtype and all(g.dtype == dtype for g in grads)
    assert all(err <= tol for err in errors.values()), f"over {tol}: {errors}"


# --- the layer, its glue --------------------------------------------------------------------------------------------

LAYER = Mamba2Config(d_model=32, d_state=16, headdim=16, ngroups=2, chunk_size=32)
LAYER_SEQ_IDX = [[0] * 37 + [1] * 27 + [2] * 36, [1] * 5 + [2] * 66 + [3] * 29]


@pytest.fixture
def kernel_calls(monkeypatch) -> list[str]:
    """The names of the kernels' host functions as the test calls them (what ran, not what describe() says)."""
    calls = []

    def counting(name: str, fn):
        def counted(*args, **kwargs):
            calls.append(name)
            return fn(*args, **kwargs)

        return counted

    for module, name in ((causal_conv, "conv_forward"), (causal_conv, "conv_backward"),
                         (gated_norm, "norm_forward"), (gated_norm, "norm_backward")):
        monkeypatch.setattr(module, name, counting(name, getattr(module, name)))
    return calls


def build(dtype, glue="triton", seed=0, **config) -> Mamba2:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return Mamba2(dataclasses.replace(LAYER, **config), "reference", dtype=dtype, glue=glue)


def layer_arguments(layer: Mamba2, dtype, packed: str = "", initial_states: bool = False, seed: int = 1) -> dict:
    gen, c = torch.Generator().manual_seed(seed), layer.config
    batch = 1 if packed == "cu_seqlens" else 2
    args = {"u": _random(batch, 100, c.d_model, gen=gen, dtype=dtype)}
    if packed == "seq_idx":
        args["seq_idx"] = torch.tensor(LAYER_SEQ_IDX, dtype=torch.int32)
    if packed == "cu_seqlens":
        args["cu_seqlens"] = torch.tensor([0, 2, 50, 100], dtype=torch.int32)
    if initial_states:
        state = torch.float64 if dtype == torch.float64 else torch.float32
        args["initial_states"] = 0.5 * torch.randn(batch, c.nheads, c.headdim, c.d_state, generator=gen,
                                                   dtype=state)
        args["conv_initial_states"] = _random(batch, c.conv_dim, c.d_conv - 1, gen=gen, dtype=dtype)
    return args


LAYER_CASES = [
    pytest.param("fp64", "", False, {}, id="plain-fp64"),
    pytest.param("fp32", "seq_idx", True, {}, id="seq_idx-initial-states-fp32"),
    pytest.param("fp32", "cu_seqlens", False, {}, id="cu_seqlens-fp32"),
    pytest.param("fp16", "", True, dict(norm_before_gate=True, D_per_channel=True, bias=True, conv_bias=False,
                                        d_conv=3), id="norm-first-no-conv-bias-d_conv3-initial-states-fp16"),
]


@pytest.mark.parametrize("dtype_name, packed, initial_states, config", LAYER_CASES)
def test_layer_on_triton_glue_matches_float64(dtype_name, packed, initial_states, config, kernel_calls):
    dtype = DTYPES[dtype_name]
    layer = build(dtype, **config)
    args = layer_arguments(layer, dtype, packed, initial_states)
    expected = mamba2_float64(layer, **args)
    with torch.inference_mode(), poisoned_allocations():
        got = layer(**args, return_final_states=True)
    errors = layer_errors(got, expected, layer.config.chunk_size)
    tol = layer_tolerance(layer, dtype, "cpu")
    assert "out" in errors and all(err <= tol for err in errors.values()), f"over {tol}: {errors}"
    assert (got.conv_final_states is None) == bool(packed)
    assert layer.describe()["last_call"]["conv"].startswith("triton causal_conv")
    assert kernel_calls == ["conv_forward", "norm_forward"]


def _layer_gradients(layer: Mamba2, args: dict):
    """Gradients of a random projection of the output for u, the conv context and every parameter, and the same
    through the float64 reference."""
    args = {k: v.detach().requires_grad_(k in ("u", "conv_initial_states")) if torch.is_tensor(v) else v
            for k, v in args.items()}
    wrt = [args["u"], args["conv_initial_states"], *layer.parameters()]
    weights = torch.randn(args["u"].shape, dtype=args["u"].dtype, generator=torch.Generator().manual_seed(7))
    got = torch.autograd.grad((layer(**args) * weights).sum(), wrt)
    expected = torch.autograd.grad((mamba2_float64(layer, **args).out * weights.double()).sum(), wrt)
    names = ["u", "conv_initial_states", *(name for name, _ in layer.named_parameters())]
    return {n: rel_err(g, e) for n, g, e in zip(names, got, expected)}, expected


def test_layer_gradients_through_triton_glue_match_float64(kernel_calls):
    """Every parameter's gradient and the input's and the conv context's, through both kernels' backward inside
    the layer (the gradients of z and xBC meeting in in_proj's), packed sequences, float64."""
    layer = build(torch.float64, bias=True)
    args = layer_arguments(layer, torch.float64, "seq_idx", initial_states=True)
    with poisoned_allocations():
        errors, expected = _layer_gradients(layer, args)
    assert all(e.abs().sum() > 0 for e in expected)
    assert all(err <= tolerance(torch.float64) for err in errors.values()), errors
    assert sorted(kernel_calls) == ["conv_backward", "conv_forward", "norm_backward", "norm_forward"]


def test_layer_on_compile_glue_matches_float64():
    """torch.compile of the conv's taps and the norm, forward and gradients, with the conv context (float64)."""
    layer = build(torch.float64, glue="compile")
    args = layer_arguments(layer, torch.float64, initial_states=True)
    errors, expected = _layer_gradients(layer, args)
    assert all(err <= tolerance(torch.float64) for err in errors.values()), errors
    assert layer.describe()["glue"]["name"] == "compile"
    assert layer.describe()["last_call"]["conv"].startswith("torch.compile")


def test_the_language_model_runs_on_triton_glue(kernel_calls):
    from models.mamba2_lm import Mamba2LM, Mamba2LMConfig, lm_float64, next_token_loss

    config = Mamba2LMConfig(vocab_size=50, n_layer=2, layer=LAYER)
    torch.manual_seed(0)
    model = Mamba2LM(config, dtype=torch.float32, glue="triton")
    ids = torch.randint(0, 50, (2, 40), generator=torch.Generator().manual_seed(0))
    params = list(model.parameters())
    got = torch.autograd.grad(model.loss(ids), params)
    expected = torch.autograd.grad(next_token_loss(lm_float64(model, ids), ids), params)
    assert max(rel_err(g, e) for g, e in zip(got, expected)) < 1e-4
    assert model.describe()["glue"]["name"] == "triton"
    assert all(block.mixer.glue.NAME == "triton" for block in model.layers)
    assert kernel_calls.count("conv_backward") == kernel_calls.count("norm_backward") == 2


def test_the_default_glue_is_torch_and_describe_says_which_ran(kernel_calls):
    torch_layer, triton_layer = build(torch.float32, glue="torch"), build(torch.float32)
    assert Mamba2(LAYER).glue.NAME == "torch"
    u = torch.randn(1, 40, LAYER.d_model)
    with torch.no_grad():
        eager = torch_layer(u)
        torch_layer(u, seq_idx=torch.zeros(1, 40, dtype=torch.int32))
        assert not kernel_calls
        same = rel_err(triton_layer(u), eager)
    assert same <= tolerance(torch.float32) and kernel_calls == ["conv_forward", "norm_forward"]
    assert torch_layer.describe()["glue"]["name"] == "torch"
    assert torch_layer.describe()["last_call"]["conv"].startswith("masked taps")
    assert triton_layer.describe()["glue"]["norm"].startswith("triton")
    assert "glue='triton'" in repr(triton_layer)


@pytest.mark.quick
def test_an_unknown_or_unavailable_glue_raises_naming_the_argument(monkeypatch):
    with pytest.raises(ValueError, match="^glue: expected one of \\['compile', 'torch', 'triton'\\]"):
        build(torch.float32, glue="cuda")
    with pytest.raises(BackendUnavailable, match="glue='triton' cannot run: d_conv 5 > 4"):
        build(torch.float32, d_conv=5)
    monkeypatch.setattr(common, "available", lambda: (False, common.NO_DEVICE))
    with pytest.raises(BackendUnavailable, match="glue='triton' cannot run: no CUDA device, and the Triton interp"):
        build(torch.float32)


@pytest.mark.quick
def test_triton_glue_refuses_cpu_tensors_without_the_interpreter(monkeypatch):
    layer = build(torch.float32)
    monkeypatch.setattr(common, "interpreting", lambda: False)
    with torch.no_grad(), pytest.raises(BackendUnavailable, match="glue='triton' cannot run: tensors on the CPU"):
        layer(torch.randn(1, 40, LAYER.d_model))


# --- the floor ------------------------------------------------------------------------------------------------------

@pytest.mark.quick
def test_the_floor_of_the_2p7b_layer():
    """The counts of models/floor.py at Mamba2-2.7B's layer (d_model 2560, d_inner 5120, 80 heads, d_state 128,
    conv_dim 5376, in_proj width 10576) over 8 × 4096 tokens in bf16, priced at round rates."""
    from models.floor import Rates, layer_floor

    config, rates, tokens = Mamba2Config(d_model=2560), Rates(500e12, 2.5e12), 8 * 4096
    floor = layer_floor(config, 8, 4096, rates)
    parts = {p.name: p for p in floor.parts}
    assert parts["in_proj"].flops == 2 * tokens * 2560 * 10576
    assert parts["out_proj"].flops == 2 * tokens * 5120 * 2560
    assert parts["conv"].bytes == 2 * tokens * 5376 * 2 + 5376 * 5 * 2
    assert parts["norm"].bytes == 3 * tokens * 5120 * 2 + 5120 * 2
    assert parts["glue"].bytes == 8 * 5376 * 3 * 2 + 3 * 80 * 4
    gemm_ms = 2 * tokens * (2560 * 10576 + 5120 * 2560) / 500e12 * 1e3
    assert floor.as_dict()["gemm_ms"] == pytest.approx(gemm_ms)
    assert floor.seconds == pytest.approx(floor.gemm_seconds + floor.memory_seconds)
    train = layer_floor(config, 8, 4096, rates, direction="train")
    backward = layer_floor(config, 8, 4096, rates, direction="backward")
    assert train.seconds == pytest.approx(floor.seconds + backward.seconds)
    assert backward.flops == 2 * floor.flops
    assert layer_floor(config, 8, 4096, rates, dtype=torch.float32).bytes == pytest.approx(2 * floor.bytes)


@pytest.mark.quick
def test_the_layer_rows_floor_is_the_floors_parts_per_stage():
    """The layer workload's cost per stage (harness/workloads/mamba2_layer.py) is models/floor.py's forward parts
    grouped by stage, priced serially (GEMMs then bytes): at the same ceilings the two non-SSD stages' floors add up
    to layer_floor's forward, and a stage's frac_floor in the rows is that floor over its median."""
    from harness import cost_model
    from harness.workloads.mamba2_layer import _costs, layer_config
    from impls.problem import Problem, Shape
    from models.floor import Rates, layer_floor

    problem = Problem(Shape(8, 4096, 80, 64, 1, 128, 256), dtype="bfloat16")
    costs = _costs(problem, {"expand": 2, "d_conv": 4})
    assert set(costs) == {"in_proj_conv", "ssd", "norm_out_proj"}
    assert costs["ssd"] == cost_model.costs(problem)["forward"]
    tflops, gbps = 700.0, 3000.0
    floor = layer_floor(layer_config(problem, {"expand": 2, "d_conv": 4}), 8, 4096, Rates(tflops * 1e12, gbps * 1e9))
    stages = [cost_model.floor_seconds(costs[s], "bytes", "flops", tflops, gbps) for s in ("in_proj_conv",
                                                                                           "norm_out_proj")]
    assert sum(stages) == pytest.approx(floor.seconds)
    compute = costs["in_proj_conv"]["flops"] / (tflops * 1e12)
    assert stages[0] > compute > 0 and stages[0] > costs["in_proj_conv"]["bytes"] / (gbps * 1e9) > 0
    derived = cost_model.derived(costs["norm_out_proj"], 2.0, tflops, gbps)
    assert derived["frac_floor"] == pytest.approx(stages[1] / 2e-3)


@pytest.mark.quick
@pytest.mark.parametrize("change, arg", [({"batch": 0}, "batch"), ({"direction": "fwd"}, "direction"),
                                         ({"rates": "fast"}, "rates")], ids=["batch-0", "direction", "rates"])
def test_the_floor_refuses_bad_arguments(change, arg):
    from models.floor import Rates, layer_floor

    kwargs = {"config": LAYER, "batch": 2, "seqlen": 10, "rates": Rates(1e12, 1e12), **change}
    with pytest.raises(ValueError, match=f"^{arg}: expected"):
        layer_floor(**kwargs)


@pytest.mark.quick
def test_measuring_the_rates_needs_cuda():
    from models.floor import measure_rates

    with pytest.raises(RuntimeError, match="^device: measure_rates needs a CUDA device"):
        measure_rates("cpu")
