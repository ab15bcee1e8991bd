"""Step 3 of a point's life: timing a Plan that passed its gate (Plan, GateReport) → `Timings`, over the point's
workload (harness/workloads/). Ceilings (GPU: a matmul and a copy in the same run), each of its stages chained on
the backend's own outputs and its whole forward (the SSD's through the public entry) (harness/timing.py:
do_bench medians and quantiles on the GPU, wall-clock on the CPU), the derived metrics of its cost model
(harness/cost_model.py for the SSD; tokens_per_s where it counts tokens), the backward directions through its
differentiable forward, a step of its own (train_step: harness.workloads.Step), and with
bench.api_overhead the public call's overhead (harness/api_overhead.py)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from harness import api_overhead, cost_model, timing
from harness.correctness import GateFailure
from harness.gate import GateReport
from harness.gradient_gate import incoming
from harness.plan import BenchSettings, Plan
from harness.workloads import get as get_workload
from impls.stages import run_chain


@dataclass(frozen=True)
class Timings:
    metrics: tuple[tuple[str, str, float | timing.Missing], ...] = ()  # (stage, metric, value) in measured order
    describe: dict | None = None  # backend.describe() after the runs: what actually ran (tuning sources among it)


def timer_columns(bench: BenchSettings, device: torch.device) -> dict:
    """The timer, warmup, reps and flush_l2 columns of every row of a point."""
    if not bench.time:
        return {"timer": "none", "warmup": None, "reps": None, "flush_l2": None}
    if device.type == "cuda":  # flush_l2=false is refused at start-up (do_bench always flushes)
        return {"timer": "do_bench", "warmup": bench.warmup_ms, "reps": bench.rep_ms, "flush_l2": bool(bench.flush_l2)}
    return {"timer": "cpu-wall", "warmup": bench.cpu_warmup, "reps": bench.cpu_reps, "flush_l2": False}


def stage_callables(backend, inputs, workload=None) -> dict:
    """Zero-argument calls to time of a workload (default: the SSD): each stage on the outputs of the same backend's
    previous stage, and the whole forward."""
    workload = workload or get_workload("ssd")
    kw = workload.arguments(inputs)
    forward = {"forward": functools.partial(workload.forward.call, backend, kw, {})}
    # a peer's adapter steps and its own kernels, timed apart as stages "part:<name>"
    forward.update({f"part:{name}": fn for name, fn in workload.parts(backend, kw).items()})
    if not workload.chained(backend):
        return forward
    got = {name: t for outputs in run_chain(backend, kw, stages=workload.stages).values()
           for name, t in outputs.items()}
    return {**{stage.name: (lambda s=stage: s.call(backend, kw, got)) for stage in workload.stages}, **forward}


def run(plan: Plan, gate: GateReport) -> Timings:
    """The timings of `plan`, whose gate passed (nothing with bench.time and bench.api_overhead off, but
    describe()); a GateReport with failures is refused: nothing of a failed gate is timed."""
    if gate.failures:
        raise GateFailure("; ".join(gate.failures))
    bench, device, out = plan.point.bench, plan.point.device, []
    if bench.time and plan.point.direction in plan.workload.steps:
        out += step_times(plan)
    elif bench.time and plan.point.direction != "forward":
        out += backward_times(plan)
    elif bench.time:
        out += stage_times(plan)
    if bench.api_overhead:
        out += api_overhead.measure(plan.backend, plan.inputs, device, bench)
    return Timings(metrics=tuple(out), describe=plan.backend.describe())


def stage_times(plan: Plan) -> list[tuple[str, str, float | timing.Missing]]:
    bench, device = plan.point.bench, plan.point.device
    costs = plan.workload.cost(plan.point.problem, plan.point.workload_options)
    ceilings, out = measured_ceilings(plan)
    for stage, fn in stage_callables(plan.backend, plan.inputs, plan.workload).items():
        if stage not in bench.stages and not stage.startswith("part:"):
            continue
        if device.type == "cuda":
            times = timing.gpu_times(fn, bench.warmup_ms, bench.rep_ms, bench.cuda_graph, bench.quantiles)
        else:
            times = timing.cpu_times(fn, bench.cpu_warmup, bench.cpu_reps, bench.quantiles)
        out += [(stage, key, value) for key, value in times.items()]
        out += token_rate(plan, stage, times)
        if stage == "forward" and plan.workload.tokens is not None:  # an end-to-end model's prefill: its memory too
            out.append((stage, "peak_mem_bytes", peak_memory(fn, device)))
        if stage == "forward" and device.type == "cuda" and bench.kernel_times:
            out += kernel_rows(fn, bench.quantiles, costs, ceilings, plan.point.backend)
        if stage not in costs:  # parts of a forward have no cost-model entry of their own
            continue
        out += derived_metrics(stage, costs[stage], times, ceilings)
    return out


def measured_ceilings(plan: Plan) -> tuple[dict, list[tuple[str, str, float]]]:
    """The matmul and copy ceilings measured on the point's GPU with bench.ceilings ({} elsewhere), and their
    "ceiling" rows."""
    bench, device = plan.point.bench, plan.point.device
    if device.type != "cuda" or not bench.ceilings:
        return {}, []
    ceilings = timing.ceilings(device, plan.dtype, bench.rep_ms)
    return ceilings, [("ceiling", key, value) for key, value in ceilings.items()]


def derived_metrics(stage: str, cost: dict, times: dict, ceilings: dict) -> list[tuple[str, str, float]]:
    """The cost model's derived metrics of a timed stage (harness/cost_model.py `derived`); none without a median."""
    median = times["median_ms"]
    if isinstance(median, timing.Missing) or not median > 0:
        return []
    derived = cost_model.derived(cost, median, ceilings.get("matmul_tflops"), ceilings.get("copy_gbps"))
    return [(stage, key, value) for key, value in derived.items()]


