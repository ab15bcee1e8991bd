"""What the public call costs on top of its kernels: the whole forward through `impls.ssd_forward` with the backend
named ("by name", as the README shows) and with the backend built beforehand ("prebuilt"), plus the prebuilt call
replayed from a CUDA graph (no host work at all).

Rows (stage "forward"), per point: byname_median_ms and prebuilt_median_ms (do_bench medians on the GPU, L2 flushed;
wall-clock medians on the CPU), graph_median_ms (one replay, L2 flushed between replays; on the CPU a NaN whose
note says why), host_byname_us and host_prebuilt_us (time.perf_counter around one call, no synchronisation inside
the timed span, median of bench.host_calls calls; the device is synchronised before each call, so a full launch
queue never turns host time into kernel time) and host_overhead_us, their difference. The harness runs it with
bench.api_overhead=true (conf/experiment/api_overhead.yaml); `python -m experiments.api_overhead [overrides]` is that
sweep.
"""

from __future__ import annotations

import dataclasses
import runpy
import statistics
import sys
import time

from experiments import correctness, timing

METRICS = ("byname_median_ms", "prebuilt_median_ms", "graph_median_ms", "host_byname_us", "host_prebuilt_us",
           "host_overhead_us")


def host_us(fn, device, calls: int) -> float:
    """Median microseconds of host time per call of `fn`: the device is synchronised before each call, outside
    the timed span, and never inside it."""
    times = []
    for _ in range(calls):
        timing.synchronize(device)
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    timing.synchronize(device)
    return statistics.median(times) * 1e6


def device_median_ms(fn, device, bench) -> float:
    if device.type == "cuda":
        return timing.gpu_times(fn, bench.warmup_ms, bench.rep_ms, False, ())["median_ms"]
    return timing.cpu_times(fn, bench.cpu_warmup, bench.cpu_reps, ())["median_ms"]


def measure(backend, inputs, device, bench) -> list[tuple[str, str, object]]:
    """(stage, metric, value) rows of one point; the backend must have its default switches (a call by name can
    express no others)."""
    if backend.switches != type(backend.switches)():
        changed = {k: v for k, v in dataclasses.asdict(backend.switches).items()
                   if v != getattr(type(backend.switches)(), k)}
        raise ValueError(f"bench.api_overhead: a call by name runs the default switches; this point sets {changed}")
    kw = correctness.forward_kwargs(inputs)
    by_name = correctness.public_forward_call(backend.name, kw)
    prebuilt = correctness.public_forward_call(backend, kw)
    by_name()  # resolves and builds whatever the by-name call builds once
    rows = {"byname_median_ms": device_median_ms(by_name, device, bench),
            "prebuilt_median_ms": device_median_ms(prebuilt, device, bench)}
    if device.type == "cuda":
        rows["graph_median_ms"] = timing.graph_median(prebuilt, bench.rep_ms)
    else:
        rows["graph_median_ms"] = timing.Missing(f"no CUDA graphs on a {device.type} device")
    rows["host_byname_us"] = host_us(by_name, device, bench.host_calls)
    rows["host_prebuilt_us"] = host_us(prebuilt, device, bench.host_calls)
    rows["host_overhead_us"] = rows["host_byname_us"] - rows["host_prebuilt_us"]
    return [("forward", metric, rows[metric]) for metric in METRICS]


def main() -> None:
    """`python -m experiments.bench experiment=api_overhead [overrides]` (run as a script, where Hydra finds conf/)."""
    sys.argv = [sys.argv[0], "experiment=api_overhead", *sys.argv[1:]]
    runpy.run_module("experiments.bench", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
