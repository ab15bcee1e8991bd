"""Honest timing: first call (compile / autotune) measured apart, then triton.testing.do_bench with the median
and the quantiles of `bench.quantiles` (p20/p80 by default), L2 flushed before every repetition; CUDA-graph replay
with L2 flushed between replays; on a machine without CUDA a wall-clock median.

do_bench (triton 3.6, triton/testing.py) returns the mean unless told otherwise, so return_mode="median" is
always passed; when quantiles are given it returns only those quantiles (return_mode is then ignored), so we
ask for [0.5, *bench.quantiles]: the median (the 0.5 quantile of the same samples) and p<q>_ms for each q. Before
every repetition it zeroes a 256 MB buffer (`runtime.driver.active.clear_cache`), which flushes L2; that cannot be
switched off, so bench.flush_l2=false is refused at start-up (harness.config.validate). triton's
do_bench_cudagraph replays back to back without a flush; `graph_times` flushes the same way between replays. A
measurement that cannot be made (a capture that fails) is a `Missing` with its reason, recorded in the row's note.
Two calls to compare (harness/api_overhead.py) are timed interleaved, call by call in ABBA order
(`gpu_paired_ms`), each between its own CUDA events after the same flush.
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def first_call(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds of the first call, compilation and autotuning included."""
    synchronize(device)
    t0 = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - t0


@dataclass(frozen=True)
class Missing:
    """A measurement that could not be made, and why (stored as NaN with the reason in the row's note)."""

    reason: str


def quantile_metric(q: float) -> str:
    """0.2 -> "p20_ms"."""
    return f"p{round(q * 100):d}_ms"


def gpu_times(fn: Callable[[], object], warmup_ms: int, rep_ms: int, cuda_graph: bool,
              quantiles=(0.2, 0.8)) -> dict[str, float | Missing]:
    from triton.testing import do_bench

    values = do_bench(fn, warmup=warmup_ms, rep=rep_ms, quantiles=[0.5, *quantiles], return_mode="median")
    if not isinstance(values, (list, tuple)):  # do_bench returns a bare float when asked for one quantile
        values = [values]
    out = {"median_ms": values[0], **{quantile_metric(q): v for q, v in zip(quantiles, values[1:])}}
    if cuda_graph:
        out["graph_median_ms"] = graph_median(fn, rep_ms)
    return out


def graph_median(fn: Callable[[], object], rep_ms: int) -> float | Missing:
    """`graph_times`' median, or Missing with the reason when the call cannot be captured."""
    try:
        return graph_times(fn, rep_ms)
    except Exception as exc:  # noqa: BLE001 - a backend that cannot be captured still has its eager numbers
        return Missing(f"CUDA-graph capture or replay failed: {type(exc).__name__}: {str(exc)[:300]}")


def graph_times(fn: Callable[[], object], rep_ms: int) -> float:
    """Median milliseconds of one replay of a CUDA graph holding one call of `fn`, L2 flushed (triton's 256 MB
    clear, as do_bench) before every replay; the flush is outside the timed events. Replays: about rep_ms worth,
    10 to 1000. A call that launches no GPU work (a peer adapter's host-only step) captures an empty graph, whose
    replay time says nothing about the call: refused (`graph_median` records why)."""
    from triton import runtime

    cache = runtime.driver.active.get_empty_cache_for_benchmark()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()  # warm-up outside the capture: compilation and tuning must not be captured
        torch.cuda.synchronize()
        graph = capture(fn, stream)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        reps = min(1000, max(10, int(rep_ms / max(start.elapsed_time(end), 1e-3))))
        times = []
        for _ in range(reps):
            runtime.driver.active.clear_cache(cache)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
    return statistics.median(times)


EMPTY_GRAPH = r".*CUDA Graph is empty"  # torch's warning at the end of a capture that recorded no work


