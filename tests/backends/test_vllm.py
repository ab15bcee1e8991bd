"""CPU tests of the "vllm" peer: finding and loading vLLM's SSD kernel files without vLLM, extracting them from a
wheel, the batch -> chunk-metadata map, refusals with reasons, and vLLM's genuine kernels under the Triton
interpreter against the float64 reference (tiny shapes, fp32/fp16). tests/gpu/test_peers.py runs them compiled.
Tests that need the files skip, saying so, when scripts/install.sh has not extracted them."""

from __future__ import annotations

import dataclasses
import sys
import zipfile

import pytest
import torch

from harness import provenance
from impls.inputs import make_inputs
from impls.problem import Problem
from impls.tolerance import rel_err
from impls.vllm import extract, loader, mapping
from impls.vllm.backend import VllmBackend
from tests.common import TINY, failures, float64_forward, run_case


@pytest.fixture(scope="module")
def vllm_files():
    root = loader.find_root()
    if root is None:
        pytest.skip(loader.where())
    return root


# --- the chunk metadata ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("cu_seqlens, chunk, bounds, last, seq_idx", [
    pytest.param([0, 100, 200], 32, [0, 32, 64, 96, 100, 132, 164, 196, 200], [3, 7], [0, 0, 0, 0, 1, 1, 1, 1],
                 id="batch2-seqlen100-chunk32"),
    pytest.param([0, 64, 128], 32, [0, 32, 64, 96, 128], [1, 3], [0, 0, 1, 1], id="batch2-seqlen64-chunk32"),
    pytest.param([0, 40, 45, 100], 32, [0, 32, 40, 45, 77, 100], [1, 2, 4], [0, 0, 1, 2, 2],
                 id="varlen-3-seqs-short-middle"),
])
def test_chunks_restart_at_every_sequence_start(cu_seqlens, chunk, bounds, last, seq_idx):
    layout = mapping.chunk_layout(cu_seqlens, chunk)
    assert list(layout.cu_chunk_seqlens) == bounds
    assert list(layout.last_chunk_indices) == last and list(layout.seq_idx) == seq_idx
    assert layout.nseqs == len(cu_seqlens) - 1 and layout.nchunks == len(seq_idx)


def test_batch_layout_is_packed_rows():
    assert mapping.batch_layout(2, 100, 32) == mapping.chunk_layout([0, 100, 200], 32)


@pytest.mark.parametrize("cu_seqlens, chunk, match", [
    pytest.param([1, 10], 4, "cu_seqlens", id="not-from-0"),
    pytest.param([0, 10, 10], 4, "cu_seqlens", id="empty-sequence"),
    pytest.param([0, 10], 0, "chunk_size", id="chunk-0"),
])
def test_bad_layout_arguments_are_named(cu_seqlens, chunk, match):
    with pytest.raises(ValueError, match=match):
        mapping.chunk_layout(cu_seqlens, chunk)


@pytest.mark.parametrize("cu_seqlens", [pytest.param([0, 10, 50], id="past-seqlen"),
                                        pytest.param([0, 10, 30], id="short-of-seqlen")])
def test_cu_seqlens_not_ending_at_seqlen_is_refused_before_vllm_runs(cu_seqlens):
    """vLLM's kernels would write y past its end (heap corruption under the interpreter, the process aborts) or
    leave its tail unwritten; the adapter reads cu_seqlens on the host anyway, so it checks them every call."""
    x, B = torch.randn(1, 40, 2, 8), torch.randn(1, 40, 1, 4)
    cu = torch.tensor(cu_seqlens, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^cu_seqlens: .*seqlen \(40\)"):
        mapping.varlen_args(x, torch.rand(1, 40, 2), -torch.rand(2), B, B.clone(), 16, cu_seqlens=cu)


def test_cu_seqlens_short_of_seqlen_is_refused_by_the_public_entry(vllm_files):
    import impls

    kw = make_inputs(Problem(dataclasses.replace(TINY, batch=1), varlen=True, nseqs=2), seed=15,
                     dtype=torch.float32).forward_kwargs()
    kw.update(cu_seqlens=torch.tensor([0, 10, TINY.seqlen - 1], dtype=torch.int32), seq_idx=None)
    with pytest.raises(ValueError, match="^cu_seqlens: "):
        impls.ssd_forward(**kw, backend=VllmBackend())


def test_batch_metadata_is_cached_per_shape_and_device():
    first = mapping.batch_metadata(3, 50, 16, "cpu")
    assert mapping.batch_metadata(3, 50, 16, "cpu") is first
    fresh = mapping.batch_metadata(3, 50, 16, "cpu", cached=False)
    assert fresh is not first and torch.equal(fresh.cu_chunk_seqlens, first.cu_chunk_seqlens)
    assert first.cu_chunk_seqlens.dtype == torch.int32 and first.final_state_indices.tolist() == [0, 1, 2]


# --- refusals -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("problem, reason", [
    pytest.param(Problem(TINY, nseqs=3), "seq_idx without cu_seqlens", id="seq_idx"),
    pytest.param(Problem(TINY, varlen=True, nseqs=3), "batch 1", id="cu_seqlens-batch-2"),
    pytest.param(Problem(TINY, dtype="float64"), "dtype float64", id="float64"),
    pytest.param(Problem(dataclasses.replace(TINY, chunk_size=48)), "power of two", id="chunk-48"),
    pytest.param(Problem(dataclasses.replace(TINY, nheads=6, ngroups=4)), "does not divide", id="nheads-6-ngroups-4"),
    pytest.param(Problem(dataclasses.replace(TINY, batch=4, seqlen=2**20, chunk_size=64, ngroups=1)), "grid axis 1",
                 id="65536-chunks"),
])
def test_vllm_refuses(problem, reason):
    ok, why = VllmBackend().supports(problem)
    assert not ok and reason in why, why


