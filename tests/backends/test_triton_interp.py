"""The Triton backend under the Triton interpreter (CPU) against the float64 reference.

What runs here: every switch combination (transposed_layout x operand_swap x exp2) in fp32 and fp16 on a problem
that uses most of the contract at once (seqlen not a multiple of chunk_size, ngroups dividing nheads, seq_idx with
3 sequences, initial states, z, per-channel D, a strided x), each stage's output checked; the rest of the contract on
the covering cases every backend runs (tests/interface/test_contract.py), and here what only Triton's paths have
(several tiles per program dimension, x/z/B/C/dt as views of one fused projection, stage outputs chained with the
reference backend's); the tuning modes; switch errors. Outputs are NaN-poisoned
(impls.tolerance.poisoned_allocations). The full factorial (x cb_precision x 3 problems) is marked slow.

bf16 is GPU-only: the interpreter computes bf16 dots wrongly (triton-lang/triton#11584). The interpreter also
ignores tl.dot's input_precision, so fp32 results are held to the plain fp32 tolerance (tighter than tf32's).

TRITON_INTERPRET must be set before the backend's kernels are defined: tests/conftest.py sets it for the CPU
suite; if impls.triton was already imported compiled (a GPU run), this module skips.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import subprocess
import sys
from pathlib import Path

if "impls.triton" not in sys.modules:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

import impls  # noqa: E402
from impls.inputs import make_inputs  # noqa: E402
from impls.problem import Problem, Shape  # noqa: E402
from impls.registry import get_backend  # noqa: E402
from impls.tolerance import poisoned_allocations, rel_err, tolerance  # noqa: E402
from impls.triton import descriptors  # noqa: E402
from impls.triton.clamp import clamp  # noqa: E402
from impls.triton.fallbacks import FALLBACK, fallback  # noqa: E402
from impls.triton.occupancy import maxnreg  # noqa: E402
from impls.triton.smem import SMEM_BUDGET, compute_out_smem  # noqa: E402
from impls.triton.space import search_space  # noqa: E402
from impls.triton.stages import FUSED, STAGES  # noqa: E402
from impls.triton.target import interpreting  # noqa: E402
from tests.common import failures, float64_forward, forward_errors  # noqa: E402

pytestmark = pytest.mark.skipif(not interpreting(), reason="impls.triton was imported without TRITON_INTERPRET=1"
                                " (its kernels are compiled, not interpreted): run the CPU suite on its own")

DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.float16, id="fp16")]
RICH = Problem(Shape(1, 70, 4, 16, 2, 16, 32), has_z=True, has_initial_states=True, nseqs=3, D_per_channel=True)
BOOL_SWITCHES = ("transposed_layout", "operand_swap", "exp2")


def _combo_id(values) -> str:
    return "-".join(f"{'' if v else 'no_'}{k}" for k, v in zip(BOOL_SWITCHES, values))


COMBOS = [pytest.param(dict(zip(BOOL_SWITCHES, v)), id=_combo_id(v))
          for v in itertools.product((True, False), repeat=3)]


def transposed_x(inputs):
    """x with headdim not the fastest dimension (memory (batch, seqlen, headdim, nheads))."""
    b, l, h, p = inputs.x.shape
    storage = torch.empty(b, l, p, h, dtype=inputs.x.dtype)
    storage.copy_(inputs.x.transpose(-1, -2))
    inputs.x = storage.transpose(-1, -2)
    assert not inputs.x.is_contiguous()
    return inputs


def fused_projection(inputs):
    """z, x, B, C, dt as column slices of one (batch, seqlen, width) tensor, as Mamba-2's in_proj returns them."""
    b, l, h, p = inputs.x.shape
    g, n = inputs.B.shape[2:]
    widths = [h * p, h * p, g * n, g * n, h]
    proj = torch.randn(b, l, sum(widths) + 3, dtype=inputs.x.dtype)
    offsets = [3 + sum(widths[:i]) for i in range(len(widths))]
    z, x, B, C, dt = (proj[..., o: o + w] for o, w in zip(offsets, widths))
    for view, value in ((z, inputs.z), (x, inputs.x), (B, inputs.B), (C, inputs.C), (dt, inputs.dt)):
        view.copy_(value.reshape(b, l, -1))
    inputs.z, inputs.x = z.view(b, l, h, p), x.view(b, l, h, p)
    inputs.B, inputs.C, inputs.dt = B.view(b, l, g, n), C.view(b, l, g, n), dt
    assert not any(t.is_contiguous() for t in (inputs.x, inputs.z, inputs.B, inputs.C, inputs.dt))
    return inputs


def forward_stage_errors(backend, inputs, ref) -> tuple[dict[str, float], impls.ForwardResult]:
    """The full forward's output and every stage's intermediate (chained: each stage fed the previous one)."""
    with poisoned_allocations():
        out = impls.ssd_forward(**inputs.forward_kwargs(), backend=backend)
    errors = {
        "chunk_cumsum.dt": rel_err(out.dt, ref.dt),
        "chunk_cumsum.dA_cumsum": rel_err(out.dA_cumsum, ref.dA_cumsum),
        "fwd_pass_state.states": rel_err(out.states, ref.states),
        "fwd_pass_state.final_states": rel_err(out.final_states, ref.final_states),
        "compute_out.y": rel_err(out.y, ref.y),
    }
    if ref.varlen_states is not None:
        errors["varlen_states"] = rel_err(out.varlen_states, ref.varlen_states)
    return errors, out


# --- every switch combination ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("switches", COMBOS)
def test_switch_combinations(switches, dtype):
    backend = get_backend("triton", **switches)
    inputs = transposed_x(make_inputs(RICH, seed=3, dtype=dtype))
    errors, out = forward_stage_errors(backend, inputs, float64_forward(inputs))
    assert not failures(errors, dtype), errors
    # the switch decides the memory order of the states: dstate-major means headdim has stride 1
    assert (out.states.stride(-2) == 1) == switches["transposed_layout"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", [pytest.param({}, id="defaults", marks=pytest.mark.quick),  # the quick tier
                                     pytest.param({k: False for k in BOOL_SWITCHES}, id="all-off")])
def test_each_stage_alone(variant, dtype):
    """Each stage fed the float64 reference's intermediates (tests.common.forward_errors), so errors cannot hide
    behind one another; the full forward and its final states too."""
    backend = get_backend("triton", **variant)
    inputs = make_inputs(RICH, seed=4, dtype=dtype)
    errors = forward_errors(backend, inputs, float64_forward(inputs))
    assert not failures(errors, dtype), errors


def test_cb_precision_fp32_maps_to_ieee():
    x = torch.zeros(1, 1, 1, 1)
    assert get_backend("triton", cb_precision="fp32")._dot_precision(x) == "ieee"
    assert get_backend("triton")._dot_precision(x) == "tf32"
    assert get_backend("triton", cb_precision="fp32")._dot_precision(x.half()) == "tf32"  # fp16: Triton's default
    inputs = make_inputs(RICH, seed=5, dtype=torch.float32)
    errors, _ = forward_stage_errors(get_backend("triton", cb_precision="fp32"), inputs, float64_forward(inputs))
    assert not failures(errors, torch.float32), errors


