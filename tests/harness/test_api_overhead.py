"""The public call costs what its kernels cost: get_backend hands out one instance per (backend, switches) and asks
availability once; the api_overhead experiment records by-name, prebuilt and graph-replay figures (here on the CPU,
the Triton kernels under the interpreter, at a shape small enough for it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import impls
from harness import store
from impls import registry

REPO = Path(__file__).resolve().parents[2]


def test_one_instance_per_backend_and_switches():
    triton = impls.get_backend("triton")
    assert impls.get_backend("triton") is triton
    assert impls.get_backend("triton", tuning="auto") is triton  # the defaults spelt out: the same switches
    assert impls.get_backend("triton", {"tuning": "auto"}) is triton
    other = impls.get_backend("triton", tuning="fallback")
    assert other is not triton and impls.get_backend("triton", tuning="fallback") is other
    assert impls.get_backend(triton) is triton
    registry.clear_cache()
    assert impls.get_backend("triton") is not triton


def test_availability_is_asked_once(monkeypatch):
    from impls.mamba_ssm.backend import MambaSSMBackend

    asked = []
    monkeypatch.setattr(MambaSSMBackend, "available", classmethod(lambda cls: asked.append(1) or (True, "")))
    for switches in ({}, {"fused": False}, {}):
        impls.get_backend("mamba_ssm", **switches)
    assert asked == [1]


def test_an_unavailable_backend_still_raises_its_reason_every_time(monkeypatch):
    from impls.mamba_ssm.backend import MambaSSMBackend

    monkeypatch.setattr(MambaSSMBackend, "available", classmethod(lambda cls: (False, "planted reason")))
    for _ in range(2):
        with pytest.raises(impls.BackendUnavailable, match="planted reason"):
            impls.get_backend("mamba_ssm")


def test_the_public_call_by_name_reuses_the_built_backend(monkeypatch):
    """What a by-name call costs beyond a prebuilt one: a dictionary lookup, no construction."""
    from impls.inputs import make_inputs
    from impls.problem import Problem, Shape
    from impls.reference.backend import ReferenceBackend

    built = []
    original = ReferenceBackend.__init__
    monkeypatch.setattr(ReferenceBackend, "__init__", lambda self, *a, **k: built.append(1) or original(self, *a, **k))
    kw = make_inputs(Problem(Shape(1, 32, 2, 8, 1, 8, 16), dtype="float32"), seed=0).forward_kwargs()
    first = impls.ssd_forward(**kw, backend="reference")
    second = impls.ssd_forward(**kw, backend="reference")
    assert built == [1] and bool((first.y == second.y).all())


def test_api_overhead_experiment_on_cpu(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}
    env.update(PYTHONPATH=str(REPO), SSD_TUNING_DIR=str(tmp_path / "tuning"))
    done = subprocess.run(
        [sys.executable, "-m", "experiments.bench", "experiment=api_overhead", "backend=reference,mamba_ssm,triton",
         "shape=tiny", "shape.batch=1", "shape.seqlen=32", "shape.nheads=2", "shape.ngroups=1", "shape.chunk_size=16",
         "dtype=float32", "device=cpu", "logger=local", f"results_dir={tmp_path}/results",
         f"hydra.sweep.dir={tmp_path}/multirun", "bench.host_calls=2", "bench.cpu_warmup=0", "bench.cpu_reps=1"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    df = store.load(tmp_path / "results")
    assert set(df["status"]) == {"ok"} and set(df["backend"]) == {"reference", "mamba_ssm", "triton"}
    rows = df[df["stage"] == "forward"].set_index(["backend", "metric"])
    for backend in ("reference", "mamba_ssm", "triton"):
        for metric in ("byname_median_ms", "prebuilt_median_ms", "host_byname_us", "host_prebuilt_us"):
            assert rows.loc[(backend, metric), "value"] > 0, (backend, metric)
        assert rows.loc[(backend, "host_overhead_us"), "value"] == pytest.approx(
            rows.loc[(backend, "host_byname_us"), "value"] - rows.loc[(backend, "host_prebuilt_us"), "value"])
        graph = rows.loc[(backend, "graph_median_ms")]
        assert graph["value"] != graph["value"] and "no CUDA graphs" in graph["note"]  # NaN, with the reason
    assert set(df[df["metric"] == "host_byname_us"]["unit"]) == {"us"}


def test_api_overhead_refuses_switches_a_name_cannot_carry():
    from harness import api_overhead

    with pytest.raises(ValueError, match="default switches"):
        api_overhead.measure(impls.get_backend("triton", tuning="fallback"), None, None, None)


def test_a_new_tuning_record_rebuilds_later_lookups(tmp_path, monkeypatch):
    """A backend resolved before a record was stored must not answer later by-name calls with its stale config."""
    from impls import tuning

    monkeypatch.setenv("SSD_TUNING_DIR", str(tmp_path))
    before = impls.get_backend("triton")
    assert impls.get_backend("triton") is before
    tuning.store("triton", "compute_out", "cpu", "key", {"block_rows": 16}, {}, {})
    assert impls.get_backend("triton") is not before


@pytest.mark.parametrize("quantiles", [(), (0.2, 0.8)], ids=["median-only", "median-p20-p80"])
def test_gpu_times_takes_do_bench_answers_of_any_length(monkeypatch, quantiles):
    """triton's do_bench answers one quantile with a bare float, several with a list (triton/testing.py, 3.6)."""
    import triton.testing

    from harness import timing

    def fake_do_bench(fn, warmup, rep, quantiles, return_mode):
        answer = [float(i + 1) for i in range(len(quantiles))]
        return answer[0] if len(answer) == 1 else answer

    monkeypatch.setattr(triton.testing, "do_bench", fake_do_bench)
    out = timing.gpu_times(lambda: None, 1, 1, False, quantiles)
    assert out["median_ms"] == 1.0 and len(out) == 1 + len(quantiles)


