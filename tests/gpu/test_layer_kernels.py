"""The layer's Triton kernels (models/kernels/) compiled on the GPU, and the layer's non-SSD part beside its floor.

Correctness: each kernel's forward and gradients against torch ops in float64 (tests/models/test_layer_kernels.py's)
at a real size in bf16, outputs NaN-poisoned; the gradients bitwise the same in a second run (no atomics).

Timing (printed, never asserted): the card's matmul rate and DRAM bandwidth (models.floor.measure_rates); each
kernel's time beside its bytes at that bandwidth, for the default tiles and candidates; the Mamba2-2.7B layer at
8 × 4096 in bf16 with glue "torch", "triton" and "compile" (its SSD on our Triton backend), each first checked
against glue "torch" on the same inputs: the layer, the SSD call alone, the non-SSD part (the calls before and
after the SSD: `ssd_call` and `finish`) and its ratio to the floor; then the training direction (forward and
backward of the layer, less the SSD's forward and backward).

    python -m pytest -s tests/gpu/test_layer_kernels.py
"""

from __future__ import annotations

import pytest
import torch

from impls.tolerance import poisoned_allocations, rel_err, tolerance
from models.kernels import causal_conv, gated_norm
from models.mamba2 import Mamba2Config
from tests.models.test_layer_kernels import conv_float64, norm_float64

BF16 = torch.bfloat16
# Mamba2-2.7B's layer: d_model 2560, d_inner 5120, 80 heads of 64, d_state 128, one group, chunk 256
CONFIG = Mamba2Config(d_model=2560)
D_MODEL, D_INNER, CONV_DIM, NHEADS = CONFIG.d_model, CONFIG.d_inner, CONFIG.conv_dim, CONFIG.nheads
IN_PROJ = sum(CONFIG.in_proj_sizes)
BATCH, SEQLEN = 8, 4096


def _grads(fn, inputs, dout):
    leaves = [None if t is None else t.detach().requires_grad_(True) for t in inputs]
    out = fn(*leaves)
    return out, torch.autograd.grad(out, [t for t in leaves if t is not None], dout.to(out.dtype))


@pytest.mark.parametrize("packed", [False, True], ids=["context", "seq_idx-context"])
def test_conv_kernels_match_float64_at_the_2p7b_width(packed):
    gen = torch.Generator(device="cuda").manual_seed(0)
    batch, seqlen = 2, 4096
    proj = torch.randn(batch, seqlen, IN_PROJ, device="cuda", generator=gen).to(BF16)
    x = proj[..., D_INNER:D_INNER + CONV_DIM]  # as the layer hands it over: a view of in_proj's output
    weight = (0.5 * torch.randn(CONV_DIM, 1, 4, device="cuda", generator=gen)).to(BF16)
    bias = torch.randn(CONV_DIM, device="cuda", generator=gen).to(BF16)
    context = torch.randn(batch, CONV_DIM, 3, device="cuda", generator=gen).to(BF16)
    seq_idx = None
    if packed:
        seq_idx = torch.tensor([[0] * 1000 + [1] * 2000 + [2] * 1096, [1] * 7 + [2] * 4089], dtype=torch.int32,
                               device="cuda")
    dout = torch.randn(batch, seqlen, CONV_DIM, device="cuda", dtype=torch.float64, generator=gen)
    inputs = [x, weight, bias, context]
    with poisoned_allocations():
        out, grads = _grads(lambda *t: causal_conv.CausalConvSiLU.apply(*t, seq_idx), inputs, dout)
    expected, expected_grads = _grads(lambda *t: conv_float64(*t, seq_idx), [t.double() for t in inputs], dout)
    errors = {"out": rel_err(out, expected)}
    errors.update({n: rel_err(g, e) for n, g, e in zip(("dx", "dweight", "dbias", "dcontext"), grads,
                                                       expected_grads)})
    print(f"[conv bf16 {'seq_idx' if packed else 'plain'}] {errors}")
    assert all(err <= tolerance(BF16) for err in errors.values()), errors
    _, again = _grads(lambda *t: causal_conv.CausalConvSiLU.apply(*t, seq_idx), inputs, dout)
    assert all(torch.equal(a, b) for a, b in zip(grads, again)), "the gradients differ between two runs"


@pytest.mark.parametrize("ngroups, norm_before_gate", [(1, False), (8, False), (1, True)],
                         ids=["1-group", "8-groups", "1-group-norm-first"])
