"""The cuTile backward (impls/cutile/backward/) without a GPU.

- Every kernel compiles ahead of time for sm_90 at S1's sizes in bf16 (the headline's inputs, ngroups 1) and at
  ngroups 8 with every optional input, with the fallback tiles and no local-memory spill (registers and spills
  printed), and for sm_100; all switches off and fp32/fp16 under `slow`.
- The host side, its launches intercepted (instruments/intercept.py): which kernels run in which order, their grids
  and the shapes of what they write, on a shape of the contract; the states recomputed with bwd_recompute_states and
  after the fused forward, which keeps none.
- The kernels themselves, run on CPU with torch standing in for cuda.tile (instruments/cutile/emulate.py) behind the
  reference's forward stages, through the gradient gate (harness/gradient_gate.py: float64 autograd as the truth,
  NaN-poisoned allocations) at tiny shapes covering the contract, with tiles small enough that every kernel walks
  several tiles; fp32 with exact fp32 MMAs (cb_precision fp32), and bf16. The emulator checks the kernels' indexing,
  masks and arithmetic, not cuTile's compiler: the GPU test is tests/gpu/test_cutile_backward.py.
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

pytest.importorskip("cuda.tile")

import impls  # noqa: E402
from harness.calls import forward_arguments  # noqa: E402
from harness.gradient_gate import check_gradients, output_gradients  # noqa: E402
from impls.api import GRAD_INPUTS  # noqa: E402
from impls.cutile.backend import CutileBackend  # noqa: E402
from impls.cutile.backward import tune  # noqa: E402
from impls.cutile.common import _param_names  # noqa: E402
from impls.cutile.switches import CODE_SWITCHES, CutileSwitches  # noqa: E402
from impls.cutile.tune import OFF_VALUE  # noqa: E402
from impls.inputs import make_inputs  # noqa: E402
from impls.problem import Problem, Shape  # noqa: E402
from impls.registry import get_backend  # noqa: E402
from instruments.cutile.aot import export  # noqa: E402
from instruments.cutile.aot_backward import EVERYTHING, KERNELS, build_call  # noqa: E402
from instruments.cutile.emulate import emulated_launches  # noqa: E402
from instruments.intercept import backend_launches, device_answered  # noqa: E402
from instruments.sass import cubin_facts, cuobjdump_path, facts, opcodes  # noqa: E402

needs_cuobjdump = pytest.mark.skipif(cuobjdump_path() is None, reason="cuobjdump not installed")
# the forward's code switches off, and the backward's bwd_state_split (on by default)
ALL_OFF = CutileSwitches(**{k: OFF_VALUE.get(k, False) for k in CODE_SWITCHES}, bwd_state_split=False)
WARPGROUP_MMA = {tune.STATE_PASS, tune.CHUNK, tune.DB}  # dcb's 32-row tiles lower to mma.sync (HMMA)


def _facts(kernel, dtype=torch.bfloat16, switches=None, dims=None, optional=None, arch="sm_90", wide=False,
           config=None):
    cubin = export(build_call(kernel, dtype, switches or CutileSwitches(), dims, optional=optional, wide=wide,
                              config=config), arch)
    f = cubin_facts(cubin)
    ops = opcodes(f.sass)
    found = {**facts(f.sass), "HMMA": sum(n for op, n in ops.items() if op.startswith("HMMA")),
             "registers": f.registers, "LDL": f.ldl, "STL": f.stl, "stack": f.stack_bytes}
    print(kernel, arch, dims or "S1", "every optional input" if optional else "headline", found)
    return found


@needs_cuobjdump
@pytest.mark.parametrize("kernel", KERNELS)
def test_compiles_for_sm90_at_s1_without_spills(kernel):
    """S1 (the headline's inputs) and ngroups 8 with every optional input (z, D per channel, seq_idx, initial
    states, cu_seqlens' extra terms, dt_limit), bf16, the fallback tiles."""
    for dims, optional in (({}, None), ({"ngroups": 8}, EVERYTHING)):
        f = _facts(kernel, dims=dims, optional=optional)
        assert f["LDL"] + f["STL"] == 0, f
        if kernel in WARPGROUP_MMA:
            assert f["HGMMA"] > 0, f
        elif kernel == tune.DCB:
            assert f["HMMA"] > 0, f


@needs_cuobjdump
@pytest.mark.parametrize("kernel", KERNELS)
def test_compiles_for_sm100(kernel):
    f = _facts(kernel, arch="sm_100")
    assert f["instructions"] > 100 and f["HGMMA"] == 0
    if kernel != tune.CUMSUM:
        assert f["UTCMMA"] + f["HMMA"] > 0, f


@pytest.mark.slow
@needs_cuobjdump
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype, switches, wide", [(torch.bfloat16, ALL_OFF, False), (torch.float32, None, False),
                                                   (torch.float16, None, False), (torch.bfloat16, None, True)],
                         ids=["bf16-all-off", "fp32", "fp16", "bf16-int64-offsets"])
def test_compiles_with_other_switches_and_dtypes(kernel, dtype, switches, wide):
    """Every optional input; int64 offsets: the build for arrays past 2^31 elements (2^20 tokens at S1's heads)."""
    dims = {"batch": 1, "seqlen": 2**20} if wide else None
    assert _facts(kernel, dtype, switches, dims, EVERYTHING, wide=wide)["instructions"] > 100


@needs_cuobjdump
@pytest.mark.parametrize("arch", ["sm_90", "sm_100"])
def test_bwd_cb_shared_chunk_kernel_compiles_with_fewer_mmas(arch):
    """Switch bwd_cb='shared': the chunk kernel at S1 in bf16 with the fallback tiles loads G instead of forming it:
    fewer warpgroup (sm_90) or tcgen05 (sm_100) MMAs than 'inline'; on sm_90 no local-memory spill at the headline's
    inputs, and at ngroups 8 with every optional input at most the few the walk's (rows × sources) accumulator of U's
    terms costs there (backward version 9: 5 local loads and 2 stores on cuda-tile 1.7, none before it)."""
    mma = "HGMMA" if arch == "sm_90" else "UTCMMA"
    inline = _facts(tune.CHUNK, arch=arch)
    shared = _facts(tune.CHUNK, switches=CutileSwitches(bwd_cb="shared"), arch=arch)
    assert 0 < shared[mma] < inline[mma], (inline, shared)
    if arch == "sm_90":
        everything = _facts(tune.CHUNK, switches=CutileSwitches(bwd_cb="shared"), dims={"ngroups": 8},
                            optional=EVERYTHING)
        assert shared["LDL"] + shared["STL"] == 0 and everything["LDL"] + everything["STL"] <= 8, (shared, everything)