def test_host_times_alternate_the_two_paths_and_pair_their_differences(monkeypatch):
    """A host whose every call gets slower (a drift) must not show up as a difference between the paths."""
    from harness import api_overhead

    clock, calls = [0.0], []

    def drifting(name):
        def call():
            calls.append(name)
            clock[0] += 1e-3 * len(calls) + (2e-6 if name == "by_name" else 0.0)  # 2 µs more by name
        return call

    monkeypatch.setattr(api_overhead.time, "perf_counter", lambda: clock[0])
    by_name, prebuilt, diff = api_overhead.paired_host_us(drifting("by_name"), drifting("prebuilt"),
                                                          torch.device("cpu"), 101)
    assert calls[:8] == ["by_name", "prebuilt", "prebuilt", "by_name"] * 2
    assert abs(diff - 2.0) < 1e-6  # the drift (1 ms more per call) cancels in every ABBA quad
    assert by_name > 1e3 and prebuilt > 1e3  # the plain medians carry it


def test_device_medians_alternate_the_two_paths(monkeypatch):
    """The device-side medians are taken in ABBA blocks too: a launch rate that drifts over the run falls on both."""
    from types import SimpleNamespace

    from harness import api_overhead

    order, level = [], [1.0]

    def fake_median(fn, device, bench):
        order.append(fn)
        level[0] += 0.1  # every block slower than the one before
        return level[0]

    monkeypatch.setattr(api_overhead, "device_median_ms", fake_median)
    first, second = object(), object()
    a, b = api_overhead.paired_device_ms(first, second, torch.device("cpu"), SimpleNamespace(device_rounds=2))
    assert order == [first, second, second, first] * 2
    assert abs(a - b) < 1e-9  # a linear drift gives both the same median


def test_gpu_calls_alternate_call_by_call_in_abba_order():
    from harness import timing

    order = timing.abba_sequence(5)
    assert order[:8] == [0, 1, 1, 0, 0, 1, 1, 0] and order.count(0) == order.count(1) == 6
    first, second = timing.split_by_call(order, [float(i) for i in range(len(order))])
    assert first == [0.0, 3.0, 4.0, 7.0, 8.0, 11.0] and second == [1.0, 2.0, 5.0, 6.0, 9.0, 10.0]
    assert sum(first) / len(first) == sum(second) / len(second)  # a linear drift falls on both alike


def test_device_medians_on_the_gpu_pool_rounds_of_interleaved_calls(monkeypatch):
    from types import SimpleNamespace

    from harness import api_overhead, timing

    rounds = iter([(1.0, 1.1), (3.0, 3.1), (2.0, 2.1)])
    monkeypatch.setattr(timing, "gpu_paired_ms", lambda first, second, rep_ms: next(rounds))
    a, b = api_overhead.paired_device_ms(None, None, torch.device("cuda"), SimpleNamespace(device_rounds=3, rep_ms=5))
    assert (a, b) == (2.0, 2.1)