def test_gated_norm_kernels_match_float64_at_the_2p7b_width(ngroups, norm_before_gate):
    gen = torch.Generator(device="cuda").manual_seed(1)
    rows = 2 * 4096
    y = torch.randn(rows, D_INNER, device="cuda", generator=gen).to(BF16)
    z = torch.randn(rows, 2 * D_INNER + 336, device="cuda", generator=gen).to(BF16)[:, :D_INNER]
    weight = (1 + 0.5 * torch.randn(D_INNER, device="cuda", generator=gen)).to(BF16)
    dout = torch.randn(rows, D_INNER, device="cuda", dtype=torch.float64, generator=gen)
    group = D_INNER // ngroups
    with poisoned_allocations():
        out, grads = _grads(lambda *t: gated_norm.gated_rms_norm(*t, 1e-5, group, norm_before_gate),
                            [y, z, weight], dout)
    expected, expected_grads = _grads(lambda *t: norm_float64(*t, 1e-5, group, norm_before_gate),
                                      [y.double(), z.double(), weight.double()], dout)
    errors = {"out": rel_err(out, expected)}
    errors.update({n: rel_err(g, e) for n, g, e in zip(("dy", "dz", "dweight"), grads, expected_grads)})
    print(f"[norm bf16 ngroups {ngroups} norm_before_gate {norm_before_gate}] {errors}")
    assert all(err <= tolerance(BF16) for err in errors.values()), errors
    _, again = _grads(lambda *t: gated_norm.gated_rms_norm(*t, 1e-5, group, norm_before_gate), [y, z, weight], dout)
    assert all(torch.equal(a, b) for a, b in zip(grads, again)), "the gradients differ between two runs"


# --- timing (printed) ----------------------------------------------------------------------------------------------

def _ms(fn) -> float:
    from harness.timing import gpu_times

    return gpu_times(fn, warmup_ms=25, rep_ms=200, cuda_graph=False)["median_ms"]


def _rates():
    from models.floor import measure_rates

    tokens = BATCH * SEQLEN
    at_in_proj = measure_rates(gemm=(tokens, IN_PROJ, D_MODEL))
    square = measure_rates()
    best = max((at_in_proj, square), key=lambda r: r.matmul_flops_per_s)
    print(f"[rates] in_proj shape {at_in_proj.matmul_flops_per_s / 1e12:.0f} TFLOP/s, 8192³ "
          f"{square.matmul_flops_per_s / 1e12:.0f} TFLOP/s (the floor takes the higher); DRAM "
          f"{best.dram_bytes_per_s / 1e9:.0f} GB/s; {best.source}")
    return best


# candidates printed beside the defaults (causal_conv.FWD_TILE, BWD_TILE; gated_norm.BWD_PROGRAMS)
FWD_TILES = [(16, 128, 4), (32, 128, 4), (8, 256, 4), (32, 64, 4), (16, 256, 8)]
BWD_TILES = [(8, 64, 4), (16, 64, 4), (16, 128, 8), (32, 64, 8), (8, 128, 4)]
NORM_BWD_PROGRAMS = [512, 1024, 2048, 4096]


def test_kernel_times_beside_their_bytes():
    """Each kernel at the 2.7B layer's 8 × 4096 tokens: its time and the bandwidth its least bytes imply, for the
    default tiles and the candidates (each first checked against the defaults' result)."""
    from models.floor import measure_rates

    bandwidth = measure_rates(gemm=(1024, 1024, 1024)).dram_bytes_per_s
    tokens, e = BATCH * SEQLEN, 2
    proj = torch.randn(BATCH, SEQLEN, IN_PROJ, device="cuda").to(BF16)
    x, z = proj[..., D_INNER:D_INNER + CONV_DIM], proj[..., :D_INNER].reshape(tokens, D_INNER)
    weight, bias = torch.randn(CONV_DIM, 1, 4, device="cuda").to(BF16), torch.randn(CONV_DIM, device="cuda").to(BF16)
    dconv = torch.randn(BATCH, SEQLEN, CONV_DIM, device="cuda").to(BF16)
    y, w = torch.randn(tokens, D_INNER, device="cuda").to(BF16), torch.ones(D_INNER, device="cuda").to(BF16)
    dnorm = torch.randn(tokens, D_INNER, device="cuda").to(BF16)
    _, rstd = gated_norm.norm_forward(y, z, w, 1e-5, D_INNER, False)
    conv_bytes, norm_bytes = tokens * CONV_DIM * e, tokens * D_INNER * e
    cases = {"conv forward": [(f"tile {t}", lambda t=t: causal_conv.conv_forward(x, weight, bias, None, None, t),
                               2 * conv_bytes) for t in [None, *FWD_TILES]],
             "conv backward": [(f"tile {t}", lambda t=t: causal_conv.conv_backward(x, weight, bias, None, None, dconv,
                                                                                   False, t), 3 * conv_bytes)
                               for t in [None, *BWD_TILES]],
             "norm forward": [("", lambda: gated_norm.norm_forward(y, z, w, 1e-5, D_INNER, False), 3 * norm_bytes)],
             "norm backward": [(f"programs {p}", lambda p=p: gated_norm.norm_backward(y, z, w, rstd, dnorm, D_INNER,
                                                                                      False, p), 5 * norm_bytes)
                               for p in [None, *NORM_BWD_PROGRAMS]]}
    for name, candidates in cases.items():
        default = _flat(candidates[0][1]())
        for label, fn, moved in candidates:
            err = rel_err(_flat(fn()), default)
            assert err <= tolerance(BF16), f"{name} {label}: {err} against the defaults"
            ms = _ms(fn)
            floor_ms = moved / bandwidth * 1e3
            print(f"[{name} {label or 'default'}{' (default)' if label.endswith('None') else ''}] {ms:.3f} ms, "
                  f"floor {floor_ms:.3f} ms ({ms / floor_ms:.2f}x), {moved / ms / 1e6:.0f} GB/s of "
                  f"{bandwidth / 1e9:.0f}")


