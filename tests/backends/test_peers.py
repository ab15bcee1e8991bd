"""CPU tests of the external peers' adapters ("tilegym", "fla"): refusals with reasons, clean loading, and the
argument mapping checked against the float64 reference with the peer's kernels replaced by their math.

The peers' kernels cannot run here (TileGym: cuTile, CUDA only; FLA: fails under the Triton interpreter, see
impls/fla/backend.py), so each test swaps the one call into the peer for a float64 model of what the peer
computes, in the peer's own conventions (layouts, base-2 decays, (K, V) states); everything the adapter does
around it runs for real. tests/gpu/test_peers.py runs the real kernels.
"""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch

from impls.fla import mapping
from impls.fla import peer as fla_peer
from impls.fla.backend import FlaBackend
from impls.fla.mapping_study import gla_sequential
from impls.inputs import make_inputs
from impls.problem import Problem, Shape
from impls.reference.compute_out import compute_out as ref_compute_out
from impls.reference.fwd_pass_state import fwd_pass_state as ref_fwd_pass_state
from impls.tilegym import adapter, loader, precompile, tune
from impls.tilegym.backend import TilegymBackend
from impls.tolerance import rel_err, tolerance
from tests.common import TINY, float64_forward

EVEN = dataclasses.replace(TINY, seqlen=128)  # TileGym needs seqlen % chunk_size == 0


# --- refusals ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("problem, overrides, reason", [
    pytest.param(Problem(TINY), {}, "not a multiple of chunk_size", id="seqlen-not-multiple"),
    pytest.param(Problem(EVEN, nseqs=3), {}, "seq_idx", id="seq_idx"),
    pytest.param(Problem(dataclasses.replace(EVEN, batch=1), varlen=True, nseqs=3), {}, "cu_seqlens",
                 id="cu_seqlens"),
    pytest.param(Problem(dataclasses.replace(EVEN, nheads=6, ngroups=1)), {}, "nheads 6", id="nheads-6"),
    pytest.param(Problem(dataclasses.replace(EVEN, chunk_size=48, seqlen=96)), {}, "power of two",
                 id="chunk-48"),
    pytest.param(Problem(EVEN, dtype="float64"), {}, "dtype float64", id="float64"),
    pytest.param(Problem(dataclasses.replace(EVEN, dstate=24)), {}, "dstate 24", id="dstate-24"),
    pytest.param(Problem(EVEN), {"bht": False}, "search space", id="bth-at-chunk-32"),
])
def test_tilegym_refuses(problem, overrides, reason):
    ok, why = TilegymBackend(**overrides).supports(problem)
    assert not ok and reason in why, why


@pytest.mark.parametrize("problem, overrides, reason", [
    pytest.param(Problem(TINY, nseqs=3), {}, "seq_idx without cu_seqlens", id="seq_idx"),
    pytest.param(Problem(TINY, varlen=True, nseqs=3), {}, "batch 1", id="cu_seqlens-batch-2"),
    pytest.param(Problem(TINY, state_dtype="float32"), {}, "state_dtype", id="state_dtype"),
    pytest.param(Problem(TINY, dtype="float64"), {}, "dtype float64", id="float64"),
    pytest.param(Problem(dataclasses.replace(TINY, chunk_size=48)), {"chunk": "requested"}, "power-of-two",
                 id="requested-chunk-48"),
])
def test_fla_refuses(problem, overrides, reason):
    ok, why = FlaBackend(**overrides).supports(problem)
    assert not ok and reason in why, why


def test_supported_problems_are_accepted():
    assert TilegymBackend().supports(Problem(EVEN, has_initial_states=True, has_z=True)) == (True, "")
    assert FlaBackend().supports(Problem(TINY, has_z=True, D_per_channel=True)) == (True, "")
    assert FlaBackend().supports(Problem(dataclasses.replace(TINY, batch=1), varlen=True, nseqs=3)) == (True, "")


@pytest.mark.parametrize("cls, reason", [pytest.param(TilegymBackend, "CUDA devices only", id="tilegym"),
                                          pytest.param(FlaBackend, "interpreter", id="fla")])
def test_cpu_tensors_refused_with_reason(cls, reason):
    ok, why = cls().check_device(torch.device("cpu"))
    assert not ok and reason in why, why


def test_fla_has_no_stages():
    backend = FlaBackend()
    assert backend.STAGES == ("forward",)
    with pytest.raises(NotImplementedError, match="no stage split"):
        backend.chunk_cumsum(None, None, 64, None, False, (0.0, float("inf")))
    assert backend.describe()["chunk_size_used"] == 64
    assert FlaBackend(chunk="requested").chunk_used(128) == 128