def token_rate(plan: Plan, stage: str, times: dict) -> list[tuple[str, str, float | timing.Missing]]:
    """tokens_per_s of a timed stage of a workload that counts its tokens (`Workload.tokens`: the language model's
    batch·seqlen per call) over its median; nothing for a part of a forward or a workload that counts none."""
    if plan.workload.tokens is None or stage.startswith("part:"):
        return []
    median = times["median_ms"]
    if isinstance(median, timing.Missing) or not median > 0:
        return [(stage, "tokens_per_s", timing.Missing(f"no median of {stage} to divide by"))]
    return [(stage, "tokens_per_s", plan.workload.tokens(plan.point.problem) / (median * 1e-3))]


def step_times(plan: Plan) -> list[tuple[str, str, float | timing.Missing]]:
    """A stepped direction's timings (harness.workloads.Step: train_step), each of its calls as a stage with its
    tokens_per_s and its peak memory; no CUDA-graph replay (autograd's graph and the optimizer are not captured)."""
    bench, device, out = plan.point.bench, plan.point.device, []
    calls = plan.workload.steps[plan.point.direction].calls(plan.backend, plan.inputs, plan.point.seed)
    for stage, fn in calls.items():
        if device.type == "cuda":
            times = timing.gpu_times(fn, bench.warmup_ms, bench.rep_ms, False, bench.quantiles)
        else:
            times = timing.cpu_times(fn, bench.cpu_warmup, bench.cpu_reps, bench.quantiles)
        out += [(stage, key, value) for key, value in times.items()]
        out += token_rate(plan, stage, times)
        out.append((stage, "peak_mem_bytes", peak_memory(fn, device)))
    return out


def backward_callables(backend, inputs, seed: int = 0, workload=None) -> dict:
    """Zero-argument calls of the backward directions of a workload (default: the SSD, through impls.ssd), with
    every differentiable input requiring grad and random, non-zero gradients flowing into every output (its
    Backward declaration): "backward" (torch.autograd.grad over one forward's graph, kept for repeated calls: the
    backward alone) and "forward_backward" (a forward under autograd, then its backward)."""
    workload = workload or get_workload("ssd")
    backward = workload.backward
    kw = workload.arguments(inputs)
    leaves = backward.leaves(kw)
    grads_in = backward.incoming(inputs, seed)

    def forward():
        return backward.call(backend, kw, leaves)

    def grad(out, retain: bool):
        outputs, grads = incoming(out, grads_in)
        return torch.autograd.grad(outputs, list(leaves.values()), grads, retain_graph=retain, allow_unused=True)

    kept = forward()
    # the incoming gradients in the outputs' dtypes once, here: drawn in float64, their conversion (0.6 ms of an
    # elementwise kernel at S1 on an H100) was timed with every backend's backward until 2026-12-07
    grads_in = {name: g.to(kept[name].dtype) for name, g in grads_in.items() if kept.get(name) is not None}
    return {"backward": lambda: grad(kept, retain=True), "forward_backward": lambda: grad(forward(), retain=False)}