def _flat(result) -> torch.Tensor:
    """A kernel's outputs as one float64 vector (for comparing a candidate's against the defaults')."""
    parts = result if isinstance(result, tuple) else (result,)
    return torch.cat([p.double().flatten() for p in parts if p is not None])


def _layer(glue: str):
    import impls
    from models.mamba2 import Mamba2

    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            layer = Mamba2(CONFIG, "triton", device="cuda", dtype=BF16, glue=glue)
    except impls.BackendUnavailable as exc:
        pytest.skip(str(exc))
    return layer


def test_the_non_ssd_part_of_the_2p7b_layer_beside_its_floor():
    from models.floor import layer_floor

    rates = _rates()
    u = torch.randn(BATCH, SEQLEN, D_MODEL, device="cuda").to(BF16)
    floors = {d: layer_floor(CONFIG, BATCH, SEQLEN, rates, BF16, d) for d in ("forward", "train")}
    print(f"[floor forward] {floors['forward'].as_dict()}")
    print(f"[floor train] {floors['train'].as_dict()}")
    state = _layer("torch").state_dict()
    reference = None
    for glue in ("torch", "triton", "compile"):
        layer = _layer(glue)
        layer.load_state_dict(state)
        with torch.inference_mode():
            out = layer(u)
        reference = out if reference is None else reference
        err = rel_err(out, reference)
        assert err <= tolerance(BF16), f"glue {glue!r} against 'torch': {err}"
        t = _forward_ms(layer, u)
        non_ssd, floor = t["before"] + t["after"], floors["forward"].seconds * 1e3
        print(f"[glue {glue} forward] layer {t['layer']:.3f} ms, SSD {t['ssd']:.3f} ms, non-SSD {non_ssd:.3f} ms "
              f"(before the SSD {t['before']:.3f}, after {t['after']:.3f}; layer − SSD {t['layer'] - t['ssd']:.3f}), "
              f"floor {floor:.3f} ms: {non_ssd / floor:.2f}x (target 1.3x); err vs torch {err:.2e}")
        train_ms, ssd_train_ms = _train_ms(layer, u)
        floor = floors["train"].seconds * 1e3
        print(f"[glue {glue} train] layer forward+backward {train_ms:.3f} ms, SSD forward+backward "
              f"{ssd_train_ms:.3f} ms, non-SSD {train_ms - ssd_train_ms:.3f} ms, floor {floor:.3f} ms: "
              f"{(train_ms - ssd_train_ms) / floor:.2f}x")


def _forward_ms(layer, u) -> dict[str, float]:
    """Under inference mode: the layer, its SSD call alone, the calls before it (in_proj, conv) and after it (norm,
    out_proj)."""
    import impls

    with torch.inference_mode():
        call = layer.ssd_call(u)
        y = impls.ssd_forward(**call.kwargs, backend=layer.backend).y
        return {"layer": _ms(lambda: layer(u)),
                "ssd": _ms(lambda: impls.ssd_forward(**call.kwargs, backend=layer.backend)),
                "before": _ms(lambda: layer.ssd_call(u)), "after": _ms(lambda: layer.finish(y, call.z))}


def _train_ms(layer, u) -> tuple[float, float]:
    """The layer's forward and backward (gradients of u and every parameter), and its SSD call's alone."""
    import impls

    u = u.detach().requires_grad_(True)
    dout = torch.randn_like(u)
    params = [u, *layer.parameters()]
    layer_ms = _ms(lambda: torch.autograd.grad(layer(u), params, dout))
    call = layer.ssd_call(u)
    kwargs = {k: v.detach().requires_grad_(v.is_floating_point()) if torch.is_tensor(v) else v
              for k, v in call.kwargs.items()}
    wrt = [v for v in kwargs.values() if torch.is_tensor(v) and v.requires_grad]
    dy = torch.randn(*kwargs["x"].shape, device="cuda", dtype=BF16)
    ssd_ms = _ms(lambda: torch.autograd.grad(impls.ssd(**kwargs, backend=layer.backend).y, wrt, dy))
    return layer_ms, ssd_ms
