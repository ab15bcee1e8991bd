"""The external peers on the GPU against the float64 reference (on the GPU too): TileGym's cuTile Mamba-2 (on
its fallback configs — TileGym's own first config, no minutes-long search), FLA's chunked simple GLA and vLLM
0.33.0's prefill kernels (skipped, saying why, where its kernel files are absent)."""

from __future__ import annotations

import pytest
import torch

import impls
from impls import tuning
from impls.inputs import make_inputs
from impls.problem import Problem, Shape
from impls.tilegym import tune
from impls.tolerance import poisoned_allocations, rel_err
from tests.common import failures, float64_forward, run_case


def peer_or_skip(name: str, **switches):
    """The peer built with `switches`, or the test skipped with the reason it cannot run here (not installed,
    another version, no CUDA)."""
    try:
        return impls.get_backend(name, **switches)
    except impls.BackendUnavailable as exc:
        pytest.skip(str(exc))


S1_CHUNK128 = Shape(8, 4096, 80, 64, 1, 128, 128)  # the headline shape at the chunk TileGym was measured with
MEDIUM64 = Shape(2, 1024, 8, 64, 2, 64, 64)
MEDIUM128 = Shape(2, 1024, 8, 64, 1, 128, 128)
SMALL_HEADDIM = Shape(2, 512, 16, 32, 4, 64, 64)

TILEGYM_CASES = [
    pytest.param(Problem(S1_CHUNK128), torch.bfloat16, id="S1-chunk128-bf16", marks=pytest.mark.heavy),
    pytest.param(Problem(MEDIUM64), torch.bfloat16, id="medium-chunk64-bf16"),
    pytest.param(Problem(MEDIUM64), torch.float32, id="medium-chunk64-fp32"),
    pytest.param(Problem(MEDIUM128), torch.bfloat16, id="medium-chunk128-bf16"),
    pytest.param(Problem(MEDIUM128), torch.float32, id="medium-chunk128-fp32"),
    pytest.param(Problem(SMALL_HEADDIM, has_initial_states=True, has_z=True, D_per_channel=True), torch.bfloat16,
                 id="headdim32-init-z-Dchannel-bf16"),
    pytest.param(Problem(MEDIUM64, has_D=False, state_dtype="float32"), torch.bfloat16,
                 id="no-D-state-fp32-bf16"),
]


@pytest.mark.parametrize("problem, dtype", TILEGYM_CASES)
def test_tilegym_matches_float64_reference(problem, dtype):
    backend = peer_or_skip("tilegym", tuning="fallback")
    assert backend.supports(problem) == (True, "")
    errors = run_case(backend, problem, dtype, seed=1, device="cuda")  # forward and each stage, outputs poisoned
    assert not failures(errors, dtype, backend, "cuda"), errors
    assert {v["source"] for v in backend.describe()["tuning_sources"].values()} == {"fallback"}


@pytest.mark.parametrize("swap, bht", [pytest.param(True, True, id="swap-bht"),
                                       pytest.param(False, False, id="noswap-bth")])
def test_tilegym_fwd_pass_state_variants(swap, bht):
    backend = peer_or_skip("tilegym", tuning="fallback", swap=swap, bht=bht)
    errors = run_case(backend, Problem(MEDIUM128), torch.bfloat16, seed=2, device="cuda")
    assert not failures(errors, torch.bfloat16), errors
    config = backend.describe()["tuning_sources"]["fwd_pass_state"]["config"]
    assert (config["SWAP"], config["BHT"]) == (swap, bht)


def test_tilegym_record_mode_reuses_a_stored_config(tmp_path, monkeypatch):
    monkeypatch.setenv("SSD_TUNING_DIR", str(tmp_path))
    first = peer_or_skip("tilegym", tuning="fallback")
    run_case(first, Problem(MEDIUM64), torch.bfloat16, device="cuda")
    gpu = torch.cuda.get_device_name()
    for stage, info in first.describe()["tuning_sources"].items():
        tuning.store("tilegym", stage, gpu, info["key"], info["config"], [], tuning.stack_versions(tune.STACK))
    second = peer_or_skip("tilegym", tuning="record")
    errors = run_case(second, Problem(MEDIUM64), torch.bfloat16, device="cuda")
    assert not failures(errors, torch.bfloat16), errors
    assert {v["source"] for v in second.describe()["tuning_sources"].values()} == {"record"}


