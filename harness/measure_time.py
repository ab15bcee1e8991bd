"""Step 3 of a point's life: timing a Plan that passed its gate (Plan, GateReport) → `Timings`. Ceilings (GPU: a
matmul and a copy in the same run), each stage chained on the backend's own outputs and the whole forward through
the public entry (harness/timing.py: do_bench medians and quantiles on the GPU, wall-clock on the CPU), the
derived metrics of harness/cost_model.py, and with bench.api_overhead the public call's overhead
(harness/api_overhead.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness import api_overhead, cost_model, timing
from harness.calls import FORWARD_ARGS, forward_arguments, forward_kwargs, public_forward_call
from harness.correctness import GateFailure
from harness.gate import GateReport
from harness.gradient_gate import incoming, leaves_of, output_gradients
from harness.plan import BenchSettings, Plan
from impls.autograd import ssd
from impls.inputs import Inputs
from impls.stages import FORWARD_STAGES, run_chain


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


def stage_callables(backend, inputs: Inputs) -> dict:
    """Zero-argument calls to time: each stage on the outputs of the same backend's previous stage, and the
    whole forward."""
    kw = forward_kwargs(inputs)
    forward = {"forward": public_forward_call(backend, kw)}
    # a peer's adapter steps and its own kernels, timed apart as stages "part:<name>"
    forward.update({f"part:{name}": fn
                    for name, fn in backend.forward_parts(**{k: kw[k] for k in FORWARD_ARGS}).items()})
    if "chunk_cumsum" not in backend.STAGES:
        return forward
    got = {name: t for outputs in run_chain(backend, kw).values() for name, t in outputs.items()}
    return {**{stage.name: (lambda s=stage: s.call(backend, kw, got)) for stage in FORWARD_STAGES}, **forward}


def run(plan: Plan, gate: GateReport) -> Timings:
    """The timings of `plan`, whose gate passed (nothing with bench.time and bench.api_overhead off, but
    describe()); a GateReport with failures is refused: nothing of a failed gate is timed."""
    if gate.failures:
        raise GateFailure("; ".join(gate.failures))
    bench, device, out = plan.point.bench, plan.point.device, []
    if bench.time and plan.point.direction != "forward":
        out += backward_times(plan)
    elif bench.time:
        out += stage_times(plan)
    if bench.api_overhead:
        out += api_overhead.measure(plan.backend, plan.inputs, device, bench)
    return Timings(metrics=tuple(out), describe=plan.backend.describe())


def stage_times(plan: Plan) -> list[tuple[str, str, float | timing.Missing]]:
    bench, device, out = plan.point.bench, plan.point.device, []
    costs = cost_model.costs(plan.point.problem)
    ceilings = {}
    if device.type == "cuda" and bench.ceilings:
        ceilings = timing.ceilings(device, plan.dtype, bench.rep_ms)
        out += [("ceiling", key, value) for key, value in ceilings.items()]
    for stage, fn in stage_callables(plan.backend, plan.inputs).items():
        if stage not in bench.stages and not stage.startswith("part:"):
            continue
        if device.type == "cuda":
            times = timing.gpu_times(fn, bench.warmup_ms, bench.rep_ms, bench.cuda_graph, bench.quantiles)
        else:
            times = timing.cpu_times(fn, bench.cpu_warmup, bench.cpu_reps, bench.quantiles)
        out += [(stage, key, value) for key, value in times.items()]
        if stage not in costs:  # parts of a forward have no cost-model entry of their own
            continue
        derived = cost_model.derived(costs[stage], times["median_ms"], ceilings.get("matmul_tflops"),
                                     ceilings.get("copy_gbps"))
        out += [(stage, key, value) for key, value in derived.items()]
    return out


def backward_callables(backend, inputs: Inputs, seed: int = 0) -> dict:
    """Zero-argument calls of the backward directions, through impls.ssd with every differentiable input
    requiring grad and random, non-zero gradients flowing into every output (harness/gradient_gate.py):
    "backward" (torch.autograd.grad over one forward's graph, kept for repeated calls: the backward alone) and
    "forward_backward" (a forward under autograd, then its backward)."""
    kw = forward_arguments(inputs)
    leaves = leaves_of(kw)
    grads_in = output_gradients(inputs, seed)

    def forward():
        return ssd(**{**kw, **leaves}, backend=backend)

    def grad(out, retain: bool):
        outputs, grads = incoming(out, grads_in)
        return torch.autograd.grad(outputs, list(leaves.values()), grads, retain_graph=retain, allow_unused=True)

    kept = forward()
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
    forward_backward; no CUDA-graph replay (autograd's graph is not captured here); and whether two backward calls
    agree bit for bit ("deterministic" at stage backward: 1 or 0)."""
    bench, device, out = plan.point.bench, plan.point.device, []
    calls = backward_callables(plan.backend, plan.inputs, plan.point.seed)
    wanted = ("backward",) if plan.point.direction == "backward" else ("backward", "forward_backward")
    for stage in wanted:
        if device.type == "cuda":
            times = timing.gpu_times(calls[stage], bench.warmup_ms, bench.rep_ms, False, bench.quantiles)
        else:
            times = timing.cpu_times(calls[stage], bench.cpu_warmup, bench.cpu_reps, bench.quantiles)
        out += [(stage, key, value) for key, value in times.items()]
    if plan.point.direction == "forward_backward":
        out.append(("forward_backward", "peak_mem_bytes", peak_memory(calls["forward_backward"], device)))
    out.append(("backward", "deterministic", 1.0 if bitwise_repeatable(calls["backward"]) else 0.0))
    return out


def bitwise_repeatable(backward) -> bool:
    """Whether two calls of `backward` (over one forward's graph) give every gradient bit for bit the same."""
    first, second = backward(), backward()
    return all((a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))
               for a, b in zip(first, second))
