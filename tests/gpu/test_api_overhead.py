"""On the GPU: CUDA-graph replay timed with L2 flushed between replays, a capture failure recorded with its reason,
and the api_overhead rows of every backend that runs here (by name, prebuilt, graph, host µs)."""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf

import impls
from harness import api_overhead, config, timing
from impls.inputs import make_inputs
from impls.problem import Problem, Shape

SMALL = Shape(2, 1024, 8, 64, 1, 128, 256)


def test_graph_replay_is_timed_with_l2_flushed():
    a = torch.randn(4096, 4096, device="cuda")
    ms = timing.graph_times(lambda: a.mul_(1.0), 20)
    assert 0 < ms < 100


def test_a_capture_failure_is_recorded_with_its_reason():
    a = torch.randn(16, device="cuda")
    missing = timing.graph_median(lambda: a.sum().item(), 20)  # a host sync cannot be captured
    assert isinstance(missing, timing.Missing) and "CUDA-graph" in missing.reason


def test_a_call_without_gpu_work_has_no_graph_figure():
    """A host-only step (a peer adapter's) captures an empty graph: Missing with the reason, not a replay time."""
    missing = timing.graph_median(lambda: None, 20)
    assert isinstance(missing, timing.Missing) and "no GPU work" in missing.reason


@pytest.mark.parametrize("name", ["reference", "mamba_ssm", "triton", "cutile", "tilegym", "fla"])
def test_api_overhead_rows(name):
    try:
        backend = impls.get_backend(name)
    except impls.BackendUnavailable as exc:
        pytest.skip(str(exc))
    problem = Problem(SMALL)
    if not backend.supports(problem)[0]:
        pytest.skip(backend.supports(problem)[1])
    bench = OmegaConf.merge(OmegaConf.structured(config.BenchConfig), {"host_calls": 50, "rep_ms": 20})
    inputs = make_inputs(problem, device="cuda", seed=0, dtype=torch.bfloat16)
    rows = {metric: value for _stage, metric, value in api_overhead.measure(backend, inputs, torch.device("cuda"),
                                                                            bench)}
    assert set(rows) == set(api_overhead.METRICS)
    for metric in ("byname_median_ms", "prebuilt_median_ms", "host_byname_us", "host_prebuilt_us"):
        assert rows[metric] > 0 and math.isfinite(rows[metric]), metric
    graph = rows["graph_median_ms"]
    assert isinstance(graph, timing.Missing) or graph > 0, graph
