"""Honest timing: first call (compile / autotune) measured apart, then triton.testing.do_bench with the median
and p20/p80, L2 flushed before every repetition; on a machine without CUDA a wall-clock median.

do_bench (triton 3.6, triton/testing.py) returns the mean unless told otherwise, so return_mode="median" is
always passed; when quantiles are given it returns only those quantiles (return_mode is then ignored), so we
ask for [0.5, 0.2, 0.8]: the median (the 0.5 quantile of the same samples) and p20/p80. Before every
repetition it zeroes a 256 MB buffer (`runtime.driver.active.clear_cache`), which flushes L2; that cannot be
switched off, and the row says so (flush_l2=True).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

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


def gpu_times(fn: Callable[[], object], warmup_ms: int, rep_ms: int, cuda_graph: bool) -> dict[str, float]:
    from triton.testing import do_bench, do_bench_cudagraph

    median, p20, p80 = do_bench(fn, warmup=warmup_ms, rep=rep_ms, quantiles=[0.5, 0.2, 0.8], return_mode="median")
    out = {"median_ms": median, "p20_ms": p20, "p80_ms": p80}
    if cuda_graph:
        try:
            out["graph_median_ms"] = do_bench_cudagraph(fn, rep=rep_ms, return_mode="median")
        except Exception:  # noqa: BLE001 - a backend that cannot be captured still has its eager numbers
            out["graph_median_ms"] = float("nan")
    return out


def cpu_times(fn: Callable[[], object], warmup: int, reps: int) -> dict[str, float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(max(1, reps)):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    q = statistics.quantiles(times, n=5, method="inclusive") if len(times) > 1 else [times[0]] * 4
    return {"median_ms": statistics.median(times), "p20_ms": q[0], "p80_ms": q[3]}


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
    return {"matmul_tflops": 2 * n**3 / (mm_ms * 1e-3) / 1e12, "copy_gbps": 2 * src.numel() * 4 / (copy_ms * 1e-3) / 1e9}