@pytest.mark.slow
@needs_cuobjdump
@pytest.mark.parametrize("dtype, wide", [(torch.float32, False), (torch.bfloat16, True)],
                         ids=["fp32", "bf16-int64-offsets"])
def test_bwd_cb_shared_chunk_kernel_compiles_for_other_dtypes(dtype, wide):
    dims = {"batch": 1, "seqlen": 2**20} if wide else None
    assert _facts(tune.CHUNK, dtype, CutileSwitches(bwd_cb="shared"), dims, EVERYTHING, wide=wide)["HGMMA"] > 0


# --- the host side, launches intercepted -------------------------------------------------------------------------
CONTRACT = Problem(Shape(2, 1000, 8, 64, 2, 128, 256), dtype="bfloat16", has_z=True, D_per_channel=True,
                   has_initial_states=True, nseqs=3)  # seq_idx; 1000 = 3 chunks + 232
BACKWARD_KERNELS = ["bwd_state_pass_kernel", "bwd_chunk_kernel", "bwd_dcb_kernel", "bwd_db_kernel",
                    "bwd_cumsum_kernel"]


def _leaves(kw: dict) -> dict:
    return {name: kw[name].detach().clone().requires_grad_() for name in GRAD_INPUTS if kw.get(name) is not None}


def _intercepted_backward(problem: Problem, **switches):
    """(the launches of a forward and its backward, by kernel name with their arguments by parameter name; the
    gradients; the leaves), every launch recorded instead of run."""
    kw = forward_arguments(make_inputs(problem, seed=0))
    leaves = _leaves(kw)
    calls = []
    with device_answered("cutile"), backend_launches("cutile", calls.append):
        out = impls.ssd(**{**kw, **leaves}, backend=get_backend("cutile", tuning="fallback", **switches))
        grads_in = output_gradients(make_inputs(problem, seed=0))
        found = torch.autograd.grad([out.y, out.final_states], list(leaves.values()),
                                    [grads_in["y"].to(out.y.dtype), grads_in["final_states"].float()])
    launches = []
    for call in calls:
        fn = call.kernel._pyfunc
        launches.append((fn.__name__, call.grid, dict(zip(inspect.signature(fn).parameters, call.args))))
    return launches, dict(zip(leaves, found)), leaves