def peak_memory(fn, device: torch.device) -> float | timing.Missing:
    """Bytes allocated at the peak of one call of `fn` beyond what was allocated before it (GPU only)."""
    if device.type != "cuda":
        return timing.Missing("peak memory is measured on the GPU only")
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    return float(torch.cuda.max_memory_allocated(device) - before)


def backward_times(plan: Plan) -> list[tuple[str, str, float | timing.Missing]]:
    """The backward directions' timings: "backward" for both, "forward_backward" and its peak memory for
    forward_backward, each with its cost model's derived metrics where the workload has a cost for it (the
    ceilings measured as for the forward); with bench.kernel_times each kernel of the backward under its own
    stage (`kernel_rows`); no CUDA-graph replay (autograd's graph is not captured here); and whether two backward calls
    agree bit for bit ("deterministic" at stage backward: 1 or 0)."""
    bench, device = plan.point.bench, plan.point.device
    costs = plan.workload.cost(plan.point.problem, plan.point.workload_options)
    ceilings, out = measured_ceilings(plan)
    calls = backward_callables(plan.backend, plan.inputs, plan.point.seed, plan.workload)
    wanted = ("backward",) if plan.point.direction == "backward" else ("backward", "forward_backward")
    for stage in wanted:
        if device.type == "cuda":
            times = timing.gpu_times(calls[stage], bench.warmup_ms, bench.rep_ms, False, bench.quantiles)
        else:
            times = timing.cpu_times(calls[stage], bench.cpu_warmup, bench.cpu_reps, bench.quantiles)
        out += [(stage, key, value) for key, value in times.items()]
        if stage in costs:
            out += derived_metrics(stage, costs[stage], times, ceilings)
    if device.type == "cuda" and bench.kernel_times:
        out += kernel_rows(calls["backward"], bench.quantiles, costs, ceilings, plan.point.backend)
    if plan.point.direction == "forward_backward":
        out.append(("forward_backward", "peak_mem_bytes", peak_memory(calls["forward_backward"], device)))
    out.append(("backward", "deterministic", 1.0 if bitwise_repeatable(calls["backward"]) else 0.0))
    return out


def kernel_rows(fn, quantiles, costs: dict, ceilings: dict, backend: str) -> list[tuple[str, str, float]]:
    """Each kernel of one call of `fn` (the whole forward, or the backward) under its own stage, kernel:<name>
    (harness/timing.py kernel_samples / kernel_summary: median, quantiles, launches per call, share of the call's
    device time), with the cost model's derived metrics (frac_floor against the same run's ceilings) where the model
    prices that kernel on its own (harness/cost_model.py priced_kernel: our forward stages' and backward kernels).
    A profiler that fails gives one row, stage kernel:*, whose note says why."""
    try:
        summary = timing.kernel_summary(timing.kernel_samples(fn), quantiles)
    except Exception as exc:  # noqa: BLE001 - the profiler failing leaves the call's own timings standing
        return [(timing.KERNEL_STAGE + "*", "median_ms",
                 timing.Missing(f"the torch profiler failed: {type(exc).__name__}: {str(exc)[:300]}"))]
    rows = []
    for name, metrics in summary.items():
        stage = timing.KERNEL_STAGE + name
        rows += [(stage, key, value) for key, value in metrics.items()]
        priced = cost_model.priced_kernel(name, costs, backend)
        if priced is not None:
            rows += derived_metrics(stage, costs[priced], metrics, ceilings)
    return rows


def bitwise_repeatable(backward) -> bool:
    """Whether two calls of `backward` (over one forward's graph) give every gradient bit for bit the same."""
    first, second = backward(), backward()
    return all((a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))
               for a, b in zip(first, second))