def test_vllm_accepts_what_it_can_run(monkeypatch):
    # compiled: bf16 is refused under the interpreter (test_hostile); not TRITON_INTERPRET=0, which would leave
    # any kernel module first imported here compiled for the rest of the run
    monkeypatch.setattr("impls.mamba_ssm.upstream.interpreting", lambda: False)
    backend = VllmBackend()
    long = Problem(dataclasses.replace(TINY, batch=1, seqlen=2**20, chunk_size=32, ngroups=1))
    assert backend.supports(long) == (True, "")  # 32768 chunks: within CUDA's grid limit

    for problem in (Problem(TINY, has_initial_states=True, has_z=True, D_per_channel=True, state_dtype="float32"),
                    Problem(dataclasses.replace(TINY, batch=1), varlen=True, nseqs=3, has_initial_states=True),
                    Problem(TINY, dt_softplus=False, has_dt_bias=False, has_D=False)):
        assert backend.supports(problem) == (True, ""), problem


def test_vllm_has_no_stages():
    backend = VllmBackend()
    assert backend.STAGES == ("forward",)
    with pytest.raises(NotImplementedError, match="only the whole forward"):
        backend.chunk_cumsum(None, None, 64, None, False, (0.0, float("inf")))


def test_cpu_tensors_need_the_interpreter(monkeypatch):
    # not TRITON_INTERPRET=0: a kernel module first imported under it stays compiled for the rest of the run
    monkeypatch.setattr("impls.vllm.backend.interpreting", lambda: False)
    ok, why = VllmBackend().check_device(torch.device("cpu"))
    assert not ok and "TRITON_INTERPRET" in why, why


# --- finding, versioning and loading the files ----------------------------------------------------------------
def _fake_files(root, version="0.32.0"):
    (root / loader.OPS).mkdir(parents=True)
    (root / loader.OPS / "ssd_combined.py").write_text("")
    (root / f"vllm-{version}.dist-info").mkdir()
    (root / f"vllm-{version}.dist-info" / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\n"
                                                                 f"Version: {version}\n")


def test_other_version_is_refused_with_where_it_was_found(tmp_path, monkeypatch):
    _fake_files(tmp_path)
    monkeypatch.setenv(loader.ENV_DIR, str(tmp_path))
    assert loader.find_root() == tmp_path and loader.version() == "0.32.0"
    ok, why = VllmBackend.available()
    assert not ok and "0.33.0 is pinned, found 0.32.0" in why and str(tmp_path) in why, why


def test_missing_files_are_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(loader, "candidates", lambda: [tmp_path])
    ok, why = VllmBackend.available()
    assert not ok and "scripts/install.sh" in why, why
    assert provenance.vllm_version() == "absent"


def test_loading_leaves_no_vllm_modules_and_probes_no_gpu(vllm_files, monkeypatch):
    def probe(*args, **kwargs):
        raise AssertionError("the GPU was probed")

    for name in ("get_device_capability", "get_device_properties", "current_device"):
        monkeypatch.setattr(torch.cuda, name, probe)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a machine without CUDA, as CI's
    monkeypatch.setattr(loader, "_module", None)
    mods = loader.load()
    assert mods.version == "0.33.0" and callable(mods.ssd_combined.mamba_chunk_scan_combined_varlen)
    assert mods.ssd_combined.__file__.startswith(str(vllm_files))  # vLLM's genuine file, not a copy
    assert not any(n == "vllm" or n.startswith("vllm.") for n in sys.modules)
    assert provenance.vllm_version() == "0.33.0"


def test_softplus_stand_in_is_vllms_expression(vllm_files):
    genuine = loader.genuine_softplus_tree(vllm_files)
    assert genuine is not None and genuine == loader.stand_in_softplus_tree()