FLA_CASES = [
    pytest.param(Problem(Shape(8, 4096, 80, 64, 1, 128, 256)), {}, torch.bfloat16, id="S1-bf16", marks=pytest.mark.heavy),
    pytest.param(Problem(Shape(2, 1000, 8, 64, 2, 64, 256)), {}, torch.bfloat16, id="medium-bf16"),
    pytest.param(Problem(Shape(2, 1000, 8, 64, 2, 64, 256)), {}, torch.float32, id="medium-fp32"),
    pytest.param(Problem(Shape(2, 1000, 8, 64, 2, 64, 256), has_initial_states=True, has_z=True,
                         D_per_channel=True), {}, torch.bfloat16, id="medium-init-z-Dchannel-bf16"),
    pytest.param(Problem(Shape(2, 1000, 8, 64, 2, 64, 256), has_initial_states=True), {"state_v_first": True},
                 torch.float32, id="medium-init-state_v_first-fp32"),
    pytest.param(Problem(Shape(2, 1024, 8, 64, 1, 128, 128)), {"chunk": "requested"}, torch.bfloat16,
                 id="chunk128-requested-bf16"),
    pytest.param(Problem(Shape(1, 3000, 8, 64, 2, 64, 256), varlen=True, nseqs=3, has_initial_states=True), {},
                 torch.bfloat16, id="cu_seqlens-init-bf16"),
]


@pytest.mark.parametrize("problem, switches, dtype", FLA_CASES)
def test_fla_matches_float64_reference(problem, switches, dtype):
    backend = peer_or_skip("fla", **switches)
    assert backend.supports(problem) == (True, "")
    inputs = make_inputs(problem, device="cuda", seed=1, dtype=dtype)
    ref = float64_forward(inputs)
    with poisoned_allocations():
        out = impls.ssd_forward(**inputs.forward_kwargs(), backend=backend)
    errors = {"forward.y": rel_err(out.y, ref.y), "forward.final_states": rel_err(out.final_states, ref.final_states)}
    if problem.varlen:
        errors["forward.varlen_states"] = rel_err(out.varlen_states, ref.varlen_states)
    assert out.y.dtype == dtype and out.final_states.dtype == torch.float32
    assert not failures(errors, dtype, backend, "cuda"), errors


# --- vLLM 0.33.0's prefill kernels (varlen entry point), whole forward ---------------------------------------
@pytest.fixture
def vllm_backend():
    from impls.vllm.backend import VllmBackend

    ok, why = VllmBackend.available()  # loads the files: set-up time, never collection
    if not ok:
        pytest.skip(why)
    return VllmBackend()


VLLM_SMALL = Shape(2, 1000, 8, 64, 2, 64, 256)
VLLM_CASES = [
    pytest.param(Problem(Shape(8, 4096, 80, 64, 1, 128, 256)), torch.bfloat16, id="S1-bf16", marks=pytest.mark.heavy),
    pytest.param(Problem(VLLM_SMALL), torch.bfloat16, id="seqlen1000-chunk256-bf16"),
    pytest.param(Problem(VLLM_SMALL), torch.float16, id="seqlen1000-chunk256-fp16"),
    pytest.param(Problem(VLLM_SMALL), torch.float32, id="seqlen1000-chunk256-fp32"),
    pytest.param(Problem(Shape(2, 512, 16, 64, 8, 128, 128)), torch.bfloat16, id="ngroups8-bf16"),
    pytest.param(Problem(VLLM_SMALL, has_initial_states=True, has_z=True, D_per_channel=True,
                         state_dtype="float32", dt_limit=(0.001, 0.08)), torch.bfloat16,
                 id="init-z-Dchannel-fp32states-bf16"),
    pytest.param(Problem(Shape(1, 900, 8, 64, 2, 64, 64), varlen=True, nseqs=4, has_initial_states=True),
                 torch.bfloat16, id="cu_seqlens-4-seqs-init-bf16"),
    pytest.param(Problem(Shape(1, 300, 4, 80, 2, 48, 64), has_z=True), torch.bfloat16, id="p80-n48-z-bf16"),
    pytest.param(Problem(Shape(2, 512, 8, 64, 1, 256, 128)), torch.bfloat16, id="dstate256-bf16"),
]


@pytest.mark.parametrize("problem, dtype", VLLM_CASES)
def test_vllm_matches_float64_reference(vllm_backend, problem, dtype):
    assert vllm_backend.supports(problem) == (True, "")
    errors = run_case(vllm_backend, problem, dtype, seed=1, device="cuda")  # outputs poisoned
    assert {"forward.y", "forward.final_states"} <= set(errors)
    assert not failures(errors, dtype, vllm_backend, "cuda"), errors


def test_vllm_platform_stand_in_drops_the_racy_sm90_configs(vllm_backend):
    """On sm_90 vLLM's chunk_scan keeps only configs Triton compiles correctly; it asks the platform stand-in."""
    from impls.vllm import loader

    configs = loader.load().ssd_chunk_scan._chunk_scan_fwd_kernel.configs
    racy = [c for c in configs if c.num_stages > 1 and c.num_warps % 4 == 0 and c.kwargs["BLOCK_SIZE_M"] % 64 == 0]
    assert configs and (racy == []) == (torch.cuda.get_device_capability() == (9, 0)), racy