@pytest.mark.quick
def test_the_backward_launches_its_five_kernels_with_these_grids_and_buffers():
    """ngroups 2, z, D per channel, seq_idx, initial states, seqlen 1000 (4 chunks of 256): after the forward,
    compute_out again without z (ŷ, for dz), then the five kernels; every gradient in its input's shape and dtype."""
    launches, grads, leaves = _intercepted_backward(CONTRACT)
    names = [name for name, _, _ in launches]
    assert names[:3] == ["chunk_cumsum_kernel", "fwd_pass_state_kernel", "compute_out_kernel"]
    assert names[3:] == ["compute_out_kernel", *BACKWARD_KERNELS]
    by_name = {name: (grid, args) for name, grid, args in launches[4:]}
    b, nchunks, h, g, p, n, chunk = 2, 4, 8, 2, 64, 128, 256
    sp, ck, dcb, db, cs = (tune.FALLBACK[9][s] for s in tune.STAGES)
    bs, bt_dcb, bt_db = ck["block_sources"], dcb["block"], db["block"]
    state_tiles = (p // sp["block_headdim"], n // sp["block_dstate"])
    assert by_name["bwd_state_pass_kernel"][0] == (b * h, *state_tiles)
    assert by_name["bwd_chunk_kernel"][0] == ((chunk // bs) * h * nchunks * b, 1, 1)
    assert by_name["bwd_dcb_kernel"][0] == ((chunk // bt_dcb) * g * nchunks * b, 1, 1)
    assert by_name["bwd_db_kernel"][0] == ((chunk // bt_db) * g * nchunks * b, 1, 1)
    assert by_name["bwd_cumsum_kernel"][0] == (b * nchunks, h // cs["block_heads"], 1)
    shapes = {name: {k: (tuple(v.shape), v.dtype) for k, v in args.items() if isinstance(v, torch.Tensor)}
              for name, (_, args) in by_name.items()}
    f32, bf16 = torch.float32, torch.bfloat16
    assert shapes["bwd_state_pass_kernel"]["ds"] == ((b, nchunks, h, p, n), bf16)
    assert shapes["bwd_state_pass_kernel"]["lasts"] == ((b, h, nchunks, state_tiles[0] * state_tiles[1]), f32)
    assert shapes["bwd_state_pass_kernel"]["dinit"] == ((b, h, p, n), f32)
    assert shapes["bwd_state_pass_kernel"]["states"] == ((b, nchunks, h, n, p), bf16)  # transposed_layout, as stored
    assert shapes["bwd_chunk_kernel"]["row"] == ((b, h, nchunks, chunk // bs, chunk), f32)
    assert shapes["bwd_chunk_kernel"]["dD"] == ((b, nchunks, chunk // bs, h, p), f32)
    assert shapes["bwd_chunk_kernel"]["dz"] == ((b, 1000, h, p), bf16)
    assert shapes["bwd_dcb_kernel"]["dG"] == ((b, nchunks, g, chunk, chunk), f32)
    assert shapes["bwd_cumsum_kernel"]["dA_part"] == ((b, h, nchunks), f32)
    for name, grad in grads.items():
        assert (grad.shape, grad.dtype) == (leaves[name].shape, leaves[name].dtype), name


@pytest.mark.parametrize("switches, forward", [
    pytest.param({"bwd_recompute_states": True}, ["chunk_cumsum_kernel", "fwd_pass_state_kernel",
                                                  "compute_out_kernel"], id="bwd_recompute_states"),
    pytest.param({"fuse_state_out": True}, ["chunk_cumsum_kernel", "fused_kernel"], id="fused-forward-keeps-none"),
])
def test_the_backward_recomputes_the_states_where_the_forward_keeps_none(switches, forward):
    problem = dataclasses.replace(CONTRACT, nseqs=1, has_z=False)  # the fused forward takes no seq_idx
    names = [name for name, _, _ in _intercepted_backward(problem, **switches)[0]]
    assert names == [*forward, "fwd_pass_state_kernel", *BACKWARD_KERNELS]


def test_python_m_impls_backends_describes_the_backward(capsys, monkeypatch):
    from impls import cli

    every = cli.declarations()
    monkeypatch.setattr(cli, "declarations", lambda: {"cutile": every["cutile"]})
    cli.main(["backends", "--check"])
    assert "backward: cuTile kernels (impls/cutile/backward/; gated and timed on H100s" in capsys.readouterr().out


# --- the kernels, emulated on CPU, through the gradient gate ------------------------------------------------------
class EmulatedForward(CutileBackend):
    """The cuTile backend with the reference's forward stages (the forward's own kernels are not emulated), its
    states handed on as the cuTile forward stores them (dstate-major with transposed_layout), on any device."""

    @classmethod
    def available(cls):
        return True, ""

    def check_device(self, device):
        return True, ""

    def chunk_cumsum(self, *args):
        return get_backend("reference").chunk_cumsum(*args)

    def fwd_pass_state(self, B, x, dt, dA_cumsum, initial_states, seq_idx, state_dtype):
        states, final = get_backend("reference").fwd_pass_state(B, x, dt, dA_cumsum, initial_states, seq_idx,
                                                                 state_dtype)
        if self.switches.transposed_layout:
            states = states.transpose(-1, -2).contiguous().transpose(-1, -2)
        return states, final

    def compute_out(self, *args):
        return get_backend("reference").compute_out(*args)


# tiles small enough that every kernel walks several: 2 × 2 state tiles in the state pass (its dΛ_last partials), row
# tiles shorter or longer than the source tiles in the chunk kernel, dcb and db on different tiles, 2 head blocks
SMALL = {tune.STATE_PASS: {"block_headdim": 16, "block_dstate": 16}, tune.CHUNK: {"block_sources": 16, "block_rows": 8},
         tune.DCB: {"block": 8}, tune.DB: {"block": 16}, tune.CUMSUM: {"block_heads": 2}}
ROWS_LONGER = {**SMALL, tune.CHUNK: {"block_sources": 8, "block_rows": 16}, tune.DCB: {"block": 16},
               tune.DB: {"block": 8}}
HEADLINE = Problem(Shape(2, 40, 4, 32, 1, 32, 16), dtype="float32")  # softplus, dt_bias, D per head; 3 chunks
RICH = Problem(Shape(1, 70, 4, 32, 2, 32, 32), dtype="float32", has_z=True, D_per_channel=True,
               has_initial_states=True, nseqs=3)  # seq_idx, 70 = 2 chunks + 6
CASES = [
    pytest.param(HEADLINE, SMALL, {}, id="headline-g1", marks=pytest.mark.quick),  # the quick tier
    pytest.param(RICH, ROWS_LONGER, {}, id="z-Dchannel-init-seq_idx-g2"),
    # chunk 32 over 16- and 8-wide tiles: the chunk kernel's row tiles below the diagonal of full chunks take the
    # unmasked path, the short last chunk (72 = 2 chunks + 8) and the diagonal the masked one
    pytest.param(Problem(Shape(1, 72, 4, 32, 1, 32, 32), dtype="float32"), SMALL, {}, id="below-diagonal-tiles"),
    pytest.param(dataclasses.replace(RICH, dtype="bfloat16"), SMALL, {}, id="bf16-z-Dchannel-init-seq_idx-g2"),
    # 8 chunks: dA, a sum over a head of terms that cancel, where dΛ_last's two parts must cancel to the bit
    # (impls/README.md, "The chunked backward", step 2); formed whole from the stored S_{c+1} it was 3.3x its bound
    pytest.param(Problem(Shape(1, 128, 8, 32, 2, 32, 16), dtype="bfloat16"), SMALL, {}, id="bf16-8-chunks-g2"),
    pytest.param(Problem(Shape(1, 70, 4, 32, 4, 32, 32), dtype="float32", has_z=True, has_initial_states=True,
                         nseqs=3, varlen=True), SMALL, {}, id="cu_seqlens-init-z-g4", marks=pytest.mark.slow),
    pytest.param(Problem(Shape(2, 50, 4, 32, 2, 32, 16), dtype="float32", has_initial_states=True, nseqs=3), SMALL,
                 {"transposed_layout": False}, id="seq_idx-per-row-init-headdim-major", marks=pytest.mark.slow),
    pytest.param(Problem(Shape(1, 40, 4, 32, 2, 32, 16), dtype="float32", dt_softplus=False, has_D=False,
                         dt_limit=(0.005, 0.05)), SMALL, {}, id="limit-no-softplus-no-D", marks=pytest.mark.slow),
    pytest.param(Problem(Shape(1, 37, 3, 40, 1, 48, 16), dtype="float32", has_z=True, D_per_channel=True), SMALL, {},
                 id="dims-not-pow2", marks=pytest.mark.slow),
    pytest.param(Problem(Shape(1, 40, 4, 32, 2, 32, 16), dtype="float32", state_dtype="float32",
                         has_initial_states=True, has_dt_bias=False), SMALL, {}, id="fp32-states-no-bias",
                 marks=pytest.mark.slow),
]


def _emulated(monkeypatch, tiles: dict, **switches) -> EmulatedForward:
    monkeypatch.setattr(tune, "fallback", lambda stage, major, dtype: dict(tiles[stage]))
    return EmulatedForward(cb_precision="fp32", tuning="fallback", **switches)


@pytest.mark.parametrize("problem, tiles, switches", CASES)
def test_every_gradient_passes_the_gate_under_emulation(monkeypatch, problem, tiles, switches):
    backend = _emulated(monkeypatch, tiles, **switches)
    with emulated_launches():
        report = check_gradients(backend, make_inputs(problem, seed=2), problem.torch_dtype, seed=2)
    print({name: round(r["bound_ratio"], 3) for name, r in report.items()})
    names = {"dx", "ddt", "dA", "dB", "dC"} | {f"d{n}" for n, on in (
        ("D", problem.has_D), ("z", problem.has_z), ("dt_bias", problem.has_dt_bias),
        ("initial_states", problem.has_initial_states)) if on}
    assert set(report) == names, report
    failing = {name: (round(r["bound_ratio"], 3), r["where"]) for name, r in report.items() if not r["ok"]}
    assert not failing, failing


def test_saved_and_recomputed_states_give_the_same_bits_under_emulation(monkeypatch):
    inputs = make_inputs(RICH, seed=5)
    grads_in = output_gradients(inputs, 5)
    kw = forward_arguments(inputs)
    found = []
    for recompute in (False, True):
        leaves = _leaves(kw)
        with emulated_launches():
            out = impls.ssd(**{**kw, **leaves}, backend=_emulated(monkeypatch, SMALL, bwd_recompute_states=recompute))
            grads = torch.autograd.grad([out.y, out.final_states], list(leaves.values()),
                                        [grads_in["y"].to(out.y.dtype), grads_in["final_states"].float()])
        found.append(dict(zip(leaves, grads)))
    for name, grad in found[0].items():
        assert torch.equal(grad, found[1][name]), name


# --- switch bwd_cb='shared': the groups' C·Bᵀ by cb_kernel, loaded by the chunk kernel ---------------------------
BWD_CB_CASES = [
    pytest.param(RICH, SMALL, id="z-Dchannel-init-seq_idx-g2"),
    pytest.param(Problem(Shape(1, 50, 8, 32, 2, 32, 32), dtype="float32", has_z=True, has_initial_states=True,
                         nseqs=2), ROWS_LONGER, id="z-init-seq_idx-g2-4-heads-per-group"),
]


def _poisoned_cb_launches(monkeypatch) -> list:
    """Every cb_kernel launch's `lower` flag, its output filled with NaN before the kernel writes it (the tiles it
    leaves unwritten stay NaN), its tiles 8 × 8 (chunk.CB_TILE) so that a chunk of 32 has 6 unwritten of 16."""
    from impls.cutile import compute_out
    from impls.cutile.backward import chunk

    monkeypatch.setattr(chunk, "CB_TILE", 8)
    calls, cb_launch = [], compute_out.cb_launch

    def poisoned(*args, **kwargs):
        cb, call = cb_launch(*args, **kwargs)
        calls.append((kwargs.get("lower"), call.grid))
        return cb.fill_(float("nan")), call

    monkeypatch.setattr(compute_out, "cb_launch", poisoned)
    return calls


@pytest.mark.parametrize("problem, tiles", BWD_CB_CASES)
def test_bwd_cb_shared_passes_the_gate_under_emulation(monkeypatch, problem, tiles):
    """Switch bwd_cb='shared': the chunk kernel's (rows × sources) tiles straddle cb_kernel's unwritten tiles above
    the diagonal (SMALL: sources 16..31 × rows 16..23 reach source block 3 of row block 2; ROWS_LONGER: rows 0..15 ×
    sources 8..15 reach block (0, 1)), NaN here: only the causal elements may be kept. One cb_kernel launch per
    backward, lower triangle, 10 programs per (batch, chunk) of 4 × 4 blocks."""
    calls = _poisoned_cb_launches(monkeypatch)
    backend = _emulated(monkeypatch, tiles, bwd_cb="shared")
    with emulated_launches():
        report = check_gradients(backend, make_inputs(problem, seed=2), problem.torch_dtype, seed=2)
    failing = {name: (round(r["bound_ratio"], 3), r["where"]) for name, r in report.items() if not r["ok"]}
    assert not failing, failing
    nchunks = -(-problem.shape.seqlen // problem.shape.chunk_size)
    assert calls == [(True, (problem.shape.batch * nchunks * 10, problem.shape.ngroups))], calls


def test_bwd_cb_shared_reads_the_buffer_under_emulation(monkeypatch):
    """The same backward with the groups' C·Bᵀ scaled by 1.01 fails the gate at dx: the chunk kernel reads it."""
    from impls.cutile.backward import chunk

    shared_cb = chunk.shared_cb
    monkeypatch.setattr("impls.cutile.backward.run.shared_cb", lambda *a, **k: shared_cb(*a, **k) * 1.01)
    backend = _emulated(monkeypatch, SMALL, bwd_cb="shared")
    with emulated_launches():
        report = check_gradients(backend, make_inputs(RICH, seed=2), torch.float32, seed=2)
    assert not report["dx"]["ok"], report


def test_bwd_cb_enters_the_chunk_kernels_record_key_only():
    """'shared' changes bwd_chunk's code only: its record key, not the other kernels' (whose records it keeps)."""
    keys = {v: {s: tune.record_key(CutileSwitches(bwd_cb=v), "b1-l256", "bfloat16", {}, s) for s in tune.STAGES}
            for v in ("inline", "shared")}
    assert [s for s in tune.STAGES if keys["inline"][s] != keys["shared"][s]] == [tune.CHUNK]
    assert "bwd_cb" not in keys["inline"][tune.CHUNK] and "shared" in keys["shared"][tune.CHUNK]


@pytest.mark.quick
def test_bwd_cb_shared_launches_cb_kernel_before_the_chunk_kernel():
    """On the contract's shape (ngroups 2, seq_idx, seqlen 1000 = 3 chunks + 232): cb_kernel's lower triangle at
    64 × 64 tiles, 10 programs per (batch, chunk), one per group, its (b, c, g, chunk, chunk) fp32 output the chunk
    kernel's cbm; every other kernel as with 'inline'."""
    launches = _intercepted_backward(CONTRACT, bwd_cb="shared")[0]
    names = [name for name, _, _ in launches]
    assert names[4:] == ["bwd_state_pass_kernel", "cb_kernel", *BACKWARD_KERNELS[1:]]
    by_name = {name: (grid, args) for name, grid, args in launches[4:]}
    grid, args = by_name["cb_kernel"]
    assert grid == (2 * 4 * 10, 2) and args["LOWER"] is True and args["BL"] == 64
    assert args["cb"] is by_name["bwd_chunk_kernel"][1]["cbm"]
    assert (tuple(args["cb"].shape), args["cb"].dtype) == ((2, 4, 2, 256, 256), torch.float32)
    assert by_name["bwd_chunk_kernel"][1]["SHARED_CB"] is True


# --- switch bwd_state_split: the state pass's weighted dŷ as hi + lo operands into one fp32 accumulator ---------
BF16_CARRY = Problem(Shape(2, 40, 8, 32, 2, 32, 16), dtype="bfloat16", has_z=True, has_initial_states=True)


def test_bwd_state_split_takes_da_and_dinitial_states_well_inside_the_gate_under_emulation(monkeypatch):
    """bf16, 3 chunks, seed 1: dA's carried term d_c ⟨R, S_c⟩ and dinitial_states read the carried R. With the
    weighted dŷ rounded once (off) dA sits at 0.39 of its bound and dinitial_states at 0.30; split, at 0.09 and 0."""
    ratios = {}
    for split in (True, False):
        backend = _emulated(monkeypatch, SMALL, bwd_state_split=split)
        with emulated_launches():
            report = check_gradients(backend, make_inputs(BF16_CARRY, seed=1), torch.bfloat16, seed=1)
        ratios[split] = {name: round(r["bound_ratio"], 3) for name, r in report.items()}
        assert split is False or all(r["ok"] for r in report.values()), ratios
    print("bwd_state_split on:", ratios[True], "off:", ratios[False])
    assert ratios[True]["dA"] < 0.5 * ratios[False]["dA"], ratios
    assert ratios[True]["dinitial_states"] < 0.5 * ratios[False]["dinitial_states"], ratios


def test_bwd_state_split_reaches_the_state_pass_kernel():
    """The kernel's SPLIT argument: on for bf16 inputs by default (the contract's shape, launches intercepted), off
    with the switch off, off for fp32 inputs (whose operand is not rounded)."""
    def split(**switches):
        launches = _intercepted_backward(CONTRACT, **switches)[0]
        return [args["SPLIT"] for name, _, args in launches if name == "bwd_state_pass_kernel"]

    assert split() == [True] and split(bwd_state_split=False) == [False]
    for dtype, expected in ((torch.bfloat16, True), (torch.float16, True), (torch.float32, False)):
        got = _named_args(tune.STATE_PASS, dtype, CutileSwitches())["SPLIT"]
        assert got is expected, (dtype, got)
    assert _named_args(tune.STATE_PASS, torch.bfloat16, CutileSwitches(bwd_state_split=False))["SPLIT"] is False


def _named_args(kernel, dtype, switches) -> dict:
    """The AOT build's arguments of `kernel` by its parameters' names."""
    from impls.cutile.backward import chunk, cumsum, db, dcb, state_pass

    pyfunc = {tune.STATE_PASS: state_pass.bwd_state_pass_kernel, tune.CHUNK: chunk.bwd_chunk_kernel,
              tune.DCB: dcb.bwd_dcb_kernel, tune.DB: db.bwd_db_kernel, tune.CUMSUM: cumsum.bwd_cumsum_kernel}[kernel]
    return dict(zip(_param_names(pyfunc), build_call(kernel, dtype, switches).args))


def test_bwd_state_split_enters_the_state_pass_record_key_only_when_off():
    """Off changes bwd_state_pass's code: its record key (the defaults' keys, and the other kernels', unchanged)."""
    keys = {v: {s: tune.record_key(CutileSwitches(bwd_state_split=v), "b1-l256", "bfloat16", {}, s)
                for s in tune.STAGES} for v in (True, False)}
    assert [s for s in tune.STAGES if keys[True][s] != keys[False][s]] == [tune.STATE_PASS]
    assert not any("bwd_state_split" in key for key in keys[True].values())
    assert "bwd_state_split=False" in keys[False][tune.STATE_PASS]


@needs_cuobjdump
def test_bwd_state_split_state_pass_compiles_with_its_second_mma():
    """sm_90 at S1 in bf16 (the headline's inputs and every optional input at ngroups 8), the fallback tiles: on
    (the default) twice the warpgroup MMAs of off, no local-memory spill either way."""
    found = {split: [_facts(tune.STATE_PASS, switches=CutileSwitches(bwd_state_split=split), dims=dims,
                            optional=optional) for dims, optional in (({}, None), ({"ngroups": 8}, EVERYTHING))]
             for split in (True, False)}
    for on, off in zip(found[True], found[False]):
        assert on["HGMMA"] == 2 * off["HGMMA"] > 0, (on, off)
        assert on["LDL"] + on["STL"] + off["LDL"] + off["STL"] == 0, (on, off)


# --- switch bwd_exp2_ftz: the backward's exp2 flushing subnormals to zero, as exp2_ftz does for the forward -------
def test_bwd_exp2_ftz_reaches_every_backward_kernel_and_keys_their_records_only_when_on():
    for kernel in KERNELS:
        assert _named_args(kernel, torch.bfloat16, CutileSwitches())["FTZ"] is False, kernel
        assert _named_args(kernel, torch.bfloat16, CutileSwitches(bwd_exp2_ftz=True))["FTZ"] is True, kernel
    keys = {v: {s: tune.record_key(CutileSwitches(bwd_exp2_ftz=v), "b1-l256", "bfloat16", {}, s)
                for s in tune.STAGES} for v in (False, True)}
    assert not any("bwd_exp2_ftz" in key for key in keys[False].values())
    assert all("bwd_exp2_ftz=True" in keys[True][s] for s in tune.STAGES), keys[True]


def test_bwd_exp2_ftz_keeps_every_gradient_in_the_gate_under_emulation(monkeypatch):
    """The emulator's exp2 does not flush (torch.exp2 keeps subnormals): this checks the plumbing (every kernel takes
    the switch and still computes its gradients), not the rounding, which the GPU test checks."""
    backend = _emulated(monkeypatch, SMALL, bwd_exp2_ftz=True)
    with emulated_launches():
        report = check_gradients(backend, make_inputs(HEADLINE, seed=2), HEADLINE.torch_dtype, seed=2)
    failing = {name: round(r["bound_ratio"], 3) for name, r in report.items() if not r["ok"]}
    assert not failing, failing


@needs_cuobjdump
@pytest.mark.parametrize("kernel", [tune.STATE_PASS, tune.CHUNK, tune.DCB, tune.DB])
def test_bwd_exp2_ftz_drops_the_subnormal_handling_around_each_ex2(kernel):
    """sm_90 at S1 in bf16, the fallback tiles: the same MUFU.EX2 count, fewer instructions (no compare and
    predicated scaling around each), no local-memory spill either way."""
    off, on = (_facts(kernel, switches=CutileSwitches(bwd_exp2_ftz=v)) for v in (False, True))
    assert on["MUFU.EX2"] == off["MUFU.EX2"] > 0, (on, off)
    assert on["instructions"] < off["instructions"], (on, off)
    assert on["LDL"] + on["STL"] + off["LDL"] + off["STL"] == 0, (on, off)


# --- switch bwd_group_split: each group's heads over k programs; bwd_atomics: their dC, dB added atomically --------
@pytest.mark.slow
@needs_cuobjdump
@pytest.mark.parametrize("arch", ["sm_90", "sm_100"])
@pytest.mark.parametrize("kernel", [tune.DCB, tune.DB])
@pytest.mark.parametrize("atomics", [False, True], ids=["partials", "atomics"])
def test_bwd_group_split_kernels_compile(kernel, arch, atomics):
    """bwd_group_split 4 at S1's blocks, ngroups 8, every optional input, bf16, the fallback tiles: no local-memory
    spill on sm_90; float atomic reductions (REDG…ADD.F32) with bwd_atomics, none without."""
    f = _facts(kernel, switches=CutileSwitches(bwd_group_split=4, bwd_atomics=atomics), dims={"ngroups": 8},
               optional=EVERYTHING, arch=arch)
    cubin = export(build_call(kernel, torch.bfloat16, CutileSwitches(bwd_group_split=4, bwd_atomics=atomics),
                              {"ngroups": 8}, optional=EVERYTHING), arch)
    reds = sum(n for op, n in opcodes(cubin_facts(cubin).sass).items() if op.startswith("RED") and "ADD.F32" in op)
    assert (reds > 0) == atomics, reds
    if arch == "sm_90":
        assert f["LDL"] + f["STL"] == 0, f


@pytest.mark.quick
def test_bwd_group_split_launches_k_programs_per_group_into_partials():
    """On the contract's shape (ngroups 2, 4 heads per group): bwd_dcb and bwd_db launch 4 times the programs, dG
    holds 4 partials per group and dC's and dB's buffers are fp32 partials (b, seqlen, ngroups·4, dstate); with
    bwd_atomics one fp32 buffer per group; the per-sequence term never enters db (none here)."""
    b, nchunks, g, n, chunk = 2, 4, 2, 128, 256
    dcb_tile, db_tile = tune.FALLBACK[9][tune.DCB]["block"], tune.FALLBACK[9][tune.DB]["block"]
    for atomics, planes in ((False, g * 4), (True, g)):
        launches = _intercepted_backward(CONTRACT, bwd_group_split=4, bwd_atomics=atomics)[0]
        by_name = {name: (grid, args) for name, grid, args in launches[4:]}
        (dcb_grid, dcb_args), (db_grid, db_args) = by_name["bwd_dcb_kernel"], by_name["bwd_db_kernel"]
        assert dcb_grid == ((chunk // dcb_tile) * g * 4 * nchunks * b, 1, 1)
        assert db_grid == ((chunk // db_tile) * g * 4 * nchunks * b, 1, 1)
        assert (tuple(dcb_args["dG"].shape), dcb_args["dG"] is db_args["dG"]) == ((b, nchunks, g * 4, chunk, chunk),
                                                                                  True)
        for out in (dcb_args["dC"], db_args["dB"]):
            assert (tuple(out.shape), out.dtype) == ((b, 1000, planes, n), torch.float32)
        assert (dcb_args["SPLIT"], dcb_args["ATOMIC"], db_args["SPLIT"], db_args["ATOMIC"]) == (4, atomics, 4, atomics)


GROUP_SPLIT_CASES = [
    pytest.param(HEADLINE, {"bwd_group_split": 2}, id="group-split-2-of-4-heads"),
    pytest.param(Problem(Shape(1, 37, 3, 40, 1, 48, 16), dtype="float32", has_z=True), {"bwd_group_split": 2},
                 id="group-split-2-of-3-heads-not-dividing"),
    pytest.param(RICH, {"bwd_group_split": 2, "bwd_atomics": True}, id="group-split-2-atomics-z-seq_idx-g2"),
    pytest.param(Problem(Shape(1, 70, 8, 32, 2, 32, 32), dtype="float32", has_initial_states=True, nseqs=3,
                         varlen=True), {"bwd_group_split": 8}, id="group-split-8-of-4-heads-cu_seqlens",
                 marks=pytest.mark.slow),
]


@pytest.mark.parametrize("problem, switches", GROUP_SPLIT_CASES)
def test_bwd_group_split_passes_the_gate_under_emulation(monkeypatch, problem, switches):
    """k programs per group, heads [p·H/k, (p+1)·H/k) each: shares of 2 + 2, of 1 + 2 (3 heads), atomic adds, and
    shares of 0 or 1 head (8 programs for 4 heads, the per-sequence states' term of dB added to the partials' sum)."""
    backend = _emulated(monkeypatch, SMALL, **switches)
    with emulated_launches():
        report = check_gradients(backend, make_inputs(problem, seed=2), problem.torch_dtype, seed=2)
    failing = {name: (round(r["bound_ratio"], 3), r["where"]) for name, r in report.items() if not r["ok"]}
    assert not failing, failing


# --- switch bwd_dcb_sources='chunk': the dcb kernel's row tile against the whole chunk of sources per head --------
DCB_SOURCES_CASES = [
    pytest.param(Problem(Shape(1, 72, 4, 32, 1, 32, 32), dtype="float32"), {}, id="headline-short-last-chunk",
                 marks=pytest.mark.quick),
    pytest.param(RICH, {}, id="z-Dchannel-init-seq_idx-g2"),
    pytest.param(RICH, {"bwd_group_split": 2, "bwd_atomics": True}, id="group-split-2-atomics-z-seq_idx-g2"),
    pytest.param(Problem(Shape(1, 70, 8, 32, 2, 32, 32), dtype="float32", has_initial_states=True, nseqs=3,
                         varlen=True), {"bwd_group_split": 2}, id="group-split-2-cu_seqlens", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("problem, switches", DCB_SOURCES_CASES)
def test_bwd_dcb_sources_chunk_passes_the_gate_under_emulation(monkeypatch, problem, switches):
    """Row tiles of 8 against chunks of 32 sources: the tile products above the diagonal masked to zero, a short last
    chunk (its sources past the end padded), seq_idx's other sequences masked, the entering states' term in the same
    head walk, the group's heads split over programs."""
    backend = _emulated(monkeypatch, SMALL, bwd_dcb_sources="chunk", **switches)
    with emulated_launches():
        report = check_gradients(backend, make_inputs(problem, seed=2), problem.torch_dtype, seed=2)
    failing = {name: (round(r["bound_ratio"], 3), r["where"]) for name, r in report.items() if not r["ok"]}
    assert not failing, failing


@needs_cuobjdump
def test_bwd_dcb_sources_chunk_compiles_for_sm90_without_spills():
    """S1 in bf16 at the fallback's 32-row tiles (two warpgroups): no local-memory spill, also at ngroups 8 with every
    optional input; no more registers than 'tiles'. The build holds one head walk per source width (32, 64, 128 and
    256 sources: impls/chunked_backward.py source_widths), so its static instruction count is no measure of what a
    program issues."""
    tiles = _facts(tune.DCB)
    chunk = _facts(tune.DCB, switches=CutileSwitches(bwd_dcb_sources="chunk"))
    everything = _facts(tune.DCB, switches=CutileSwitches(bwd_dcb_sources="chunk"), dims={"ngroups": 8},
                        optional=EVERYTHING)
    assert chunk["registers"] <= tiles["registers"], (tiles, chunk)
    assert chunk["LDL"] + chunk["STL"] + everything["LDL"] + everything["STL"] == 0, (chunk, everything)


@pytest.mark.parametrize("chunk, block, levels", [(256, 64, 3), (256, 32, 4), (128, 64, 2), (64, 64, 1), (32, 8, 3)])
def test_bwd_dcb_sources_chunk_row_tiles_read_up_to_their_causal_width(chunk, block, levels):
    """Row tile i reads the smallest width of BT·2^level that holds its sources 0 … (i + 1)·BT − 1."""
    from impls.chunked_backward import source_widths

    assert source_widths(chunk, block) == levels
    for i in range(chunk // block):
        level = next(lv for lv in range(levels) if (1 << lv) > i >= ((1 << lv) >> 1))
        width = block << level
        assert (i + 1) * block <= width <= chunk and (level == 0 or i * block >= width // 2)


# --- switch bwd_decay_factor: the decays of the row tiles below the diagonal as an outer product ------------------
BELOW_DIAGONAL = Problem(Shape(1, 72, 4, 32, 1, 32, 32), dtype="float32")  # chunks of 32 over 16-wide source tiles


@pytest.mark.parametrize("problem, switches, factored", [
    pytest.param(BELOW_DIAGONAL, {}, True, id="below-diagonal-tiles", marks=pytest.mark.quick),
    pytest.param(BELOW_DIAGONAL, {"bwd_cb": "shared"}, True, id="below-diagonal-tiles-bwd_cb-shared"),
    pytest.param(dataclasses.replace(RICH, dtype="bfloat16"), {}, False, id="bf16-z-Dchannel-init-seq_idx-g2"),
])
def test_bwd_decay_factor_passes_the_gate_and_reaches_the_kernel_under_emulation(monkeypatch, problem, switches,
                                                                                  factored):
    """Below the diagonal of the full chunks the factored decays (the 8-row tiles past the 16-wide source tile): dx
    not bit-for-bit the unfactored one there (the factored branch ran); with seq_idx every tile keeps the masked
    exponential, and dx is the same bits. Every gradient within the gate either way."""
    inputs = make_inputs(problem, seed=3)
    found = [_gated_gradient(_emulated(monkeypatch, SMALL, bwd_decay_factor=factor, **switches), problem, inputs, 3,
                             "x") for factor in (False, True)]
    assert torch.equal(found[0], found[1]) != factored


def _gated_gradient(backend, problem, inputs, seed: int, leaf: str) -> torch.Tensor:
    """Under emulation: every gradient of `backend` within the gate (seed `seed`), then `leaf`'s gradient of one call
    through impls.ssd given the seed's output gradients, for bit comparisons between arms."""
    grads_in = output_gradients(inputs, seed)
    kw = forward_arguments(inputs)
    with emulated_launches():
        report = check_gradients(backend, inputs, problem.torch_dtype, seed=seed)
        failing = {name: (round(r["bound_ratio"], 3), r["where"]) for name, r in report.items() if not r["ok"]}
        assert not failing, (backend.switches, failing)
        leaves = _leaves(kw)
        out = impls.ssd(**{**kw, **leaves}, backend=backend)
        return torch.autograd.grad([out.y, out.final_states], [leaves[leaf]],
                                   [grads_in["y"].to(out.y.dtype), grads_in["final_states"].float()])[0]


@needs_cuobjdump
def test_bwd_decay_factor_chunk_kernel_compiles_with_fewer_exponentials():
    """S1 in bf16 at the H100 record's tiles (64 × 64, occupancy 2, one warpgroup): fewer MUFU.EX2 than off, with and
    without bwd_exp2_ftz; at most a couple of local loads and stores."""
    tiles = {"block_sources": 64, "block_rows": 64, "occupancy": 2, "worker_warps": 0}
    for ftz in (False, True):
        off = _facts(tune.CHUNK, switches=CutileSwitches(bwd_exp2_ftz=ftz), config=tiles)
        on = _facts(tune.CHUNK, switches=CutileSwitches(bwd_exp2_ftz=ftz, bwd_decay_factor=True), config=tiles)
        assert 0 < on["MUFU.EX2"] < off["MUFU.EX2"], (off, on)
        assert on["LDL"] + on["STL"] <= 4, on


def test_bwd_decay_factor_enters_the_chunk_kernels_record_key_only():
    keys = {v: {s: tune.record_key(CutileSwitches(bwd_decay_factor=v), "b1-l256", "bfloat16", {}, s)
                for s in tune.STAGES} for v in (False, True)}
    assert [s for s in tune.STAGES if keys[False][s] != keys[True][s]] == [tune.CHUNK]


# --- switch bwd_entry_term: dΛ's entering-state term in the state pass or dcb instead of the chunk kernel -----------
@pytest.mark.parametrize("problem, tiles, term, switches", [
    pytest.param(HEADLINE, SMALL, "state_pass", {}, id="state_pass-headline-g1", marks=pytest.mark.quick),
    pytest.param(RICH, ROWS_LONGER, "state_pass", {}, id="state_pass-z-Dchannel-init-seq_idx-g2"),
    pytest.param(dataclasses.replace(RICH, dtype="bfloat16"), SMALL, "state_pass", {},
                 id="state_pass-bf16-z-Dchannel-init-seq_idx-g2"),
    pytest.param(Problem(Shape(1, 70, 4, 32, 4, 32, 32), dtype="float32", has_z=True, has_initial_states=True,
                         nseqs=3, varlen=True), SMALL, "state_pass", {}, id="state_pass-cu_seqlens-init-z-g4",
                 marks=pytest.mark.slow),
    pytest.param(Problem(Shape(1, 200, 4, 32, 1, 32, 128), dtype="float32"), SMALL, "state_pass", {},
                 id="state_pass-chunk128-two-row-blocks"),
    pytest.param(HEADLINE, SMALL, "dcb", {}, id="dcb-headline-g1", marks=pytest.mark.quick),
    pytest.param(RICH, ROWS_LONGER, "dcb", {"bwd_dcb_sources": "chunk"},
                 id="dcb-chunk-sources-z-Dchannel-init-seq_idx-g2"),
    pytest.param(dataclasses.replace(RICH, dtype="bfloat16"), SMALL, "dcb", {"bwd_group_split": 2},
                 id="dcb-split2-bf16-z-Dchannel-init-seq_idx-g2"),
])
def test_bwd_entry_term_away_from_the_chunk_kernel_passes_the_gate_under_emulation(monkeypatch, problem, tiles, term,
                                                                                    switches):
    """The entering state's term of dΛ formed by the reverse state pass (per state tile, in row blocks of at most 64)
    or by the dcb kernel (per head and row tile, either walk of its sources, the heads split) and added by the cumsum
    kernel: every gradient within the gate, and A's gradient (fp32) not the same bits as the chunk kernel's (the term
    is summed in another order), so the other kernel's branch ran."""
    inputs = make_inputs(problem, seed=4)
    found = [_gated_gradient(_emulated(monkeypatch, tiles, bwd_entry_term=value, **switches), problem, inputs, 4, "A")
             for value in ("chunk", term)]
    assert not torch.equal(found[0], found[1])


@needs_cuobjdump
def test_bwd_entry_term_lightens_the_chunk_kernel():
    """S1 in bf16 at the H100 record's chunk tiles (64 × 64, occupancy 2, one warpgroup): with the term in the state
    pass the chunk kernel issues one HGMMA group fewer per program and fewer instructions, without spills; the state
    pass at its record's tiles (64 × 128, occupancy 2) and the dcb kernel at its own compile with the extra MMA."""
    tiles = {"block_sources": 64, "block_rows": 64, "occupancy": 2, "worker_warps": 0}
    here = _facts(tune.CHUNK, config=tiles)
    there = _facts(tune.CHUNK, switches=CutileSwitches(bwd_entry_term="state_pass"), config=tiles)
    assert there["HGMMA"] < here["HGMMA"] and there["instructions"] < here["instructions"], (here, there)
    assert there["LDL"] + there["STL"] == 0, there
    state = _facts(tune.STATE_PASS, switches=CutileSwitches(bwd_entry_term="state_pass"),
                   config={"block_headdim": 64, "block_dstate": 128, "occupancy": 2, "worker_warps": 0})
    assert state["HGMMA"] > _facts(tune.STATE_PASS, config={"block_headdim": 64, "block_dstate": 128, "occupancy": 2,
                                                           "worker_warps": 0})["HGMMA"], state
    dcb = {"block": 64, "occupancy": 0, "worker_warps": 8}  # the H100 record's dcb tiles under 'chunk' sources
    plain = _facts(tune.DCB, switches=CutileSwitches(bwd_dcb_sources="chunk"), config=dcb)
    with_term = _facts(tune.DCB, switches=CutileSwitches(bwd_dcb_sources="chunk", bwd_entry_term="dcb"), config=dcb)
    assert with_term["HGMMA"] > plain["HGMMA"], (plain, with_term)


def test_bwd_entry_term_enters_every_kernels_key_but_db():
    keys = {v: {s: tune.record_key(CutileSwitches(bwd_entry_term=v), "b1-l256", "bfloat16", {}, s)
                for s in tune.STAGES} for v in ("chunk", "state_pass", "dcb")}
    for value in ("state_pass", "dcb"):
        assert [s for s in tune.STAGES if keys["chunk"][s] != keys[value][s]] == [
            tune.STATE_PASS, tune.CHUNK, tune.DCB, tune.CUMSUM], value


def test_two_calls_under_bwd_group_split_give_the_same_bits_under_emulation(monkeypatch):
    """The split's partials summed without atomics (not so under bwd_atomics on a GPU:
    tests/gpu/test_cutile_backward.py)."""
    inputs = make_inputs(RICH, seed=5)
    grads_in = output_gradients(inputs, 5)
    kw = forward_arguments(inputs)
    found = []
    for _ in range(2):
        leaves = _leaves(kw)
        with emulated_launches():
            out = impls.ssd(**{**kw, **leaves}, backend=_emulated(monkeypatch, SMALL, bwd_group_split=2))
            grads = torch.autograd.grad([out.y, out.final_states], list(leaves.values()),
                                        [grads_in["y"].to(out.y.dtype), grads_in["final_states"].float()])
        found.append(dict(zip(leaves, grads)))
    for name, grad in found[0].items():
        assert torch.equal(grad, found[1][name]), name


def test_bwd_atomics_without_a_split_is_refused_naming_both_switches():
    with pytest.raises(ValueError, match="bwd_atomics.*bwd_group_split=1"):
        CutileSwitches(bwd_atomics=True)


def test_bwd_group_split_enters_the_per_group_kernels_record_keys_only():
    """bwd_group_split and bwd_atomics change bwd_dcb's and bwd_db's code: their record keys, not the other kernels'
    (whose records they keep); the defaults' keys name neither."""
    keys = [{s: tune.record_key(CutileSwitches(**sw), "b1-l256", "bfloat16", {}, s) for s in tune.STAGES}
            for sw in ({}, {"bwd_group_split": 4}, {"bwd_group_split": 4, "bwd_atomics": True})]
    for away in keys[1:]:
        assert [s for s in tune.STAGES if keys[0][s] != away[s]] == [tune.DCB, tune.DB]
    assert len({k[tune.DCB] for k in keys}) == 3
    assert not any("bwd_group_split" in key or "bwd_atomics" in key for key in keys[0].values())
