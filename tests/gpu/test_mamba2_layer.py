"""The Mamba-2 layer (models/mamba2.py) on the GPU against its float64 reference (on the GPU too), per SSD backend
and dtype, bf16 included, outputs NaN-poisoned; and the layer as a workload of the pipeline end to end at a small
size (harness/workloads/mamba2_layer.py: gate, stage and forward timings, so the SSD's share), speed never
asserted. A backend that cannot run here is skipped with its reason."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import impls
from impls.tolerance import poisoned_allocations
from models.mamba2 import Mamba2, Mamba2Config
from models.mamba2_reference import layer_errors, layer_tolerance, mamba2_float64

# d_inner 512: 8 heads of 64, 2 groups of d_state 64; 4 chunks of 256 at seqlen 1000 (the last one partial)
CONFIG = Mamba2Config(d_model=256, d_state=64, headdim=64, ngroups=2, chunk_size=256)
BACKENDS = ["reference", "triton", "cutile", "mamba_ssm"]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
CASES = ["plain", "seq_idx-init", "cu_seqlens", "Dchannel-norm-first-dt_limit"]
PARAMS = [pytest.param(b, case, d, id=f"{b}-{case}-{d}") for b in BACKENDS for case in CASES
          for d in (DTYPES if case == "plain" else ["bf16"])]


def layer_or_skip(backend: str, dtype, **config) -> Mamba2:
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            layer = Mamba2(dataclasses.replace(CONFIG, **config), backend, dtype=dtype)
    except impls.BackendUnavailable as exc:
        pytest.skip(str(exc))
    return layer.to("cuda").requires_grad_(False)


def arguments(case: str, layer: Mamba2, dtype) -> dict:
    c, gen = layer.config, torch.Generator().manual_seed(1)
    batch = 1 if case == "cu_seqlens" else 2
    args = {"u": torch.randn(batch, 1000, c.d_model, generator=gen).to("cuda", dtype)}
    if case == "seq_idx-init":
        rows = [[0] * 300 + [1] * 212 + [2] * 488, [1] * 7 + [2] * 700 + [3] * 293]
        args["seq_idx"] = torch.tensor(rows, dtype=torch.int32, device="cuda")
        args["initial_states"] = 0.5 * torch.randn(batch, c.nheads, c.headdim, c.d_state, generator=gen).cuda()
        args["conv_initial_states"] = torch.randn(batch, c.conv_dim, c.d_conv - 1, generator=gen).to("cuda", dtype)
    if case == "cu_seqlens":
        args["cu_seqlens"] = torch.tensor([0, 3, 256, 611, 1000], dtype=torch.int32, device="cuda")
    return args


@pytest.mark.parametrize("backend, case, dtype_name", PARAMS)
def test_layer_matches_float64_on_gpu(backend, case, dtype_name):
    dtype = DTYPES[dtype_name]
    config = dict(D_per_channel=True, norm_before_gate=True, dt_limit=(0.002, 0.08), bias=True) \
        if case == "Dchannel-norm-first-dt_limit" else {}
    layer = layer_or_skip(backend, dtype, **config)
    args = arguments(case, layer, dtype)
    expected = mamba2_float64(layer, **args)
    try:
        with torch.inference_mode(), poisoned_allocations():
            got = layer(**args, return_final_states=True)
    except impls.BackendUnavailable as exc:  # the backend refuses this problem, saying why
        pytest.skip(str(exc))
    errors = layer_errors(got, expected, layer.config.chunk_size)
    tol = layer_tolerance(layer, dtype, "cuda")
    print(f"[{backend} {case} {dtype_name}] {errors} tol {tol} {layer.describe()['ssd']}")
    assert "out" in errors and all(err <= tol for err in errors.values()), f"over {tol}: {errors}"


def test_the_layer_workload_end_to_end():
    """Each backend's layer point at mamba2_130m's sizes (batch 2, 1024 tokens, bf16) through plan → gate → time:
    gated against float64, then its stages and forward timed (the SSD's share: stage ssd over forward), or failed
    with the backend's reason where it cannot run here."""
    from experiments import bench  # imported here: at import bench asks torch whether CUDA is there
    from harness import plan
    from impls.cli import load_shape
    from impls.problem import Problem

    shape = dataclasses.replace(load_shape("mamba2_130m"), batch=2, seqlen=1024)
    quick = plan.BenchSettings(stages=("in_proj_conv", "ssd", "norm_out_proj", "forward"), warmup_ms=5, rep_ms=20,
                               ceilings=False)
    results = {}
    for backend in BACKENDS:
        rows = bench.measure(plan.point(backend, Problem(shape), workload="mamba2_layer", device="cuda", bench=quick))
        results[backend] = rows
        df = rows.frame()
        if rows.status != "ok":
            assert "GateFailure" not in (rows.error or ""), f"{backend}: {rows.error}"
            continue
        medians = df.query("metric == 'median_ms'").set_index("stage")["value"]
        assert set(df["timer"]) == {"do_bench"} and medians["forward"] > 0
        share = medians["ssd"] / medians["forward"]
        assert math.isfinite(share) and share > 0
    assert results["triton"].status == "ok", results["triton"].error