def capture(fn: Callable[[], object], stream) -> torch.cuda.CUDAGraph:
    """A CUDA graph holding one call of `fn`, captured on `stream`. torch's warning that the graph is empty (the call
    launched no GPU work) becomes an error naming that; every other warning goes through the filters as usual."""
    graph = torch.cuda.CUDAGraph()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=EMPTY_GRAPH, category=UserWarning)
        try:
            with torch.cuda.graph(graph, stream=stream):
                fn()
        except UserWarning as exc:
            raise RuntimeError("the call launched no GPU work (the captured CUDA graph is empty): no replay to time"
                               ) from exc
    return graph


def abba_sequence(pairs: int) -> list[int]:
    """Which of two calls to make, in ABBA quads (0 = the first, 1 = the second): 0 1 1 0 0 1 1 0 ..., `pairs`
    calls of each (rounded up to an even number, at least 2)."""
    return [which for _ in range(max(1, (pairs + 1) // 2)) for which in (0, 1, 1, 0)]


def split_by_call(order: list[int], values: list[float]) -> tuple[list[float], list[float]]:
    """The values of the first call and of the second, from a sequence made by `abba_sequence`."""
    return [v for o, v in zip(order, values) if o == 0], [v for o, v in zip(order, values) if o == 1]


def gpu_paired_ms(first: Callable[[], object], second: Callable[[], object], rep_ms: int) -> tuple[float, float]:
    """Median milliseconds of `first` and of `second` on the GPU, their calls interleaved in ABBA order, each call
    between its own CUDA events with L2 flushed before it (as do_bench, outside the events): a host or clock that
    drifts over the run falls on both alike, call by call. About rep_ms worth of calls of each, 10 to 1000."""
    from triton import runtime

    cache = runtime.driver.active.get_empty_cache_for_benchmark()
    calls = (first, second)
    first(), second()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    first()
    end.record()
    torch.cuda.synchronize()
    order = abba_sequence(min(1000, max(10, int(rep_ms / max(start.elapsed_time(end), 1e-3)))))
    events = []
    for which in order:
        runtime.driver.active.clear_cache(cache)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        calls[which]()
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    a, b = split_by_call(order, [s.elapsed_time(e) for s, e in events])
    return statistics.median(a), statistics.median(b)


def cpu_times(fn: Callable[[], object], warmup: int, reps: int, quantiles=(0.2, 0.8)) -> dict[str, float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(max(1, reps)):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return {"median_ms": statistics.median(times),
            **{quantile_metric(q): value for q, value in zip(quantiles, sample_quantiles(times, quantiles))}}


def sample_quantiles(samples: list[float], quantiles) -> list[float]:
    """Each quantile of the samples (linear interpolation between order statistics, as torch.quantile)."""
    ordered = sorted(samples)
    out = []
    for q in quantiles:
        pos = q * (len(ordered) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(ordered) - 1)
        out.append(ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo))
    return out


def ceilings(device: torch.device, dtype: torch.dtype, rep_ms: int) -> dict[str, float]:
    """A large matmul (TFLOP/s) and a large copy (GB/s, read + write) measured now, on this device."""
    from triton.testing import do_bench

    n = 8192
    a = torch.randn(n, n, device=device, dtype=dtype if dtype != torch.float64 else torch.float32)
    b = torch.randn_like(a)
    mm_ms = do_bench(lambda: a @ b, rep=rep_ms, return_mode="median")
    src = torch.randn(1 << 28, device=device, dtype=torch.float32)  # 1 GiB of random data, never zeros
    dst = torch.empty_like(src)
    copy_ms = do_bench(lambda: dst.copy_(src), rep=rep_ms, return_mode="median")
    return {"matmul_tflops": 2 * n**3 / (mm_ms * 1e-3) / 1e12,
            "copy_gbps": 2 * src.numel() * 4 / (copy_ms * 1e-3) / 1e9}


# --- each kernel of one call ------------------------------------------------------------------------------------
KERNEL_STAGE = "kernel:"  # a row's stage prefix for one kernel of a timed call (the forward or the backward)
SEPARATOR = "spin_kernel"  # torch.cuda._sleep's kernel (ATen's Sleep.cu): marks where one profiled call begins


def kernel_samples(fn: Callable[[], object], reps: int = 10) -> list[dict[str, tuple[float, int]]]:
    """Per call of `fn` (CUDA): {kernel name: (device milliseconds summed over its launches, launches)}, from one
    torch profiler session over reps + 1 calls, each after an L2 flush (as do_bench flushes) and a short sleep kernel
    that marks where it begins (`calls_between_markers`); the session's first call is dropped (a profiling session
    can lose the first device events it sees), and one unprofiled call runs before it. Memsets and copies the call
    issues count as its kernels."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    from triton import runtime

    if reps < 1:
        raise ValueError(f"reps: expected >= 1, got {reps!r}")
    cache = runtime.driver.active.get_empty_cache_for_benchmark()
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps + 1):
            cache.zero_()
            torch.cuda._sleep(1000)
            fn()
        cache.zero_()
        torch.cuda._sleep(1000)
        torch.cuda.synchronize()
    events = sorted(((e.name, e.time_range.start, e.time_range.elapsed_us()) for e in prof.events()
                     if e.device_type == DeviceType.CUDA), key=lambda e: e[1])
    return calls_between_markers(events)[1:]


def calls_between_markers(events: list[tuple[str, float, float]]) -> list[dict[str, tuple[float, int]]]:
    """Device events (name, start µs, duration µs) in start order, laid out as [flush, marker, call's kernels] × n
    then [flush, marker] -> each call's {name: (ms, launches)}: the events between two markers less the last (the
    next call's flush, which must be the kernel of the first flush: else ValueError, nothing is misattributed)."""
    marks = [i for i, (name, _, _) in enumerate(events) if SEPARATOR in name]
    if len(marks) < 2 or marks[0] != 1:
        raise ValueError(f"events: expected [flush, {SEPARATOR}, call...] repeated, got {len(marks)} markers "
                         f"starting at {marks[:1]}")
    flush = events[0][0]
    calls = []
    for a, b in zip(marks, marks[1:]):
        if b == a + 1:
            raise ValueError(f"events: two {SEPARATOR} markers with no flush between them")
        *inside, last = events[a + 1:b]
        if last[0] != flush:
            raise ValueError(f"events: the kernel before a {SEPARATOR} is {last[0]!r}, not the flush {flush!r}")
        call: dict[str, tuple[float, int]] = {}
        for name, _start, us in inside:
            ms, launches = call.get(name, (0.0, 0))
            call[name] = (ms + us * 1e-3, launches + 1)
        calls.append(call)
    return calls


def kernel_summary(samples: list[dict[str, tuple[float, int]]], quantiles=(0.2, 0.8)) -> dict[str, dict[str, float]]:
    """Each kernel's median, quantiles and launches per call over `samples` (kernel_samples), and its share of the
    calls' summed device time (share_pct: its median over the sum of every kernel's median); a kernel a call did not
    launch counts 0 ms there."""
    if not samples:
        raise ValueError("samples: expected at least one call's kernels")
    names = sorted({name for call in samples for name in call})
    out = {}
    for name in names:
        times = [call.get(name, (0.0, 0))[0] for call in samples]
        launches = [call.get(name, (0.0, 0))[1] for call in samples]
        out[name] = {"median_ms": statistics.median(times),
                     **{quantile_metric(q): v for q, v in zip(quantiles, sample_quantiles(times, quantiles))},
                     "launches": float(statistics.median(launches))}
    total = sum(v["median_ms"] for v in out.values())
    for v in out.values():
        v["share_pct"] = 100.0 * v["median_ms"] / total if total > 0 else float("nan")
    return out