@pytest.mark.parametrize("stage", ["chunk_cumsum", "fwd_pass_state", "compute_out"])
def test_public_stage_entries_refuse_forward_only_peers(stage):
    """impls.chunk_cumsum & co. on a forward-only peer name the missing stage and why, instead of judging the
    stage's partial Problem by the forward's rules ("ngroups 0 does not divide nheads")."""
    import impls
    from impls.vllm.backend import VllmBackend

    inputs = make_inputs(Problem(Shape(1, 40, 2, 16, 1, 16, 16)), seed=0, dtype=torch.float32)
    ref = impls.ssd_forward(**inputs.forward_kwargs())
    calls = {
        "chunk_cumsum": lambda b: impls.chunk_cumsum(inputs.dt, inputs.A, 16, backend=b),
        "fwd_pass_state": lambda b: impls.fwd_pass_state(inputs.B, inputs.x, ref.dt, ref.dA_cumsum, backend=b),
        "compute_out": lambda b: impls.compute_out(inputs.C, inputs.B, inputs.x, ref.dt, ref.dA_cumsum, ref.states,
                                                   backend=b),
    }
    for backend, why in ((FlaBackend(), "no stage split"), (VllmBackend(), "only the whole forward")):
        with pytest.raises(impls.BackendUnavailable, match=rf"has no stage '{stage}' of its own: .*{why}"):
            calls[stage](backend)


# --- loading TileGym without its package __init__ ---------------------------------------------------------
def tilegym_or_skip():
    """TileGym's module, or the test skipped with the reason it cannot be loaded here (TileGym or cuda.tile not
    installed: both are optional peers)."""
    try:
        return loader.load()
    except ImportError as exc:
        pytest.skip(f"TileGym's module cannot be loaded here: {exc}")


def test_tilegym_module_loads_without_touching_the_gpu(monkeypatch):
    def probe(*args, **kwargs):
        raise AssertionError("the GPU was probed")

    for name in ("get_device_capability", "get_device_properties", "current_device", "current_stream"):
        monkeypatch.setattr(torch.cuda, name, probe)
    mod = tilegym_or_skip()
    assert mod.__name__ == loader.MODULE_NAME
    assert callable(mod._chunk_cumsum) and callable(mod._fwd_pass_state) and callable(mod._compute_out)
    assert "mamba2_chunk_forward/cutile" in loader.registered
    # the stand-ins are gone: a later genuine `import tilegym` would run TileGym's own __init__
    assert not any(name == "tilegym" or name.startswith("tilegym.") for name in sys.modules)


def test_tilegym_fallback_is_its_first_config_per_variant():
    mod = tilegym_or_skip()
    shape = Shape(1, 256, 8, 64, 1, 128, 128)
    first = vars(tune.space(mod, "fwd_pass_state", shape, {"SWAP": None, "BHT": None})[0])
    assert (first["SWAP"], first["BHT"]) == (False, True)
    pinned = tune.space(mod, "fwd_pass_state", shape, {"SWAP": True, "BHT": True})
    assert pinned and all(c.SWAP and c.BHT for c in pinned)
    assert not tune.space(mod, "fwd_pass_state", dataclasses.replace(shape, chunk_size=64),
                          {"SWAP": None, "BHT": False})


def test_tilegym_config_lands_under_the_key_its_wrapper_computes():
    """run_with installs the config where TileGym's `_chunk_cumsum` looks (same `_tuning_key`, autotune off)."""
    mod = tilegym_or_skip()
    A, dt = torch.randn(8), torch.randn(1, 64, 8)
    entry = (tune.SimpleNamespace(BLOCK_H=8, occupancy=4), object())

    def wrapper_lookup():  # what the wrapper does before launching
        return mod._chunk_cumsum_tune_cache[mod._tuning_key(A, dt, 64, mod.is_autotune_disabled())]

    assert tune.run_with(mod, "chunk_cumsum", entry, wrapper_lookup, (A, dt, 64)) is entry
    mod._chunk_cumsum_tune_cache.clear()