def test_extract_takes_only_the_ops_files_and_metadata(tmp_path):
    wheel = tmp_path / "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    ops = loader.OPS.as_posix()
    keep = [f"{ops}/ssd_combined.py", f"{ops}/__init__.py", "vllm-0.33.0.dist-info/METADATA"]
    drop = [f"{ops}/cpu/mamba_ssm.py", f"{ops}/README.md", "vllm/__init__.py", "vllm-0.33.0.dist-info/RECORD",
            "vllm/_C.abi3.so"]
    with zipfile.ZipFile(wheel, "w") as z:
        for name in keep + drop:
            z.writestr(name, "Version: 0.33.0\n" if name.endswith("METADATA") else "")
    dest = tmp_path / "peers" / "vllm-0.33.0"
    assert extract.extract(wheel, dest) == sorted(keep)
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()) == sorted(keep)
    assert loader.version(dest) == "0.33.0"
    assert not [p for p in dest.parent.iterdir() if p.name.startswith(".")]  # no temporary folder left
    with zipfile.ZipFile(tmp_path / "empty.whl", "w") as z:
        z.writestr("vllm/__init__.py", "")
    with pytest.raises(ValueError, match="ssd_combined.py"):
        extract.extract(tmp_path / "empty.whl", tmp_path / "other")


# --- vLLM's kernels under the interpreter against float64 (the covering cases: tests/interface/test_contract.py) ------
def test_vllm_kernels_match_float64_reference_above_dstate_128(vllm_files):
    """dstate above 128: chunk_scan's looped-dstate path, which the covering cases (dstate 16, 40) do not reach."""
    problem = Problem(dataclasses.replace(TINY, batch=1, seqlen=40, dstate=160, chunk_size=16))
    backend = VllmBackend()
    assert backend.supports(dataclasses.replace(problem, dtype="float32")) == (True, "")
    errors = run_case(backend, problem, torch.float32, seed=11)  # outputs NaN-poisoned before vLLM writes them
    assert set(errors) >= {"forward.y", "forward.final_states"}
    assert not failures(errors, torch.float32, backend, "cpu"), errors


def test_forward_parts_are_the_forward(vllm_files):
    """prepare -> peer -> finish as timed apart give the forward's result; the uncached metadata equals the
    cached one."""
    inputs = make_inputs(Problem(dataclasses.replace(TINY, batch=1, seqlen=40)), seed=13, dtype=torch.float32)
    backend = VllmBackend()
    kw = inputs.forward_kwargs()
    parts = backend.forward_parts(**kw)
    assert set(parts) == {"adapter_prepare", "peer", "adapter_finish", "adapter_metadata_uncached"}
    parts["peer"]()
    y = parts["adapter_finish"]().y
    assert torch.equal(y, backend.ssd_forward(**kw).y)
    assert torch.equal(parts["adapter_metadata_uncached"]().seq_idx, parts["adapter_prepare"]().meta.seq_idx)


def test_chunks_spanning_rows_are_caught(vllm_files):
    """The check above can fail: metadata treating the batch as one sequence leaks state from row to row."""
    inputs = make_inputs(Problem(TINY, has_D=False), seed=14, dtype=torch.float32)
    ref = float64_forward(inputs)
    backend = VllmBackend()
    kw = inputs.forward_kwargs()
    args = backend.prepare(kw["x"], kw["dt"], kw["A"], kw["B"], kw["C"], kw["chunk_size"], dt_bias=kw["dt_bias"],
                           dt_softplus=kw["dt_softplus"])
    one_sequence = mapping.chunk_layout([0, TINY.batch * TINY.seqlen], TINY.chunk_size)
    args = dataclasses.replace(args, meta=mapping.Metadata.on(one_sequence, "cpu"),
                               final_states=args.final_states[:1].clone())
    backend.peer(args)
    y = args.out.view_as(inputs.x)
    assert rel_err(y[0], ref.y[0]) < 1e-4  # the first row has nothing before it
    assert rel_err(y[1], ref.y[1]) > 1e-2


@pytest.mark.parametrize("state_dtype, expected", [(None, torch.bfloat16), (torch.float32, torch.float32)],
                         ids=["states-in-C-dtype", "fp32-states"])
def test_initial_states_reach_vllm_in_its_states_dtype(state_dtype, expected):
    """vLLM's chunk_scan compiles only with initial states in its chunk states' dtype (the interpreter does not
    check it; the GPU compiler does)."""
    x = torch.randn(1, 64, 2, 8, dtype=torch.bfloat16)
    B = torch.randn(1, 64, 1, 4, dtype=torch.bfloat16)
    init = torch.randn(1, 2, 8, 4, dtype=torch.float32)
    cu = torch.tensor([0, 20, 64], dtype=torch.int32)
    args = mapping.varlen_args(x, torch.rand(1, 64, 2), -torch.rand(2), B, B.clone(), 32, initial_states=init,
                               cu_seqlens=cu, state_dtype=state_dtype)
    assert args.initial_states.dtype == expected and args.initial_states.shape == (2, 2, 8, 4)
    assert torch.equal(args.initial_states[0].float(), init[0].to(expected).float())
    assert not args.initial_states[1].any()
