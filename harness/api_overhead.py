"""What the public call costs on top of its kernels: the whole forward through `impls.ssd_forward` with the backend
named ("by name", as the README shows) and with the backend built beforehand ("prebuilt"), plus the prebuilt call
replayed from a CUDA graph (no host work at all).

Rows (stage "forward"), per point: byname_median_ms and prebuilt_median_ms (on the GPU, per-call CUDA-event medians
with L2 flushed before each call, the two paths' calls interleaved in ABBA order, pooled over bench.device_rounds
rounds; wall-clock medians on the CPU), graph_median_ms (one replay, L2 flushed between replays; on the CPU a NaN
whose note says why), host_byname_us and host_prebuilt_us (time.perf_counter around one call, no synchronisation
inside the timed span, median of bench.host_calls calls; the device is synchronised before each call, so a full
launch queue never turns host time into kernel time) and host_overhead_us, the median of the per-pair differences.
The two paths alternate call by call in ABBA order (by name, prebuilt, prebuilt, by name, ...), so that a drift of
the host (clocks, other processes) over the run falls on both alike: timed in two blocks one after the other, one
NVIDIA H200's host differed by -285 to +270 µs between the blocks (results/2026-12-04-h200-vllm-blockwise-gate), far
more than the lookup itself costs; the device medians, taken in ABBA blocks of do_bench runs, still differed by up
to 29 % at host-bound S4 points (results/2026-12-04-h200-api-abba-gpu-suite), hence the per-call interleaving.
A point runs it with bench.api_overhead=true: the sweep is `python -m experiments.bench experiment=api_overhead`
(conf/experiment/api_overhead.yaml).
"""

from __future__ import annotations

import dataclasses
import statistics
import time

from harness import timing
from harness.calls import forward_kwargs, public_forward_call
from impls.registry import get_backend

METRICS = ("byname_median_ms", "prebuilt_median_ms", "graph_median_ms", "host_byname_us", "host_prebuilt_us",
           "host_overhead_us")


def _host_seconds(fn, device) -> float:
    """Host time of one call of `fn`; the device is synchronised before the call, outside the timed span."""
    timing.synchronize(device)
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def abba(measure_first, measure_second, quads: int) -> tuple[list[float], list[float], list[float]]:
    """Both measurements in ABBA order (first, second, second, first) `quads` times: (the first's values, the
    second's, and per quad the difference first − second), so that a drift that is linear over a quad cancels in
    its difference and falls on both sides' medians alike."""
    a, b, diffs = [], [], []
    for _ in range(max(1, quads)):
        a1, b1 = measure_first(), measure_second()
        b2, a2 = measure_second(), measure_first()
        a += [a1, a2]
        b += [b1, b2]
        diffs.append((a1 + a2 - b1 - b2) / 2)
    return a, b, diffs


def paired_host_us(first, second, device, calls: int) -> tuple[float, float, float]:
    """(median µs of `first`, of `second`, median over ABBA quads of the difference first − second), over `calls`
    calls of each."""
    a, b, diffs = abba(lambda: _host_seconds(first, device), lambda: _host_seconds(second, device), calls // 2)
    timing.synchronize(device)
    return statistics.median(a) * 1e6, statistics.median(b) * 1e6, statistics.median(diffs) * 1e6


def device_median_ms(fn, device, bench) -> float:
    if device.type == "cuda":
        return timing.gpu_times(fn, bench.warmup_ms, bench.rep_ms, False, ())["median_ms"]
    return timing.cpu_times(fn, bench.cpu_warmup, bench.cpu_reps, ())["median_ms"]


def paired_device_ms(first, second, device, bench) -> tuple[float, float]:
    """The device-side medians of both paths. On the GPU their calls alternate in ABBA order call by call
    (timing.gpu_paired_ms), bench.device_rounds times, the rounds' medians pooled by their median: a host-bound point
    (a forward whose launches take longer than its kernels) measures the host's launch rate, which drifts over a
    run as much as the host time does. On the CPU: wall-clock medians of whole blocks, in ABBA order of blocks."""
    if device.type == "cuda":
        rounds = [timing.gpu_paired_ms(first, second, bench.rep_ms) for _ in range(bench.device_rounds)]
        return statistics.median(a for a, _ in rounds), statistics.median(b for _, b in rounds)
    a, b, _ = abba(lambda: device_median_ms(first, device, bench), lambda: device_median_ms(second, device, bench),
                   bench.device_rounds)
    return statistics.median(a), statistics.median(b)


def measure(backend, inputs, device, bench) -> list[tuple[str, str, object]]:
    """(stage, metric, value) rows of one point; the backend must have the default switches of the device's target
    (a call by name can express no others: impls/defaults.py)."""
    defaults = get_backend(backend.name, device=device).switches
    if backend.switches != defaults:
        changed = {k: v for k, v in dataclasses.asdict(backend.switches).items() if v != getattr(defaults, k)}
        raise ValueError(f"bench.api_overhead: a call by name runs the default switches of the device's target; "
                         f"this point sets {changed}")
    kw = forward_kwargs(inputs)
    by_name = public_forward_call(backend.name, kw)
    prebuilt = public_forward_call(backend, kw)
    by_name()  # resolves and builds whatever the by-name call builds once
    rows = dict(zip(("byname_median_ms", "prebuilt_median_ms"), paired_device_ms(by_name, prebuilt, device, bench)))
    if device.type == "cuda":
        rows["graph_median_ms"] = timing.graph_median(prebuilt, bench.rep_ms)
    else:
        rows["graph_median_ms"] = timing.Missing(f"no CUDA graphs on a {device.type} device")
    rows["host_byname_us"], rows["host_prebuilt_us"], rows["host_overhead_us"] = paired_host_us(
        by_name, prebuilt, device, bench.host_calls)
    return [("forward", metric, rows[metric]) for metric in METRICS]