# --- the mapping, with the peer's kernels replaced by their math ------------------------------------------
class FakeTilegym:
    """TileGym 1.5.1's three wrappers as float64-capable math in its conventions: base-2 decays, BTH and BHT
    layouts, states (b, h, c, p, n), mandatory initial state, per-head D always added."""

    LOG2E = adapter.LOG2E

    @staticmethod
    def _chunk_cumsum(a, dt, chunk_size=64):
        b, t, h = dt.shape
        dA = (dt.to(a.dtype if dt.dtype != torch.float64 else dt.dtype) * a).reshape(b, t // chunk_size,
                                                                                    chunk_size, h)
        decay_bth = (dA.cumsum(2) * adapter.LOG2E).reshape(b, t, h)
        return decay_bth, decay_bth.transpose(1, 2).contiguous(), dt.transpose(1, 2).contiguous()

    @staticmethod
    def _chunks(t_bht, chunk_size):
        b, h, t = t_bht.shape
        return t_bht.reshape(b, h, t // chunk_size, chunk_size)

    @classmethod
    def _fwd_pass_state(cls, x, b, dt, dt_bht, decay_bth, decay_bht, init_state, chunk_size=64,
                        state_dtype=torch.float32):
        assert torch.equal(dt, dt_bht.transpose(1, 2)) and torch.equal(decay_bth, decay_bht.transpose(1, 2))
        assert init_state is not None and init_state.shape == (x.shape[0], x.shape[2], x.shape[3], b.shape[3])
        states, final = ref_fwd_pass_state(b, x, cls._chunks(dt_bht, chunk_size),
                                           cls._chunks(decay_bht, chunk_size) / adapter.LOG2E, init_state)
        return states.transpose(1, 2).contiguous().to(state_dtype), final.to(init_state.dtype)

    @classmethod
    def _compute_out(cls, x, b, c, d, dt_bht, decay_bht, hiddens, chunk_size=64):
        assert d.shape == (x.shape[2],)
        return ref_compute_out(c, b, x, cls._chunks(dt_bht, chunk_size),
                               cls._chunks(decay_bht, chunk_size) / adapter.LOG2E, hiddens.transpose(1, 2), D=d)


@pytest.fixture
def tilegym_math(monkeypatch):
    monkeypatch.setattr(loader, "load", lambda: FakeTilegym)
    backend = TilegymBackend(tuning="fallback")
    monkeypatch.setattr(backend, "_run", lambda stage, shape, dtype, call, key_args, state_dtype=None: call())
    return backend


TILEGYM_CASES = [
    pytest.param(Problem(EVEN), id="headline"),
    pytest.param(Problem(dataclasses.replace(EVEN, ngroups=1)), id="ngroups1"),
    pytest.param(Problem(EVEN, has_initial_states=True), id="initial-states"),
    pytest.param(Problem(EVEN, D_per_channel=True, has_z=True), id="D-per-channel-z"),
    pytest.param(Problem(EVEN, has_D=False, has_z=True), id="no-D-z"),
    pytest.param(Problem(EVEN, dt_limit=(0.005, 0.05)), id="dt_limit"),
    pytest.param(Problem(EVEN, dt_softplus=False, has_dt_bias=False), id="no-softplus-no-bias"),
]


@pytest.mark.parametrize("problem", TILEGYM_CASES)
def test_tilegym_adapter_reproduces_float64_reference(tilegym_math, problem):
    inputs = make_inputs(problem, dtype=torch.float64, seed=3)
    ref = float64_forward(inputs)
    kw = inputs.forward_kwargs()
    out = tilegym_math.ssd_forward(**kw)
    tol = tolerance(torch.float64)
    for name in ("y", "final_states", "dt", "dA_cumsum", "states"):
        assert rel_err(getattr(out, name), getattr(ref, name)) <= tol, name
    # stage by stage, each fed the reference's intermediates
    dt, dA = tilegym_math.chunk_cumsum(inputs.dt, inputs.A, inputs.chunk_size, inputs.dt_bias, inputs.dt_softplus,
                                       inputs.dt_limit)
    assert rel_err(dt, ref.dt) <= tol and rel_err(dA, ref.dA_cumsum) <= tol
    states, final = tilegym_math.fwd_pass_state(inputs.B, inputs.x, ref.dt, ref.dA_cumsum, inputs.initial_states,
                                                None, None)
    assert rel_err(states, ref.states) <= tol and rel_err(final, ref.final_states) <= tol
    y = tilegym_math.compute_out(inputs.C, inputs.B, inputs.x, ref.dt, ref.dA_cumsum, ref.states, inputs.D,
                                 inputs.z, None)
    assert rel_err(y, ref.y) <= tol


def test_tilegym_adapter_bf16_within_tolerance(tilegym_math):
    inputs = make_inputs(Problem(EVEN, D_per_channel=True, has_z=True), dtype=torch.bfloat16, seed=4)
    out = tilegym_math.ssd_forward(**inputs.forward_kwargs())
    assert out.y.dtype == torch.bfloat16 and out.final_states.dtype == torch.float32
    assert rel_err(out.y, float64_forward(inputs).y) <= tolerance(torch.bfloat16)


@pytest.fixture
def fla_math(monkeypatch):
    calls = []

    def run(args):
        calls.append(args)
        return gla_sequential(args.q, args.k, args.v, args.g, args.scale, args.initial_state, args.cu_seqlens,
                              args.state_v_first)

    monkeypatch.setattr(fla_peer, "run", run)
    return calls


FLA_CASES = [
    pytest.param(Problem(TINY), {}, id="headline"),
    pytest.param(Problem(dataclasses.replace(TINY, ngroups=1)), {}, id="ngroups1"),
    pytest.param(Problem(TINY, has_initial_states=True), {}, id="initial-states"),
    pytest.param(Problem(TINY, has_initial_states=True), {"state_v_first": True}, id="initial-states-v-first"),
    pytest.param(Problem(TINY, D_per_channel=True, has_z=True), {}, id="D-per-channel-z"),
    pytest.param(Problem(TINY, has_D=False, has_z=True), {}, id="no-D-z"),
    pytest.param(Problem(TINY, dt_limit=(0.005, 0.05)), {}, id="dt_limit"),
    pytest.param(Problem(TINY, dt_softplus=False, has_dt_bias=False), {}, id="no-softplus-no-bias"),
    pytest.param(Problem(dataclasses.replace(TINY, batch=1), varlen=True, nseqs=3, has_initial_states=True), {},
                 id="cu_seqlens-3-seqs-initial-states"),
    pytest.param(Problem(dataclasses.replace(TINY, batch=1), varlen=True, nseqs=3), {"state_v_first": True},
                 id="cu_seqlens-v-first"),
]


@pytest.mark.parametrize("problem, switches", FLA_CASES)
def test_fla_adapter_reproduces_float64_reference(fla_math, problem, switches):
    inputs = make_inputs(problem, dtype=torch.float64, seed=5)
    ref = float64_forward(inputs)
    backend = FlaBackend(**switches)
    kw = inputs.forward_kwargs()
    out = backend.ssd_forward(**kw)
    tol = tolerance(torch.float64)
    assert rel_err(out.y, ref.y) <= tol
    assert rel_err(out.final_states, ref.final_states) <= tol
    if problem.varlen:
        assert rel_err(out.varlen_states, ref.varlen_states) <= tol
    args = fla_math[-1]
    assert args.scale == 1.0 and args.chunk_size == 64
    assert args.q.shape[2] == problem.shape.nheads and args.g.dtype == torch.float64


@pytest.mark.parametrize("cu_seqlens", [
    pytest.param([0, 40, 40], id="empty-last"),  # FLA's last state is the empty sequence's zero, not the row's
    pytest.param([0, 38, 40, 40], id="empty-last-after-short"),
    pytest.param([0, 0, 40], id="empty-first"),  # FLA hands back the initial state as its final state
    pytest.param([0, 20, 20, 40], id="empty-middle"),
])
def test_fla_adapter_empty_packed_sequences(fla_math, cu_seqlens):
    """An empty sequence's state is zero and the row's final state is its last non-empty sequence's
    (impls/reference/sequential.py), with the contract's initial state given."""
    problem = Problem(dataclasses.replace(TINY, batch=1, seqlen=40), varlen=True, nseqs=2, has_initial_states=True)
    inputs = make_inputs(problem, dtype=torch.float64, seed=8)
    inputs.cu_seqlens, inputs.seq_idx = torch.tensor(cu_seqlens, dtype=torch.int32), None
    ref = float64_forward(inputs)
    out = FlaBackend().ssd_forward(**inputs.forward_kwargs())
    tol = tolerance(torch.float64)
    for name in ("y", "final_states", "varlen_states"):
        assert rel_err(getattr(out, name), getattr(ref, name)) <= tol, name


def test_fla_adapter_bf16_within_tolerance(fla_math):
    inputs = make_inputs(Problem(TINY, has_initial_states=True, has_z=True), dtype=torch.bfloat16, seed=6)
    out = FlaBackend().ssd_forward(**inputs.forward_kwargs())
    assert fla_math[-1].g.dtype == torch.float32 and fla_math[-1].v.dtype == torch.bfloat16
    assert rel_err(out.y, float64_forward(inputs).y) <= tolerance(torch.bfloat16)


def test_fla_mapping_near_misses_are_caught(fla_math):
    """The float64 check above can fail: FLA's default scale (K^-1/2) or base-2 gates give large errors."""
    inputs = make_inputs(Problem(TINY), dtype=torch.float64, seed=7)
    ref = float64_forward(inputs).y
    kw = dict(x=inputs.x, dt=inputs.dt, A=inputs.A, B=inputs.B, C=inputs.C, chunk_size=32, dt_bias=inputs.dt_bias,
              dt_softplus=True)
    args = mapping.gla_args(**kw)
    for change in ({"scale": TINY.dstate ** -0.5}, {"g": args.g * adapter.LOG2E}):
        bad = dataclasses.replace(args, **change)
        o, ht = gla_sequential(bad.q, bad.k, bad.v, bad.g, bad.scale)
        assert rel_err(mapping.finish(o, ht, inputs.x, inputs.D)[0], ref) > 1e-2


@pytest.mark.parametrize("ngroups", [1, 2], ids=["one-group", "two-groups"])
def test_fla_head_copies_are_real_contiguous_copies(ngroups):
    """q/k must be dense (b, t, h, n): a stride-0 head view would make FLA copy inside its own timed call."""
    B = torch.randn(2, 8, ngroups, 4)
    k = mapping.heads_from_groups(B, 4)
    assert k.is_contiguous() and k.stride(2) == 4 and torch.equal(k, B.repeat_interleave(4 // ngroups, dim=2))


# --- parallel precompilation before TileGym's search -----------------------------------------------------
def test_precompile_shares_cover_every_config_once():
    configs = [{"i": i} for i in range(7)]
    parts = precompile.shares(configs, 3)
    assert [len(p) for p in parts] == [3, 2, 2]
    assert sorted(c["i"] for p in parts for c in p) == list(range(7))
    assert precompile.shares(configs[:2], 8) == [[{"i": 0}], [{"i": 1}]]
    with pytest.raises(ValueError, match="workers=0"):
        precompile.shares(configs, 0)


def test_precompile_runs_each_config_under_the_wrappers_key(monkeypatch):
    """compile_share installs each config where TileGym's `_chunk_cumsum` looks it up, and runs the wrapper."""
    mod = tilegym_or_skip()
    seen = []

    def wrapper(a, dt, chunk_size=64):
        cfg, _kernel = mod._chunk_cumsum_tune_cache[mod._tuning_key(a, dt, chunk_size, mod.is_autotune_disabled())]
        seen.append(cfg.BLOCK_H)
        if cfg.BLOCK_H == 16:
            raise RuntimeError("this config does not compile")

    monkeypatch.setattr(mod, "_chunk_cumsum", wrapper)
    A, dt = torch.randn(8), torch.randn(1, 64, 8)
    call = precompile.WrapperCall(mod, "_chunk_cumsum", dict(a=A, dt=dt, chunk_size=64))
    configs = [{"BLOCK_H": bh, "occupancy": 4} for bh in (4, 8, 16)]
    out = precompile.compile_share("chunk_cumsum", Shape(1, 64, 8, 0, 0, 0, 64), call, (A, dt, 64), configs)
    assert seen == [4, 8, 16]
    assert out["compiled"] == 2 and out["failures"][0]["config"]["BLOCK_H"] == 16
    assert "does not compile" in out["failures"][0]["error"]
    mod._chunk_cumsum_tune_cache.clear()


def test_precompile_call_travels_without_its_module():
    import pickle

    call = precompile.WrapperCall(object(), "_compute_out", {"chunk_size": 128})
    back = pickle.loads(pickle.dumps(call))
    assert back.mod is None and back.name == "_compute_out" and back.kwargs == {"chunk_size": 128}


def test_precompile_reports_failing_workers_instead_of_hanging():
    """Two spawned workers run TileGym's real wrapper on CPU tensors: every launch fails, and the summary says so
    (config by config) — the parent neither hangs nor raises."""
    mod = tilegym_or_skip()
    A, dt = torch.randn(8), torch.randn(1, 64, 8)
    call = precompile.WrapperCall(mod, "_chunk_cumsum", dict(a=A, dt=dt, chunk_size=64))
    configs = [{"BLOCK_H": bh, "occupancy": 4} for bh in (4, 8, 16)]
    out = precompile.precompile("chunk_cumsum", Shape(1, 64, 8, 0, 0, 0, 64), call, (A, dt, 64), configs, 2)
    assert out["workers"] == 2 and out["configs"] == 3 and out["compiled"] == 0
    assert sorted(f["config"]["BLOCK_H"] for f in out["failures"]) == [4, 8, 16]


def test_a_missing_peer_skips_with_its_reason(monkeypatch):
    """Without TileGym installed, the tests that load it skip saying why instead of failing."""
    monkeypatch.setattr(loader, "_module", None)
    monkeypatch.setattr(loader.importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(pytest.skip.Exception, match="tilegym is not installed"):
        tilegym_or_skip()