# --- the contract on Triton's own paths (the covering cases of every backend: tests/interface/test_contract.py) -------
SMALL = Shape(1, 70, 4, 16, 2, 16, 32)
CASES = [
    pytest.param(Problem(Shape(1, 100, 2, 32, 1, 32, 64), has_initial_states=True),
                 {"block_rows": 32, "block_positions": 16, "block_headdim": 16, "block_dstate": 16}, None,
                 id="several-tiles-pinned"),
    pytest.param(Problem(SMALL, has_z=True, nseqs=2), {}, "fused", id="fused-projection-views"),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("problem,switches,layout", CASES)
def test_contract(problem, switches, layout, dtype):
    backend = get_backend("triton", **switches)
    inputs = make_inputs(problem, seed=11, dtype=dtype)
    if layout == "fused":
        inputs = fused_projection(inputs)
    errors = forward_errors(backend, inputs, float64_forward(inputs))
    assert not failures(errors, dtype), errors


@pytest.mark.parametrize("exp2", [True, False], ids=["exp2", "exp"])
def test_softplus_is_accurate_at_every_step_size(exp2):
    """dt = softplus(v) from ~1e-7 to 25 (small steps included, where log(1 + e) loses ~1e-4): within a few fp32
    ulps of float64, element by element."""
    v = torch.linspace(-16.0, 25.0, 4096).reshape(1, 4096, 1)
    dt, _ = get_backend("triton", exp2=exp2).chunk_cumsum(v, -torch.ones(1), 64, None, True, (0.0, math.inf))
    exact = torch.nn.functional.softplus(v.double(), threshold=20.0).reshape(1, 1, 64, 64)
    assert ((dt.double() - exact).abs() / exact).max() < 2e-6


SHARED_CB_CASES = [
    pytest.param(RICH, id="rich"),
    pytest.param(Problem(SMALL, varlen=True, nseqs=3, has_z=True), id="cu_seqlens-3-seqs"),
    pytest.param(Problem(dataclasses.replace(SMALL, ngroups=4)), id="ngroups-eq-nheads"),
    pytest.param(Problem(dataclasses.replace(SMALL, seqlen=20)), id="seqlen-below-chunk"),
    pytest.param(Problem(Shape(1, 100, 2, 32, 1, 32, 128)), id="chunk128-two-cb-tiles"),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("swap", [pytest.param(True, id="swap"), pytest.param(False, id="no-swap")])
@pytest.mark.parametrize("problem", SHARED_CB_CASES)
def test_shared_cb(problem, swap, dtype):
    """C·Bᵀ once per group (cb_kernel) read back by every head: each stage against the float64 reference."""
    backend = get_backend("triton", cb_mode="shared", operand_swap=swap)
    inputs = make_inputs(problem, seed=6, dtype=dtype)
    errors = forward_errors(backend, inputs, float64_forward(inputs))
    assert not failures(errors, dtype), errors


# switch cb_lower_triangle: chunks of 128 (2 x 2 C·Bᵀ tiles, the one above the diagonal left NaN in the poisoned
# buffer); 128-row programs span both tile rows, so their loads cover the unwritten tile unless masked
CB_LOWER_CASES = [
    pytest.param({"block_rows": 128, "block_positions": 32}, {}, id="rows128"),
    pytest.param({"block_rows": 128, "block_positions": 64}, {"operand_swap": True}, id="rows128-swap"),
    pytest.param({"block_rows": 64, "block_positions": 32}, {"decay_factor": True}, id="rows64-decay_factor"),
    pytest.param({"block_rows": 128, "block_positions": 32, "heads_per_tile": 2}, {"decay_factor": True},
                 id="rows128-heads2-decay_factor"),
]


@pytest.mark.parametrize("sizes, switches", CB_LOWER_CASES)
def test_shared_cb_lower_triangle_reads_only_the_written_tiles(sizes, switches):
    """The C·Bᵀ tiles above the diagonal stay unwritten (poisoned): each stage still matches float64."""
    backend = get_backend("triton", cb_mode="shared", cb_lower_triangle=True, **sizes, **switches)
    inputs = make_inputs(Problem(Shape(1, 200, 2, 16, 1, 16, 128), has_z=True), seed=6, dtype=torch.float32)
    errors = forward_errors(backend, inputs, float64_forward(inputs))
    assert not failures(errors, torch.float32), errors


@pytest.mark.parametrize("lower", [False, True], ids=["full", "lower"])
def test_cb_matrix_writes_the_tiles_it_launches(lower):
    from impls.triton.compute_out import cb_matrix

    g = torch.Generator().manual_seed(3)
    C, B = (torch.randn(1, 256, 1, 16, generator=g) for _ in range(2))
    with poisoned_allocations():
        cb = cb_matrix(C, B, 256, lambda shape, dtype, device: torch.empty(shape, dtype=dtype, device=device),
                       "ieee", "triton", lower)
    want = C[0, :, 0].double() @ B[0, :, 0].double().T
    for i, j in itertools.product(range(4), repeat=2):
        tile = cb[0, 0, 0, 64 * i:64 * (i + 1), 64 * j:64 * (j + 1)]
        if lower and j > i:
            assert torch.isnan(tile).all(), (i, j)
        else:
            torch.testing.assert_close(tile.double(), want[64 * i:64 * (i + 1), 64 * j:64 * (j + 1)], rtol=1e-5,
                                       atol=1e-4)


@pytest.mark.parametrize("switches", [{"cb_lower_triangle": True},
                                      {"cb_lower_triangle": True, "cb_mode": "shared", "fuse_state_out": True,
                                       "fused_program": "chunk"}], ids=["inline", "fused"])
def test_cb_lower_triangle_refused_where_compute_outs_cb_kernel_does_not_run(switches):
    with pytest.raises(ValueError, match="cb_lower_triangle"):
        get_backend("triton", **switches)


DECAY_FACTOR_CASES = [
    pytest.param(RICH, {}, id="rich"),  # seq_idx with 3 sequences: the sequence mask on factored tiles
    pytest.param(Problem(SMALL, varlen=True, nseqs=3, has_z=True), {}, id="cu_seqlens-3-seqs"),
    pytest.param(Problem(dataclasses.replace(SMALL, seqlen=20)), {}, id="seqlen-below-chunk"),
    pytest.param(Problem(Shape(1, 100, 2, 32, 1, 32, 64), has_initial_states=True),
                 {"block_rows": 32, "block_positions": 16}, id="rows32-positions16"),
    pytest.param(Problem(Shape(1, 100, 2, 32, 1, 32, 64)), {"block_rows": 16, "block_positions": 32},
                 id="rows16-positions32"),  # a source tile straddles the row tile: it stays masked
    pytest.param(Problem(SMALL, dt_limit=(0.005, 0.05)), {"cb_mode": "shared"}, id="dt_limit-shared-cb"),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("swap", [pytest.param(True, id="swap"), pytest.param(False, id="no-swap")])
@pytest.mark.parametrize("problem,switches", DECAY_FACTOR_CASES)
def test_decay_factor(problem, switches, swap, dtype):
    """The factored decay on source tiles before the row tile: each stage against the float64 reference."""
    backend = get_backend("triton", decay_factor=True, operand_swap=swap, **switches)
    inputs = make_inputs(problem, seed=7, dtype=dtype)
    errors = forward_errors(backend, inputs, float64_forward(inputs))
    assert not failures(errors, dtype), errors


def _dt_zero(inputs):
    """dt = 0 at every third position (no softplus, no bias, no dt_limit: stage 1 passes it through as 0)."""
    inputs.dt[:, ::3] = 0.0
    return inputs


# switch decay_single (with decay_factor): the state term enters the factored sum, so initial states throughout
DECAY_SINGLE_CASES = [
    pytest.param(RICH, {}, None, id="rich"),  # seq_idx with 3 sequences, z, D per channel, initial states
    pytest.param(Problem(Shape(1, 100, 2, 32, 1, 32, 64), has_initial_states=True),
                 {"block_rows": 32, "block_positions": 16}, None, id="rows32-positions16"),
    pytest.param(Problem(Shape(1, 100, 2, 32, 1, 32, 64), has_initial_states=True),
                 {"block_rows": 16, "block_positions": 32}, None, id="rows16-positions32"),
    pytest.param(Problem(Shape(1, 100, 4, 32, 1, 32, 64), nseqs=2, has_initial_states=True),
                 {"heads_per_tile": 2, "block_rows": 32, "block_positions": 16, "exp_fold": True}, None,
                 id="heads2-exp_fold"),
    pytest.param(Problem(Shape(1, 100, 2, 32, 1, 32, 64), has_initial_states=True, dt_softplus=False,
                         has_dt_bias=False), {"exp_fold": True, "cb_mode": "shared", "block_rows": 32}, _dt_zero,
                 id="dt-zero-exp_fold-shared-cb"),
]


@pytest.mark.filterwarnings("ignore:divide by zero encountered in log")
@pytest.mark.parametrize("swap", [pytest.param(True, id="swap"), pytest.param(False, id="no-swap")])
@pytest.mark.parametrize("problem,switches,edit", DECAY_SINGLE_CASES)
def test_decay_single(problem, switches, edit, swap):
    """The factored decay in the one accumulator (the state term scaled by exp(dA_ref), the factored tiles summed
    onto it, one row scale): each stage and the forward against the float64 reference, fp32: with seq_idx, z, D per
    channel, a short last chunk, source tiles narrower and wider than the row tile, two heads per program with the
    fold, and dt = 0 at a third of the positions with the fold and the shared C·Bᵀ."""
    inputs = make_inputs(problem, seed=7, dtype=torch.float32)
    if edit is not None:
        inputs = edit(inputs)
    backend = get_backend("triton", decay_factor=True, decay_single=True, operand_swap=swap, **switches)
    errors = forward_errors(backend, inputs, float64_forward(inputs))
    assert not failures(errors, torch.float32), errors


@pytest.mark.parametrize("switches", [{"decay_single": True},
                                      {"decay_single": True, "decay_factor": True, "fuse_state_out": True}],
                         ids=["without-decay_factor", "fused"])
def test_decay_single_refusals(switches):
    with pytest.raises(ValueError, match="decay_single"):
        get_backend("triton", **switches)


# --- tensor-descriptor (TMA) loads and the fused arrangement ---------------------------------------------------
TMA_CASES = [
    pytest.param({}, RICH, DTYPES, id="swap-transposed"),
    pytest.param({"operand_swap": False, "transposed_layout": False, "exp2": False}, RICH, DTYPES, id="all-off"),
    pytest.param({"decay_factor": True, "operand_swap": False}, Problem(Shape(1, 100, 2, 32, 1, 32, 64)),
                 DTYPES[:1], id="decay_factor-no-swap-chunk64"),
    pytest.param({"cb_mode": "shared"}, Problem(SMALL, varlen=True, nseqs=3, has_z=True), DTYPES[:1],
                 id="cb-shared-cu_seqlens"),
    # descriptors made on the host (TensorDescriptor kernel arguments; the interpreter runs them)
    pytest.param({"tma_descriptors": "host"}, RICH, DTYPES, id="host-swap-transposed"),
    pytest.param({"tma_descriptors": "host", "operand_swap": False, "transposed_layout": False, "exp2": False}, RICH,
                 DTYPES[:1], id="host-all-off"),
    pytest.param({"tma_descriptors": "host", "heads_per_tile": 2, "decay_factor": True},
                 Problem(Shape(1, 100, 4, 32, 1, 32, 64), nseqs=2, has_z=True), DTYPES[:1],
                 id="host-heads2-decay_factor"),
]


@pytest.mark.parametrize("switches,problem,dtypes", TMA_CASES)
def test_tma(switches, problem, dtypes):
    """Tensor-descriptor loads and stores (contiguous inputs): each stage against the float64 reference."""
    backend = get_backend("triton", tma=True, **switches)
    for dtype in [d.values[0] for d in dtypes]:
        inputs = make_inputs(problem, seed=8, dtype=dtype)
        errors = forward_errors(backend, inputs, float64_forward(inputs))
        assert not failures(errors, dtype), (dtype, errors)


def test_tma_refuses_tensors_a_descriptor_cannot_read():
    """x, B, C as unaligned column slices of one projection: tma set (with in-kernel descriptors) raises naming
    the tensor, before any kernel (the caller's switch is not replaced by the next arrangement of the defaults)."""
    inputs = fused_projection(make_inputs(Problem(SMALL, has_z=True), seed=9, dtype=torch.float32))
    tma = get_backend("triton", tma=True, tma_descriptors="device")
    with pytest.raises(ValueError, match=r"switch 'tma' of backend 'triton': x: its data pointer is not 16-byte"):
        impls.ssd_forward(**inputs.forward_kwargs(), backend=tma)
    inputs = transposed_x(make_inputs(Problem(SMALL), seed=9, dtype=torch.float32))
    with pytest.raises(ValueError, match=r"x: its last dimension has stride"):
        impls.ssd_forward(**inputs.forward_kwargs(), backend=tma)


@pytest.mark.parametrize("state_pass,stage2", [pytest.param("chunk_parallel", ["B", "chunk-local states", "x"],
                                                             id="chunk_parallel"),
                                              pytest.param("serial", ["B", "x"], id="serial")])
def test_tma_host_descriptors_are_kernel_arguments(monkeypatch, state_pass, stage2):
    """tma_descriptors='host' builds compute_out's five descriptors and stage 2's (chunk_state's three, or the
    serial kernel's x and B) on the host, once per launch, with the launch's boxes."""
    made = []
    real = descriptors.host
    monkeypatch.setattr(descriptors, "host", lambda tensors, path: made.append(real(tensors, path)) or made[-1])
    inputs = make_inputs(Problem(SMALL), seed=9, dtype=torch.float32)
    impls.ssd_forward(**inputs.forward_kwargs(),
                      backend=get_backend("triton", tma=True, tma_descriptors="host", state_pass=state_pass))
    assert [sorted(m) for m in made] == [stage2, ["B", "C", "states", "x", "y"]]
    assert all(isinstance(d, TensorDescriptor) for m in made for d in m.values())
    assert made[1]["C"].block_shape == [1, 16, 1, 16] and made[1]["x"].block_shape == [1, 16, 1, 16]


def test_tma_host_refuses_what_it_cannot_run():
    """Host descriptors: unaligned tensors raise naming the tensor; without tma (the declared values: the
    interpreter's defaults turn it on) the backend refuses at construction."""
    inputs = fused_projection(make_inputs(Problem(SMALL, has_z=True), seed=9, dtype=torch.float32))
    with pytest.raises(ValueError, match=r"'tma' with tma_descriptors='host' of backend 'triton': x: its data "):
        impls.ssd_forward(**inputs.forward_kwargs(), backend=get_backend("triton", tma=True, tma_descriptors="host"))
    with pytest.raises(ValueError, match=r"tma_descriptors='host'.*with tma=False there are none"):
        get_backend("triton", preset="declared", tma_descriptors="host")



FUSED_CASES = [
    pytest.param({}, RICH, id="rich-swap-transposed"),  # seq_idx 3 sequences, initial states, z, per-channel D
    pytest.param({"operand_swap": False, "transposed_layout": False, "exp2": False}, RICH, id="rich-all-off"),
    pytest.param({"block_rows": 16, "block_positions": 16, "block_headdim": 16},
                 Problem(Shape(2, 150, 2, 32, 1, 32, 64), has_initial_states=True), id="4-row-tiles-2-headdim-tiles"),
    pytest.param({}, Problem(SMALL, varlen=True, nseqs=3, has_z=True), id="cu_seqlens-3-seqs"),
    pytest.param({"tma": True, "decay_factor": True}, Problem(Shape(1, 100, 2, 32, 1, 32, 64), nseqs=2),
                 id="tma-decay_factor"),
    pytest.param({}, Problem(dataclasses.replace(SMALL, seqlen=20), state_dtype="float32"),
                 id="one-chunk-fp32-states"),
    # fused_program='chunk': one program per (chunk, batch, head, headdim tile) walking the chunk's row tiles
    pytest.param({"fused_program": "chunk"}, RICH, id="chunk-rich-swap-transposed"),
    pytest.param({"fused_program": "chunk", "operand_swap": False, "transposed_layout": False, "exp2": False}, RICH,
                 id="chunk-rich-all-off"),
    pytest.param({"fused_program": "chunk", "block_rows": 16, "block_positions": 16, "block_headdim": 16},
                 Problem(Shape(2, 150, 2, 32, 1, 32, 64), has_initial_states=True),
                 id="chunk-4-row-tiles-2-headdim-tiles-short-last-chunk"),
    pytest.param({"fused_program": "chunk"}, Problem(SMALL, varlen=True, nseqs=3, has_z=True),
                 id="chunk-cu_seqlens-3-seqs"),
    pytest.param({"fused_program": "chunk", "tma": True, "tma_descriptors": "host", "decay_factor": True},
                 Problem(Shape(1, 100, 2, 32, 1, 32, 64), nseqs=2), id="chunk-tma-host-decay_factor"),
    pytest.param({"fused_program": "chunk"}, Problem(dataclasses.replace(SMALL, seqlen=20), state_dtype="float32"),
                 id="chunk-one-short-chunk-fp32-states"),
    pytest.param({"fused_program": "chunk", "cb_mode": "shared"}, RICH, id="chunk-shared-cb-rich"),
    pytest.param({"fused_program": "chunk", "cb_mode": "shared", "tma": True, "tma_descriptors": "host",
                  "operand_swap": False}, Problem(Shape(2, 150, 4, 32, 2, 32, 64), has_initial_states=True),
                 id="chunk-shared-cb-tma-host-no-swap"),
    pytest.param({"tma": True, "tma_descriptors": "host"}, Problem(Shape(1, 100, 2, 32, 1, 32, 64), has_z=True),
                 id="tma-host"),
    # one chunk shorter than a row tile (no hand-off between programs); headdim not a multiple of the headdim tile
    # with dstate under 16 and not a power of two (masked state tiles in the hand-off slot and the states)
    pytest.param({"fused_program": "chunk"}, Problem(dataclasses.replace(SMALL, seqlen=20), state_dtype="float32"),
                 id="chunk-one-chunk-fp32-states"),
    pytest.param({"fused_program": "chunk", "block_headdim": 16},
                 Problem(Shape(1, 100, 2, 24, 1, 12, 32), has_initial_states=True, has_z=True),
                 id="chunk-headdim24-dstate12"),
    pytest.param({"block_headdim": 16}, Problem(Shape(1, 100, 2, 24, 1, 12, 32), has_initial_states=True, has_z=True),
                 id="headdim24-dstate12"),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("switches,problem", FUSED_CASES)
def test_fuse_state_out(switches, problem, dtype):
    """The fused kernel's y, states and final states (and varlen states) against the float64 reference; the stage
    calls keep the three-stage kernels."""
    backend = get_backend("triton", fuse_state_out=True, **switches)
    inputs = make_inputs(problem, seed=10, dtype=dtype)
    errors, out = forward_stage_errors(backend, inputs, float64_forward(inputs))
    assert not failures(errors, dtype), errors
    stages = backend.describe()["stages"]
    assert FUSED in stages and "compute_out" not in stages and "state_passing" not in stages, stages
    assert (out.states.stride(-2) == 1) == backend.switches.transposed_layout


def test_fused_program_needs_fuse_state_out():
    with pytest.raises(ValueError, match=r"fused_program='chunk' of backend 'triton'.*fuse_state_out=True"):
        get_backend("triton", fused_program="chunk")


def test_fuse_state_out_refuses_shared_cb():
    with pytest.raises(ValueError, match="fuse_state_out.*'row_tile'.*cb_mode='shared'"):
        get_backend("triton", fuse_state_out=True, cb_mode="shared")


# --- stage 2's arrangement (switch state_pass; the default chunk_parallel runs everywhere above) ------------------
STATE_PASS_CASES = [
    pytest.param({}, RICH, id="rich-swap-transposed"),  # seq_idx 3 sequences, initial states, partial last chunk
    pytest.param({"operand_swap": False, "transposed_layout": False, "exp2": False}, RICH, id="rich-all-off"),
    pytest.param({"block_headdim": 16, "block_dstate": 16, "operand_swap": False},
                 Problem(Shape(2, 150, 2, 24, 1, 40, 32), has_initial_states=True, state_dtype="float32"),
                 id="b2-p24-n40-tiles-fp32-states"),
    pytest.param({}, Problem(SMALL, varlen=True, nseqs=3), id="cu_seqlens-3-seqs"),
    pytest.param({"tma": True}, Problem(Shape(1, 100, 2, 32, 1, 32, 64), nseqs=2, has_initial_states=True),
                 id="tma-seq_idx-initial"),
    # x's and B's descriptors built on the host (TensorDescriptor kernel arguments; the interpreter runs them)
    pytest.param({"tma": True, "tma_descriptors": "host"},
                 Problem(Shape(1, 100, 2, 32, 1, 32, 64), nseqs=2, has_initial_states=True),
                 id="tma-host-seq_idx-initial"),
    pytest.param({"tma": True, "tma_descriptors": "host", "operand_swap": False, "transposed_layout": False}, RICH,
                 id="tma-host-rich-no-swap"),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("switches,problem", STATE_PASS_CASES)
def test_state_pass_serial(switches, problem, dtype):
    """state_pass='serial' (one kernel walking the chunks): each stage and the forward against the float64
    reference; its launch is resolved as chunk_state's fields under a key of its own."""
    backend = get_backend("triton", state_pass="serial", **switches)
    inputs = make_inputs(problem, seed=12, dtype=dtype)
    errors = forward_errors(backend, inputs, float64_forward(inputs))
    assert not failures(errors, dtype), errors
    stages = backend.describe()["stages"]
    assert "state_passing" not in stages and "state_pass" in stages["chunk_state"]["key"], stages


def test_state_pass_refusals():
    with pytest.raises(ValueError, match="state_pass"):
        get_backend("triton", state_pass="two_level")
    with pytest.raises(ValueError, match="state_pass.*fuse_state_out"):
        get_backend("triton", fuse_state_out=True, state_pass="serial")


HEADS_PER_TILE_CASES = [
    pytest.param({}, RICH, id="rich-swap"),  # 2 heads per group: one program per group's pair
    pytest.param({"operand_swap": False, "transposed_layout": False, "exp2": False}, RICH, id="rich-all-off"),
    pytest.param({"tma": True, "decay_factor": True, "block_rows": 32, "block_positions": 16},
                 Problem(Shape(1, 100, 4, 32, 1, 32, 64), nseqs=2, has_z=True), id="tma-decay_factor-4-heads"),
    pytest.param({"cb_mode": "shared", "operand_swap": False}, Problem(SMALL, varlen=True, nseqs=3),
                 id="cb-shared-cu_seqlens"),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("switches,problem", HEADS_PER_TILE_CASES)
def test_heads_per_tile_2(switches, problem, dtype):
    """Two heads of a group per compute_out program (C, B and C·Bᵀ shared): each stage against float64."""
    backend = get_backend("triton", heads_per_tile=2, **switches)
    inputs = make_inputs(problem, seed=12, dtype=dtype)
    errors = forward_errors(backend, inputs, float64_forward(inputs))
    assert not failures(errors, dtype), errors
    assert backend.describe()["stages"]["compute_out"]["config"]["heads_per_tile"] == 2


# the heads-first program order: every (row, headdim) tile of every head block of every chunk and batch still
# written once, with one and two heads per program, several row and headdim tiles, the swap on and off
HEADS_FIRST_CASES = [
    pytest.param({}, RICH, id="rich-swap"),
    pytest.param({"heads_per_tile": 2, "operand_swap": False, "block_rows": 16, "block_positions": 16,
                  "block_headdim": 16},
                 Problem(Shape(2, 150, 4, 32, 2, 32, 64), has_initial_states=True), id="heads2-rows16-p16-2-batches"),
    pytest.param({"block_rows": 32, "block_positions": 16, "block_headdim": 16}, Problem(Shape(2, 150, 4, 32, 1, 32,
                 64), nseqs=2, has_z=True), id="rows32-p16-seq_idx"),
]


@pytest.mark.parametrize("switches,problem", HEADS_FIRST_CASES)
def test_heads_first(switches, problem):
    """compute_out's programs in the heads-first order (switch heads_first), fp32: each stage against float64."""
    backend = get_backend("triton", heads_first=True, **switches)
    inputs = make_inputs(problem, seed=13, dtype=torch.float32)
    errors = forward_errors(backend, inputs, float64_forward(inputs))
    assert not failures(errors, torch.float32), errors


def test_heads_first_refused_with_fuse_state_out():
    with pytest.raises(ValueError, match="fuse_state_out.*heads_first"):
        get_backend("triton", fuse_state_out=True, heads_first=True)


def test_heads_per_tile_must_divide_the_group():
    inputs = make_inputs(Problem(dataclasses.replace(SMALL, ngroups=4)), seed=12, dtype=torch.float32)
    with pytest.raises(ValueError, match="heads_per_tile of backend 'triton': 2 heads per program must divide the 1"):
        impls.ssd_forward(**inputs.forward_kwargs(), backend=get_backend("triton", heads_per_tile=2))


def test_state_dtype_fp16_under_fp32_inputs():
    inputs = make_inputs(Problem(SMALL, has_initial_states=True, nseqs=2), seed=12, dtype=torch.float32)
    inputs.state_dtype = torch.float16
    ref = float64_forward(inputs)
    with poisoned_allocations():
        out = impls.ssd_forward(**inputs.forward_kwargs(), backend="triton")
    assert out.states.dtype == torch.float16 and out.final_states.dtype == torch.float32
    assert rel_err(out.states, ref.states) <= tolerance(torch.float16)
    assert rel_err(out.final_states, ref.final_states) <= tolerance(torch.float32)
    assert rel_err(out.y, ref.y) <= tolerance(torch.float16)


def test_stages_chain_with_the_reference_backend():
    """Triton's transposed states into the reference's compute_out, and the reference's contiguous states into
    Triton's: strides are free, so either must work."""
    inputs = make_inputs(RICH, seed=13, dtype=torch.float32)
    ref = float64_forward(inputs)
    kw = dict(C=inputs.C, B=inputs.B, x=inputs.x, D=inputs.D, z=inputs.z, seq_idx=inputs.seq_idx)
    with poisoned_allocations():
        dt, dA = impls.chunk_cumsum(inputs.dt, inputs.A, inputs.chunk_size, inputs.dt_bias, True, backend="triton")
        states, _ = impls.fwd_pass_state(inputs.B, inputs.x, dt, dA, inputs.initial_states, inputs.seq_idx,
                                         backend="triton")
        assert states.stride(-2) == 1  # the transposed layout (default)
        y_ref_stage = impls.compute_out(dt=dt, dA_cumsum=dA, states=states, backend="reference", **kw)
        ref_states, _ = impls.fwd_pass_state(inputs.B, inputs.x, dt, dA, inputs.initial_states, inputs.seq_idx,
                                             backend="reference")
        y_triton_stage = impls.compute_out(dt=dt, dA_cumsum=dA, states=ref_states, backend="triton", **kw)
    assert rel_err(y_ref_stage, ref.y) <= tolerance(torch.float32)
    assert rel_err(y_triton_stage, ref.y) <= tolerance(torch.float32)


def test_poisoned_outputs_would_fail():
    """The check can fail: a stage that leaves part of its output unwritten shows NaN (rel_err = inf)."""
    with poisoned_allocations():
        y = torch.empty(2, 3)
    y[0] = 1.0
    assert rel_err(y, torch.ones(2, 3)) == math.inf


def test_long_sequence_method_of_the_gpu_test():
    """The million-token GPU test's method (float32 reference in chunk groups, sampled chunks) at a small size, so
    the check itself is exercised on CPU: it passes on the backend and catches a corrupted sampled chunk."""
    from tests.gpu.long_sequence import long_inputs, long_sequence_errors
    from tests.gpu.test_triton import _triton_local_states

    backend = get_backend("triton", block_rows=32, block_positions=32, block_headdim=16, block_dstate=16)
    inp = long_inputs(Shape(1, 256, 2, 16, 1, 16, 32), "cpu", torch.float32)
    errors = long_sequence_errors(backend, inp, sampled=(0, 3, 7), group=3,
                                  local_states=lambda i, dt, dA: _triton_local_states(backend, i, dt, dA))
    assert len(errors) == 2 * (3 + 3 * 3) and max(errors.values()) <= tolerance(torch.float32), errors  # + [blocks]
    original = backend.compute_out

    def broken_compute_out(*args):  # drops the entering state's term: (state term with x = 0) subtracted
        y = original(*args)
        return y - original(args[0], args[1], args[2] * 0, *args[3:])

    backend.compute_out = broken_compute_out
    errors = long_sequence_errors(backend, inp, sampled=(3,), group=3)
    assert errors["y[3]"] > tolerance(torch.float32) and errors["states[3]"] <= tolerance(torch.float32), errors
    assert errors["y[3][blocks]"] > tolerance(torch.float32), errors


# --- tuning modes ---------------------------------------------------------------------------------------------
def _stage_sources(backend) -> dict[str, str]:
    return {stage: info["source"] for stage, info in backend.describe()["stages"].items()}


def test_tuning_modes(tmp_path, monkeypatch):
    """Each mode over every tuned stage of the declared arrangement (stage 2 as chunk_state and state_passing)."""
    monkeypatch.setenv("SSD_TUNING_DIR", str(tmp_path))
    inputs = make_inputs(Problem(SMALL), seed=14, dtype=torch.float32)
    ref = float64_forward(inputs)
    with pytest.raises(ValueError, match="no record"):
        impls.ssd_forward(**inputs.forward_kwargs(), backend=get_backend("triton", preset="declared", tuning="record"))
    auto = get_backend("triton", preset="declared")
    impls.ssd_forward(**inputs.forward_kwargs(), backend=auto)
    assert set(_stage_sources(auto).values()) == {"fallback"}
    search = get_backend("triton", preset="declared", tuning="search")
    out = impls.ssd_forward(**inputs.forward_kwargs(), backend=search)
    assert rel_err(out.y, ref.y) <= tolerance(torch.float32)
    assert set(_stage_sources(search)) == set(STAGES) and set(_stage_sources(search).values()) == {"search"}
    files = sorted(p.name for p in tmp_path.rglob("*.json"))
    assert files == sorted(f"triton_{stage}.json" for stage in STAGES)
    for backend in (get_backend("triton", preset="declared", tuning="record"),
                    get_backend("triton", preset="declared")):
        out = impls.ssd_forward(**inputs.forward_kwargs(), backend=backend)
        assert set(_stage_sources(backend).values()) == {"record"}
        assert rel_err(out.y, ref.y) <= tolerance(torch.float32)
    fixed = get_backend("triton", preset="declared", tuning="fallback")
    impls.ssd_forward(**inputs.forward_kwargs(), backend=fixed)
    assert set(_stage_sources(fixed).values()) == {"fallback"}


def test_pinned_switches_override_and_report():
    backend = get_backend("triton", block_rows=32, block_positions=32, block_headdim=16, num_warps=2,
                          num_stages=1, block_heads=4, block_state=128, block_dstate=16, occupancy=3,
                          heads_per_tile=1)
    inputs = make_inputs(Problem(SMALL), seed=15, dtype=torch.float32)
    errors, _ = forward_stage_errors(backend, inputs, float64_forward(inputs))
    assert not failures(errors, torch.float32), errors
    stages = backend.describe()["stages"]
    assert {info["source"] for info in stages.values()} == {"switches"}
    assert stages["compute_out"]["config"] == {"block_rows": 32, "block_positions": 32, "block_headdim": 16,
                                               "num_warps": 2, "num_stages": 1, "occupancy": 3,
                                               "heads_per_tile": 1}
    assert stages["chunk_cumsum"]["config"] == {"block_heads": 4, "num_warps": 2}


@pytest.mark.parametrize("state_pass", ["chunk_parallel", "serial"])
def test_state_occupancy_pins_stage_2_only(state_pass):
    """state_occupancy sets stage 2's occupancy (chunk_state's launch fields, which the serial kernel takes too)
    over the shared occupancy switch, as cuTile's records tune it per stage; compute_out keeps occupancy's; the
    forward still matches float64."""
    backend = get_backend("triton", occupancy=3, state_occupancy=2, state_pass=state_pass, tuning="fallback")
    inputs = make_inputs(Problem(SMALL), seed=15, dtype=torch.float32)
    errors = forward_errors(backend, inputs, float64_forward(inputs))
    assert not failures(errors, torch.float32), errors
    stages = backend.describe()["stages"]
    assert stages["chunk_state"]["config"]["occupancy"] == 2 and stages["compute_out"]["config"]["occupancy"] == 3
    with pytest.raises(ValueError, match="state_occupancy of backend 'triton': fuse_state_out"):
        get_backend("triton", fuse_state_out=True, state_occupancy=2)


def test_search_space_respects_pins_and_clamps():
    dims = {"nheads": 4, "chunk": 32, "headdim": 16, "dstate": 16}
    space = search_space("compute_out", {"num_warps": 4}, dims)
    assert all(c["num_warps"] == 4 and c["block_rows"] <= 32 and c["block_headdim"] == 16 for c in space)
    assert len(space) == len({tuple(sorted(c.items())) for c in space})


def test_fallback_shrinks_compute_out_to_fit_shared_memory():
    dims = {"nheads": 80, "chunk": 256, "headdim": 64, "dstate": 256}
    config = fallback("sm90", "compute_out", dims, 4, {})
    assert compute_out_smem(config, dims, 4) <= SMEM_BUDGET
    assert fallback("sm90", "compute_out", dims, 2, {}) == clamp("compute_out", FALLBACK["sm90"]["compute_out"], dims)


# --- what the backend refuses -------------------------------------------------------------------------------
def test_occupancy_maps_to_a_register_cap():
    assert maxnreg({"occupancy": 0, "num_warps": 4}) is None and maxnreg({"num_warps": 4}) is None
    assert maxnreg({"occupancy": 3, "num_warps": 4}) == 168  # 65536 / (3 · 128) = 170.7, down to 8s
    assert maxnreg({"occupancy": 4, "num_warps": 8}) == 64
    assert maxnreg({"occupancy": 1, "num_warps": 4}) == 255  # the PTX ceiling


@pytest.mark.parametrize("name", ["latency_hints"])
def test_cannot_express_raises_naming_backend_and_switch(name):
    with pytest.raises(ValueError, match=rf"switch '{name}': backend 'triton' cannot express it"):
        get_backend("triton", **{name: True})


def test_bad_switch_values_raise():
    with pytest.raises(ValueError, match="block_rows"):
        get_backend("triton", block_rows=48)
    with pytest.raises(ValueError, match="cb_precision"):
        get_backend("triton", cb_precision="bf16")
    with pytest.raises(ValueError, match="no such switch"):
        get_backend("triton", block_m=64)


def test_supports_and_devices():
    backend = get_backend("triton")
    assert not backend.supports(Problem(SMALL, dtype="float64"))[0]
    assert not backend.supports(Problem(dataclasses.replace(SMALL, dstate=512)))[0]
    # bfloat16 runs compiled only: the interpreter computes bf16 dots wrongly (impls/interpreter.py)
    assert not backend.supports(Problem(SMALL, dtype="bfloat16"))[0]
    assert backend.check_device(torch.device("cpu"))[0]  # interpreter


# --- compiled for the GPU, ahead of time (no device needed) -----------------------------------------------------
def _aot(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compiled, not interpreted
    return subprocess.run([sys.executable, "-m", "instruments.triton.aot", *args], capture_output=True, text=True,
                          env=env, cwd=Path(__file__).resolve().parents[2], timeout=1200)


def test_kernels_compile_for_sm90():
    """Defaults and all-off, bf16, through ptxas for sm_90 at S1's sizes; shared memory within the limit. The
    interpreter accepts programs the compiler rejects, so this is the CPU suite's guard on the compiled path."""
    result = _aot("--arch", "90", "--dtype", "bfloat16")
    assert result.returncode == 0, result.stdout + result.stderr
    # defaults and all-off (8 kernels each: the fused one with both fused_programs, state_pass's serial one), and
    # at the defaults chunk_state, compute_out (dstate 128, 256) and the fused kernel (both programs) again with
    # in-kernel tensor descriptors, and chunk_state, compute_out (x2), the fused kernel (x2) and the serial kernel
    # (sm_90's defaults) with host-built ones (tma_descriptors='host'): PTX with bulk tensor copies, and the
    # host-built ones without tensormap creation in the kernel; none warp-specialised (setmaxnreg)
    assert result.stdout.count("ok  ") == 31, result.stdout  # and compute_out with 2 heads per program (x2)
    assert result.stdout.count("bulk_tensor_copies=yes") == 11, result.stdout
    assert result.stdout.count("bulk_tensor_copies=yes descriptors_in_kernel=no") == 6, result.stdout
    assert result.stdout.count("warp_specialized=yes") == 0, result.stdout
    # the fused kernel (both programs; pointers, in-kernel and host descriptors): its hand-off in the PTX
    assert result.stdout.count("handoff=ok") == 8, result.stdout


EXP2_FTZ_PTX = """
from instruments.triton.aot import compile_variant, variants
for name, kernel, pointers, constexprs, warps, stages in variants("bfloat16", all_variants=False):
    if (name in ("compute_out", "serial_state") and constexprs.get("EXP2") and constexprs.get("HOST_DESC")
            and constexprs.get("BLOCK_DSTATE", 128) == 128 and constexprs.get("HB", 1) == 1):
        for ftz in (True, False):
            ptx = compile_variant(kernel, pointers, {**constexprs, "EXP2_FTZ": ftz}, 90, warps, stages).asm["ptx"]
            print(name, ftz, ptx.count("ex2.approx.ftz.f32"), ptx.count("ex2.approx.f32"))
"""


def test_exp2_ftz_picks_the_ex2_instruction():
    """Switch exp2_ftz: on (the default), every exp2 of stage 2's serial kernel and compute_out (sm_90's defaults,
    host descriptors) is Triton's ex2.approx.ftz.f32; off, the same count of ex2.approx.f32 (subnormals kept). The
    stage calls pass it to the kernels they launch."""
    from instruments.triton.switch_effects import stage_launches

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compiled, not interpreted
    result = subprocess.run([sys.executable, "-c", EXP2_FTZ_PTX], capture_output=True, text=True, env=env,
                            cwd=Path(__file__).resolve().parents[2], timeout=1200)
    assert result.returncode == 0, result.stdout + result.stderr
    counts = {(name, ftz == "True"): (int(a), int(b)) for name, ftz, a, b in map(str.split, result.stdout.splitlines())}
    assert set(counts) == {(k, f) for k in ("compute_out", "serial_state") for f in (True, False)}, counts
    for kernel in ("compute_out", "serial_state"):
        (on_ftz, on_plain), (off_ftz, off_plain) = counts[(kernel, True)], counts[(kernel, False)]
        assert on_ftz == off_plain > 0 and on_plain == off_ftz == 0, counts
    for stage in ("fwd_pass_state", "compute_out"):
        launched = [dict(kwargs) for _, _, _, kwargs in stage_launches(stage, "float32", exp2_ftz=False)]
        assert any(kw.get("EXP2_FTZ") is False for kw in launched), launched


def test_exp2_ftz_off_is_refused_under_the_interpreter_and_with_the_fused_kernel():
    """The interpreter runs no PTX: a kernel with the inline ex2.approx.f32 is refused at its launch, naming the
    switch; the fused kernel is written with tl.exp2 only."""
    backend = get_backend("triton", exp2_ftz=False)
    inputs = make_inputs(Problem(SMALL), seed=14, dtype=torch.float32)
    with poisoned_allocations(), pytest.raises(ValueError, match=r"exp2_ftz=False of backend 'triton'.*runs no PTX"):
        impls.ssd_forward(**inputs.forward_kwargs(), backend=backend)
    with pytest.raises(ValueError, match=r"exp2_ftz=False of backend 'triton'.*fuse_state_out"):
        get_backend("triton", exp2_ftz=False, fuse_state_out=True)


# --- the exponent fold (switch exp_fold) ---------------------------------------------------------------------------
FOLD_SHAPE = Shape(1, 100, 2, 32, 1, 32, 64)


def _zero_dt(inputs):
    """dt = 0 at every third position (no softplus, no bias, no dt_limit: stage 1 passes it through as 0)."""
    inputs.dt[:, ::3] = 0.0
    return inputs


def _positive_A(inputs):
    """A > 0 on one head: dA_cumsum increases there, which the fold takes (it needs dt >= 0 only)."""
    inputs.A = inputs.A.clone()
    inputs.A[1] = 0.5
    return inputs


def _exp_fold_params():
    cases = [({}, RICH, None, DTYPES, "defaults"),
             ({"exp2": False, "operand_swap": False}, RICH, None, DTYPES[:1], "no-exp2-no-swap"),
             ({"decay_factor": True, "heads_per_tile": 2, "block_rows": 32, "block_positions": 16},
              Problem(Shape(1, 100, 4, 32, 1, 32, 64), nseqs=2), None, DTYPES[:1], "decay_factor-heads2"),
             ({"cb_mode": "shared"}, Problem(FOLD_SHAPE, dt_softplus=False, has_dt_bias=False), _zero_dt, DTYPES[:1],
              "dt-zero-shared-cb"),
             ({}, Problem(FOLD_SHAPE), _positive_A, DTYPES[:1], "A-positive")]
    return [pytest.param(switches, problem, edit, dtype.values[0], id=f"{name}-{dtype.id}")
            for switches, problem, edit, dtypes, name in cases for dtype in dtypes]


# numpy's log2 of 0 (q = +inf, by design) and of a negative dt (the NaN the last test asks for) warn under the
# interpreter
QUIET_LOG = pytest.mark.filterwarnings("ignore:divide by zero encountered in log",
                                       "ignore:invalid value encountered in log")


@QUIET_LOG
@pytest.mark.parametrize("switches,problem,edit,dtype", _exp_fold_params())
def test_exp_fold(switches, problem, edit, dtype):
    """dt folded into the exponent (q = dA_cumsum·log2(e) − log2(dt) read in dt's place): each stage and the forward
    against the float64 reference, with the swap, without exp2, with the factored decay and two heads per program,
    with dt = 0 at a third of the positions (q = +inf: a zero term, not NaN), and with A > 0 on one head."""
    inputs = make_inputs(problem, seed=17, dtype=dtype)
    if edit is not None:
        inputs = edit(inputs)
    ref = float64_forward(inputs)
    if edit is _zero_dt:
        assert bool((ref.dt == 0).any()), "the case must hand compute_out a dt of 0"
    errors = forward_errors(get_backend("triton", exp_fold=True, **switches), inputs, ref)
    assert not failures(errors, dtype), errors


def test_exp_fold_launches_the_fold_kernel_then_reads_q_in_dt_s_place():
    from instruments.triton.switch_effects import stage_launches

    launches = stage_launches("compute_out", "float32", exp_fold=True)
    names = [name.rsplit(".", 1)[-1] for name, _, _, _ in launches]
    assert names == ["fold_kernel", "compute_out_kernel"], names
    assert dict(launches[-1][3])["EXP_FOLD"] is True
    assert [name.rsplit(".", 1)[-1] for name, _, _, _ in stage_launches("compute_out", "float32")] == \
        ["compute_out_kernel"]


@QUIET_LOG
def test_exp_fold_refuses_a_negative_dt_and_the_fused_kernel():
    """A negative dt (no softplus, no dt_limit: the contract lets dt + dt_bias be negative) has no log2: with
    check_values the forward and compute_out refuse it naming dt, and so does the gate; unchecked, the fold's output
    is NaN rather than a wrong number. The default switches take it. The fused kernel multiplies by dt: refused."""
    from harness.correctness import refuse_unsafe_inputs

    backend = get_backend("triton", exp_fold=True)
    inputs = make_inputs(Problem(FOLD_SHAPE, dt_softplus=False, has_dt_bias=False), seed=5, dtype=torch.float32)
    inputs.dt[:, 7] = -0.01
    with pytest.raises(ValueError, match=r"^dt: .*exp_fold"):
        impls.ssd_forward(**inputs.forward_kwargs(), backend=backend, check_values=True)
    with pytest.raises(ValueError, match=r"^dt: .*exp_fold"):
        refuse_unsafe_inputs(backend, inputs)
    ref = float64_forward(inputs)
    with pytest.raises(ValueError, match=r"^dt: .*exp_fold"):
        impls.compute_out(inputs.C, inputs.B, inputs.x, ref.dt.float(), ref.dA_cumsum.float(), ref.states.float(),
                          inputs.D, inputs.z, inputs.seq_idx, backend=backend, check_values=True)
    with poisoned_allocations():
        assert bool(impls.ssd_forward(**inputs.forward_kwargs(), backend=backend).y.isnan().any())
    refuse_unsafe_inputs(get_backend("triton"), inputs)  # the default switches need no sign
    with pytest.raises(ValueError, match=r"exp_fold of backend 'triton'.*fuse_state_out"):
        get_backend("triton", exp_fold=True, fuse_state_out=True)


EXP_FOLD_PTX = """
from instruments.triton.aot import compile_variant, variants
from impls.triton.compute_out import fold_kernel
for name, kernel, pointers, constexprs, warps, stages in variants("bfloat16", all_variants=False):
    if (name == "compute_out" and constexprs.get("EXP2") and not constexprs.get("TMA")
            and constexprs.get("BLOCK_DSTATE", 128) == 128 and constexprs.get("HB", 1) == 1):
        for fold in (False, True):
            ptx = compile_variant(kernel, pointers, {**constexprs, "EXP_FOLD": fold}, 90, warps, stages).asm["ptx"]
            print(name, fold, sum(ptx.count(op) for op in ("mul.f32", "mul.rn.f32", "mul.ftz.f32")),
                  ptx.count("st.global"))
        break
ptx = compile_variant(fold_kernel, {"dt_ptr": "*fp32", "dA_ptr": "*fp32", "q_ptr": "*fp32"},
                      {"EXP2": True, "BLOCK": 1024}, 90, 4, 1).asm["ptx"]
print("fold_kernel", True, 0, ptx.count("st.global"))
"""


def test_exp_fold_ptx_drops_the_dt_multiply():
    """sm_90 PTX (bf16, pointer loads): compute_out with exp_fold has fewer fp32 multiplies than without (dt's per
    score, log2(e)'s per source); fold_kernel compiles and stores q."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compiled, not interpreted
    result = subprocess.run([sys.executable, "-c", EXP_FOLD_PTX], capture_output=True, text=True, env=env,
                            cwd=Path(__file__).resolve().parents[2], timeout=1200)
    assert result.returncode == 0, result.stdout + result.stderr
    counts = {(name, fold == "True"): (int(muls), int(stores))
              for name, fold, muls, stores in map(str.split, result.stdout.splitlines())}
    assert counts[("compute_out", True)][0] < counts[("compute_out", False)][0], counts
    assert counts[("fold_kernel", True)][1] > 0, counts


HANDOFF_PTX = """
\t@%p9 atom.global.gpu.acq_rel.add.u32 %r1, [ %rd1 + 0 ], %r2;
\tbar.sync 0;
$L__BB0_6:
\tbar.sync 0;
\t@%p9 ld.global.gpu.acquire.b32 %r3, [ %rd2 + 0 ];
\tbar.sync 0;
\t@%p4 bra $L__BB0_6;
\t@%p5 ld.global.cg.b32 { %r4 }, [ %rd3 + 0 ];
\t@%p6 st.global.b32 [ %rd3 + 0 ], { %r4 };
\tbar.sync 0;
\tmov.b32 %r5, 1;
\t// begin inline asm
\t@%p9 atom.global.gpu.release.exch.b32 %r6, [ %rd4 + 0 ], %r5;
"""  # the shape of the fused kernel's sm_90 PTX (Triton 3.6): ticket, spin, slot load, store, release


@pytest.mark.parametrize("broken, verdict", [
    pytest.param(("\tbar.sync 0;\n\tmov.b32 %r5, 1;", "\tmov.b32 %r5, 1;"), "release not after a CTA barrier",
                 id="release-without-barrier"),
    pytest.param(("\t@%p9 atom.global.gpu.acq_rel",
                  "\tld.global.cg.b32 { %r9 }, [ %rd3 ];\n\t@%p9 atom.global.gpu.acq_rel"),
                 "a .cg load before the first acquire", id="published-data-read-first"),
    pytest.param(("@%p9 ld.global.gpu.acquire", "ld.global.gpu.acquire"), "not under one predicate",
                 id="acquire-by-every-thread"),
    pytest.param(("\t@%p4 bra $L__BB0_6;\n", ""), "acquire load outside a loop", id="no-spin"),
    pytest.param(("\tbar.sync 0;\n$L__BB0_6:", "\tld.global.nc.b32 %r7, [ %rd5 ];\n$L__BB0_6:"),
                 "non-coherent load", id="nc-load"),
])
def test_handoff_check_flags_a_broken_handoff(broken, verdict):
    """aot.handoff (the compile test's check of the fused kernel's PTX) passes the hand-off's shape and names each
    way of breaking it."""
    from instruments.triton.aot import handoff

    assert handoff(HANDOFF_PTX) == "ok"
    assert verdict in handoff(HANDOFF_PTX.replace(*broken))


def _spills(*switches: str) -> list[list[str]]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-m", "instruments.triton.spills", "--shapes", "S1", "--switch",
                             *switches], capture_output=True, text=True, env=env,
                            cwd=Path(__file__).resolve().parents[2], timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    return [line.split() for line in result.stdout.splitlines() if line.startswith("S1 ")]


def test_triton_spills_reads_the_kernels_the_backend_launches():
    """`python -m instruments.triton.spills` compiles what the stage calls launch (the backend's own constexprs and
    configs, sm_90, no GPU): cuTile's arrangement at cuTile's S1 tiles with its occupancy 3 caps registers at 168
    and spills in both kernels (docs/perf-notes.md, version 15)."""
    arm = ["tma=True", "tma_descriptors=host", "state_pass=serial", "operand_swap=False", "block_dstate=128",
           "block_rows=64", "block_positions=64", "block_headdim=64"]
    capped = {row[1]: row for row in _spills(*arm, "heads_per_tile=2", "occupancy=3")}
    assert set(capped) == {"serial_state_kernel", "compute_out_kernel"}
    for row in capped.values():  # shape kernel regs LDL STL warps smem WS MMA-in-flight config...
        assert row[2] == "168" and int(row[3]) > 0 and int(row[4]) > 0 and row[5] == "4" and row[7] == "no", row
        assert row[8] == "0", row  # no register operand of a running warpgroup MMA rewritten


def test_triton_spills_puts_back_what_it_answered():
    """compile_only (instruments/intercept.py) answers for an sm_90 GPU while it runs, even when the stage call raises,
    and leaves Triton's driver, the kernels' caches and the backend's availability as they were."""
    code = """
import pytest, torch
from triton.runtime import driver
from impls.cli import load_shape
from instruments import intercept
from instruments.triton import spills
from impls.triton.backend import TritonBackend
from impls.triton.compute_out import compute_out_kernel
from impls.triton.switches import TritonSwitches
before = (driver._active, type(TritonBackend.__dict__["available"]), compute_out_kernel.device_caches)
with pytest.raises(ValueError, match="stop"):
    with intercept.compile_only() as compiled:
        assert TritonBackend.available() == (True, "")
        spills._forward_stages(TritonBackend(TritonSwitches(tuning="fallback")), load_shape("S4"), torch.bfloat16)
        assert [name for name, _ in compiled][-1] == "compute_out_kernel"
        raise ValueError("stop")
after = (driver._active, type(TritonBackend.__dict__["available"]), compute_out_kernel.device_caches)
assert before[0] is after[0] and after[1] is classmethod and before[2] is after[2], (before, after)
print("restored")
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                            cwd=Path(__file__).resolve().parents[2], timeout=600)
    assert result.returncode == 0 and "restored" in result.stdout, result.stdout + result.stderr


def test_a_register_operand_rewritten_under_a_running_mma_is_found():
    """The static check behind the MMA column of instruments.triton.spills, on hand-written SASS: a loop that packs the
    A fragment of an HGMMA it leaves running across its back-edge (wait to 1) rewrites a running MMA's operand; the
    same loop waiting to 0, or rotating four A blocks behind a wait to 3 as the serial kernel does, does not."""
    from instruments.sass import mma_operand_hazards

    def sass(*lines):
        return "\n".join(f"        /*{0x100 + 16 * i:04x}*/   {line} ;" for i, line in enumerate(lines))

    loop = ["F2FP.BF16.F32.PACK_AB R56, R23, R56", "HGMMA.64x64x16.F32.BF16 R24, R56, gdesc[UR16].tnspB, R24, gsb0"]
    assert mma_operand_hazards(sass(*loop, "WARPGROUP.DEPBAR.LE gsb0, 0x1", "@P0 BRA 0x100")) == 1
    assert mma_operand_hazards(sass(*loop, "WARPGROUP.DEPBAR.LE gsb0, 0x0", "@P0 BRA 0x100")) == 0
    rotating = []
    for a in (100, 88, 92, 96):
        rotating += [f"LDS.128 R{a}, [R1]", f"HGMMA.64x128x16.F32.BF16 R24, R{a}, gdesc[UR8].tnspB, R24, gsb0",
                     "WARPGROUP.DEPBAR.LE gsb0, 0x3"]
    assert mma_operand_hazards(sass(*rotating, "@P6 BRA 0x100")) == 0
    assert mma_operand_hazards(sass(*rotating[:-1], "WARPGROUP.DEPBAR.LE gsb0, 0x4", "@P6 BRA 0x100")) > 0
    # a wait counts committed groups, not HGMMAs: a chain of two committed by the second (gsb0) is one group, and a
    # wait to 1 leaves both running; the uniform-predicate back-edge form is a loop too
    chain = ["F2FP.BF16.F32.PACK_AB R56, R23, R56", "HGMMA.64x64x16.F32.BF16 R24, R56, gdesc[UR16], R24",
             "HGMMA.64x64x16.F32.BF16 R24, R60, gdesc[UR16], R24, gsb0", "WARPGROUP.DEPBAR.LE gsb0, 0x1"]
    assert mma_operand_hazards(sass(*chain, "BRA.U !UP0, 0x100")) == 1
    assert mma_operand_hazards(sass(*chain[:-1], "WARPGROUP.DEPBAR.LE gsb0, 0x0", "BRA.U !UP0, 0x100")) == 0


def test_what_triton_cannot_express_is_shown_by_the_compiler():
    """The evidence docs/triton-switches.md quotes: a latency hint on tl.load is a compile error; an occupancy
    compile option is dropped without a trace in the PTX; maxnreg (the occupancy switch's means) reaches it; a
    pointer tile load never becomes TMA, an in-kernel descriptor writes a tensormap and a host-built one does
    not; a batched 3-D tl.dot is mma.sync where the 2-D one is wgmma; a warp_specialize loop is specialised at 4
    warps, not at 8, and does not compile with pointer loads."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-m", "instruments.triton.expressible"], capture_output=True, text=True,
                            env=env, cwd=Path(__file__).resolve().parents[2], timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        "latency_hints: CompilationError: load() got an unexpected keyword argument 'latency'",
        "occupancy: compile option occupancy=2 accepted; PTX directives: none",
        "occupancy via maxnreg=168: PTX directives: .maxnreg",
        "tma by pointer load (64x64 bf16 tile): cp.async.bulk.tensor no, tensormap.cp_fenceproxy no",
        "tma, descriptor made in the kernel: cp.async.bulk.tensor yes, tensormap.cp_fenceproxy yes",
        "tma, descriptor built on the host: cp.async.bulk.tensor yes, tensormap.cp_fenceproxy no, "
        ".param .align 64 .b8 yes",
        "head_mma, 2-D tl.dot (bf16, 64x64 per head): wgmma.mma_async yes, mma.sync no",
        "head_mma, batched 3-D tl.dot (bf16, 64x64 per head): wgmma.mma_async no, mma.sync yes",
        "warp_specialize, descriptor loads, num_warps=4: setmaxnreg yes, 12 warps",
        "warp_specialize, descriptor loads, num_warps=8: setmaxnreg no, 8 warps",
        "warp_specialize, pointer loads: RuntimeError: PassManager::run failed",
    ], result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("arch", ["90", "100"])
def test_every_variant_compiles(arch, dtype):
    result = _aot("--arch", arch, "--dtype", dtype, "--all-variants")
    assert result.returncode == 0, result.stdout + result.stderr


# --- the full factorial ---------------------------------------------------------------------------------------
FACTORIAL_PROBLEMS = [
    pytest.param(RICH, id="rich"),
    pytest.param(Problem(Shape(1, 90, 4, 24, 1, 40, 32), varlen=True, nseqs=3, has_z=True), id="varlen-p24-n40"),
    pytest.param(Problem(dataclasses.replace(SMALL, seqlen=64), has_D=False, dt_limit=(0.005, 0.05)),
                 id="multiple-noD-limit"),
]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cb_precision", ["tf32", "fp32"])
@pytest.mark.parametrize("switches", COMBOS)
@pytest.mark.parametrize("problem", FACTORIAL_PROBLEMS)
def test_full_factorial(problem, switches, cb_precision, dtype):
    backend = get_backend("triton", cb_precision=cb_precision, **switches)
    inputs = make_inputs(problem, seed=21, dtype=dtype)
    errors = forward_errors(backend, inputs, float64_forward(inputs))
    assert not failures(errors, dtype), errors
