"""Nsight Compute over one call per backend (a forward, a backward or both): per kernel, DRAM and L2 traffic,
spills, warp stalls, occupancy.

    python -m instruments.profile [--backends cutile mamba_ssm triton tilegym fla vllm] [--shape S1] [--out DIR]
                                  [--ablations none heads_first:True+pdl:True ...]
                                  [--direction forward|backward|forward_backward]

Each --ablations point (the harness's ablation grammar, harness/config.py: `none`, `<switch>`,
`<switch>:<value>`, `all_off`, `only:<switch>`, joined by `+`) is applied to each backend's switches, one target
process per (backend, point); the rows carry the point in their `ablation` column.

Each backend runs in its own process under `ncu --clock-control none` (the GPU machine's rule: leave the
clocks alone) with `--profile-from-start off`: the target process draws the headline problem's inputs (bf16),
runs the profiled call twice outside the profiled range (compilation, autotuning, caches), then once inside
`cudaProfilerStart`/`cudaProfilerStop`, so only that call's kernels are measured. ncu replays each kernel
once per metric pass and restores device memory between passes, so the figures are those of one call. The call is
what the timed rows time (harness/measure_time.py): `forward` is `impls.ssd_forward`; `backward` is
`torch.autograd.grad` over one forward's graph of `impls.ssd` (the forward runs before the range opens), with every
differentiable input requiring grad and random non-zero gradients into every output; `forward_backward` is the
forward under autograd and its backward, both inside the range.

Writes `profile.ncu.parquet` under --out (a table of its own: the results store skips `*.ncu.parquet`): one row
per (backend, kernel launch, metric) — METRICS below (local-memory spill requests, L2 throughput and hit rate,
DRAM throughput, the warp-stall breakdown, tensor-pipe use, registers, achieved occupancy) and DERIVED, with units —
plus per backend the sums over its launches (kernel named by the direction: "forward", "backward",
"forward_backward") and the cost model's minimum bytes and flops (harness/cost_model.py) beside them; a launch whose
kernel the cost model prices on its own (a forward stage, or one of our backward kernels: `bwd_chunk_kernel` is
`bwd_chunk`) gets that kernel's model bytes and flops and its measured DRAM bytes over them too, so measured traffic
and the model can be read off one table.
Exits 1 if a backend's target launched no kernel in the profiled range or ncu failed.
"""

from __future__ import annotations

import argparse
import csv
import glob
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

# ncu metric -> (our name, unit, how launches add up over a forward). Names as Nsight Compute (2025.x) spells them
# on sm_90, each checked against `ncu --query-metrics --chip gh100` on the H200 machine (2026-12-04; the names are
# in tests/fixtures/ncu_metrics_gh100.txt.gz, tests/instruments/test_profile.py) except the launch__ attributes, which
# that query does not list and which the 2026-12-03 profile read; where each comes from:
# - time, DRAM bytes, occupancy, registers: the GPU Speed Of Light, Occupancy and Launch Statistics sections of
#   ncu (`sections/*.section`, shipped with Nsight Compute);
# - local-memory (spill) requests: `l1tex__t_requests_pipe_lsu_mem_local_op_{ld,st}.sum`, the metrics the Nsight
#   Compute CLI guide maps nvprof's local_load_requests / local_store_requests to (docs.nvidia.com/nsight-compute/
#   NsightComputeCli, "Metric Comparison"); the bytes beside them are the same pipe's `t_bytes`;
# - L2 and DRAM throughput (% of peak): `lts__throughput` and `gpu__dram_throughput` `.avg.pct_of_peak_sustained_
#   elapsed`, the "SOL L2" and "SOL FB" entries of ncu's SpeedOfLight.section; L2 hit rate `lts__t_sector_hit_rate.pct`
#   (the CLI guide's mapping of nvprof's l2_tex_hit_rate; the Memory Workload Analysis tables);
# - issue slots busy: `smsp__issue_active.avg.pct_of_peak_sustained_active` (ncu's Scheduler Statistics);
# - the warp-stall breakdown: `smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio`, cycles a warp
#   spends in each state per issued instruction, the bars of ncu's WarpStateStats.section and the inputs of its
#   CPIStall rules, whose total (all states, per issued instruction) is
#   `smsp__average_warp_latency_per_inst_issued.ratio` (ncu 2025.1's CPIStall rule); STALL_OTHER below is the
#   total less the reasons named here, and each reason's share of the total is derived (DERIVED);
# - tensor pipe: `sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active`, cycles the SM's tensor pipe
#   was busy (warpgroup HGMMA and warp-level HMMA alike on sm_90), as a share of the active cycles' peak.
# "gmma": waiting on WARPGROUP.ARRIVES, i.e. on an sm_90 warpgroup MMA's result (the MMA stall)
STALL_REASONS = ("long_scoreboard", "barrier", "math_pipe_throttle", "wait", "short_scoreboard", "mio_throttle",
                 "lg_throttle", "no_instruction", "dispatch_stall", "not_selected", "selected", "gmma")
METRICS = {
    "gpu__time_duration.sum": ("duration_ns", "ns", "sum"),
    "dram__bytes_read.sum": ("dram_read_bytes", "byte", "sum"),
    "dram__bytes_write.sum": ("dram_write_bytes", "byte", "sum"),
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed": ("dram_throughput_pct", "%", "time-weighted"),
    "lts__throughput.avg.pct_of_peak_sustained_elapsed": ("l2_throughput_pct", "%", "time-weighted"),
    "lts__t_sector_hit_rate.pct": ("l2_hit_rate_pct", "%", "time-weighted"),
    "sm__warps_active.avg.pct_of_peak_sustained_active": ("achieved_occupancy_pct", "%", "time-weighted"),
    "smsp__issue_active.avg.pct_of_peak_sustained_active": ("issue_active_pct", "%", "time-weighted"),
    "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active": ("tensor_pipe_active_pct", "%",
                                                                        "time-weighted"),
    "launch__registers_per_thread": ("registers_per_thread", "1", "max"),
    "launch__occupancy_limit_registers": ("occupancy_limit_registers", "blocks/SM", "min"),
    "l1tex__t_requests_pipe_lsu_mem_local_op_ld.sum": ("local_load_requests", "request", "sum"),
    "l1tex__t_requests_pipe_lsu_mem_local_op_st.sum": ("local_store_requests", "request", "sum"),
    "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum": ("local_load_bytes", "byte", "sum"),
    "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum": ("local_store_bytes", "byte", "sum"),
    "smsp__average_warp_latency_per_inst_issued.ratio": ("warp_cycles_per_issue", "cycle/inst", "time-weighted"),
    **{f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio":
       (f"stall_{reason}", "cycle/inst", "time-weighted") for reason in STALL_REASONS},
}
STALL_OTHER = "stall_other"
# figures computed from the measured ones (per launch, and again from the forward's totals): our name -> unit
DERIVED = {STALL_OTHER: "cycle/inst",
           **{f"stall_{reason}_share_pct": "%" for reason in (*STALL_REASONS, "other")}}
UNITS = {**{name: unit for name, unit, _ in METRICS.values()}, **DERIVED}
PROFILED_MARK = "PROFILED_CALL_DONE"
DIRECTIONS = ("forward", "backward", "forward_backward")  # harness/workloads DIRECTIONS, kept here import-light


# --- the target process -----------------------------------------------------------------------------------
def ablation_switches(backend_name: str, ablation: str) -> dict:
    """The switch overrides of an ablation point for a backend, from its defaults on the target it runs on (or the
    point's preset: `ablation_preset`), as a sweep's point; raises ConfigError naming a bad point."""
    import dataclasses

    from harness.config import apply_ablation, split_preset
    from impls.registry import backend_class, resolve_switches, target_on

    cls = backend_class(backend_name)
    preset, rest = split_preset(ablation)
    try:
        base = resolve_switches(cls, target_on(cls), preset).first.switches
    except ValueError as exc:  # an unknown preset
        from harness.config import ConfigError

        raise ConfigError(str(exc)) from exc
    return apply_ablation(cls.Switches, {}, rest, dataclasses.asdict(base))


def ablation_preset(ablation: str) -> str | None:
    """The preset an ablation point runs ("preset:<name>" first), or None: the target's defaults."""
    from harness.config import split_preset

    return split_preset(ablation)[0]


def profiled_call(backend, inputs, direction: str):
    """The zero-argument call a direction profiles, as the timed rows call it: `impls.ssd_forward` for the forward;
    harness/measure_time.py's backward calls (one forward's graph kept, torch.autograd.grad over it; or forward and
    backward together) for the others."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction: expected one of {DIRECTIONS}, got {direction!r}")
    if direction == "forward":
        import impls

        kw = inputs.forward_kwargs()
        return lambda: impls.ssd_forward(**kw, backend=backend)
    from harness.measure_time import backward_callables

    return backward_callables(backend, inputs)[direction]


def run_target(backend_name: str, shape_name: str, ablation: str = "none", direction: str = "forward") -> None:
    import torch

    import impls
    from impls.inputs import make_inputs

    problem = headline_problem(shape_name)
    backend = impls.get_backend(backend_name, preset=ablation_preset(ablation),
                                **ablation_switches(backend_name, ablation))
    call = profiled_call(backend, make_inputs(problem, device="cuda", seed=0), direction)
    for _ in range(2):  # compile, autotune, warm the caches: outside the profiled range
        call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print(PROFILED_MARK, flush=True)


def headline_problem(shape_name: str):
    """The headline problem (conf/problem/headline.yaml) in bf16 at a shape preset of conf/shape/."""
    from omegaconf import OmegaConf

    from impls.problem import Problem, Shape

    path = Path(__file__).resolve().parent.parent / "conf" / "shape" / f"{shape_name}.yaml"
    if not path.exists():
        raise SystemExit(f"--shape: no preset {shape_name!r} in conf/shape/")
    s = OmegaConf.load(path)
    shape = Shape(s.batch, s.seqlen, s.nheads, s.headdim, s.ngroups, s.dstate, s.chunk_size)
    return Problem(shape, dtype="bfloat16")


# --- the driver ---------------------------------------------------------------------------------------------
def ncu() -> str:
    found = shutil.which("ncu")
    candidates = [found, "/usr/local/cuda/bin/ncu", *sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu"))]
    for candidate in candidates:
        if candidate and Path(candidate).exists():
            return str(candidate)
    raise SystemExit("ncu (Nsight Compute) not found: it ships with the CUDA toolkit and in /opt/nvidia")


def ncu_command(backend: str, shape: str, ablation: str = "none", direction: str = "forward") -> list[str]:
    return [ncu(), "--clock-control", "none", "--profile-from-start", "off", "--target-processes", "all",
            "--metrics", ",".join(METRICS), "--csv", "--page", "raw", "--print-units", "base",
            sys.executable, "-m", "instruments.profile", "--target", backend, shape, ablation, direction]


def parse_ncu_csv(text: str) -> list[dict]:
    """ncu --csv --page raw output -> [{"kernel", "launch", metric name: float}], one per kernel launch. The
    CSV starts at the line holding the "Kernel Name" header; the line after it holds the units (no ID)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if '"Kernel Name"' in line), None)
    if start is None:
        return []
    launches = []
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        if not (row.get("ID") or "").strip().isdigit():
            continue  # the units line, or a line of the target's own output
        values = {}
        for metric, (name, _unit, _how) in METRICS.items():
            raw = (row.get(metric) or "").replace(",", "").strip()
            try:
                values[name] = float(raw)
            except ValueError:
                values[name] = float("nan")
        launches.append({"kernel": row["Kernel Name"], "launch": int(row["ID"]), **values, **derived(values)})
    return launches


def derived(values: dict[str, float]) -> dict[str, float]:
    """The stall cycles no named reason accounts for (the total per issued instruction less the named reasons),
    and every reason's share of the total, in %. NaN where the total is missing or zero."""
    import math

    total = values.get("warp_cycles_per_issue", float("nan"))
    named = [values.get(f"stall_{reason}", float("nan")) for reason in STALL_REASONS]
    other = total - sum(named)
    out = {STALL_OTHER: other}
    for reason, value in zip((*STALL_REASONS, "other"), (*named, other)):
        ok = not math.isnan(total) and total > 0
        out[f"stall_{reason}_share_pct"] = 100.0 * value / total if ok else float("nan")
    return out


def forward_totals(launches: list[dict]) -> dict[str, float]:
    """The launches of one profiled call added up per METRICS' rule (occupancy weighted by each launch's time)."""
    import math

    totals = {}
    time = sum(l["duration_ns"] for l in launches)
    for name, _unit, how in METRICS.values():
        values = [l[name] for l in launches if not math.isnan(l[name])]
        if not values:
            totals[name] = float("nan")
        elif how == "sum":
            totals[name] = sum(values)
        elif how == "max":
            totals[name] = max(values)
        elif how == "min":
            totals[name] = min(values)
        else:
            totals[name] = sum(l[name] * l["duration_ns"] for l in launches) / time if time else float("nan")
    return {**totals, **derived(totals)}


def stall_summary(launch, top: int = 5) -> str:
    """The `top` warp-stall shares of one launch (a dict, or a row with the share columns), largest first:
    'long_scoreboard 51 %, barrier 12 %, ...'; a share the launch lacks counts as NaN, ranked last."""
    shares = {reason: launch.get(f"stall_{reason}_share_pct", float("nan")) for reason in (*STALL_REASONS, "other")}
    ranked = sorted(shares.items(), key=lambda kv: -kv[1] if kv[1] == kv[1] else 0.0)
    return ", ".join(f"{reason} {share:.0f} %" for reason, share in ranked[:top])


def backend_rows(backend: str, shape: str, launches: list[dict], problem, ablation: str = "none",
                 direction: str = "forward") -> list[dict]:
    from harness import cost_model

    units = UNITS

    def row(kernel, launch, metric, value, unit):
        return {"backend": backend, "shape_name": shape, "kernel": kernel, "launch": launch, "metric": metric,
                "value": value, "unit": unit}

    costs = cost_model.costs(problem)
    rows = []
    for launch in launches:
        rows += [row(launch["kernel"], launch["launch"], name, launch[name], units[name]) for name in units]
        priced = cost_model.priced_kernel(launch["kernel"], costs, backend)
        if priced is not None:
            cost = costs[priced]
            measured = launch["dram_read_bytes"] + launch["dram_write_bytes"]
            rows += [row(launch["kernel"], launch["launch"], "model_bytes", float(cost["bytes"]), "byte"),
                     row(launch["kernel"], launch["launch"], "model_flops", float(cost["flops"]), "flop"),
                     row(launch["kernel"], launch["launch"], "dram_bytes_over_model",
                         measured / cost["bytes"] if cost["bytes"] else float("nan"), "1")]
    totals = forward_totals(launches)
    rows += [row(direction, -1, name, value, units[name]) for name, value in totals.items()]
    rows.append(row(direction, -1, "launches", float(len(launches)), "1"))
    whole = costs[direction]
    for key in ("bytes", "bytes_fused", "flops"):
        rows.append(row("cost_model", -1, key, float(whole[key]), "flop" if key == "flops" else "byte"))
    measured = totals["dram_read_bytes"] + totals["dram_write_bytes"]
    rows.append(row(direction, -1, "dram_bytes_over_model", measured / whole["bytes"], "1"))
    return [{**r, "ablation": ablation, "direction": direction} for r in rows]


def profile_backend(backend: str, shape: str, timeout: int, ablation: str = "none",
                    direction: str = "forward") -> tuple[list[dict], str]:
    try:
        res = subprocess.run(ncu_command(backend, shape, ablation, direction), capture_output=True, text=True,
                             timeout=timeout, env=os.environ)
        out = res.stdout + "\n" + res.stderr
    except subprocess.TimeoutExpired as exc:
        return [], f"timeout after {timeout} s: {exc}"
    if PROFILED_MARK not in out:
        return [], f"the target did not finish: {out[-1500:]}"
    return parse_ncu_csv(res.stdout), out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", nargs=4, metavar=("BACKEND", "SHAPE", "ABLATION", "DIRECTION"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--backends", nargs="+", default=["cutile", "mamba_ssm", "triton", "tilegym", "fla", "vllm"])
    parser.add_argument("--shape", default="S1")
    parser.add_argument("--out", default="results/scratch/profile")
    parser.add_argument("--timeout", type=int, default=300)
    parser.add_argument("--ablations", nargs="+", default=["none"],
                        help="ablation points applied to each backend's switches (harness/config.py grammar)")
    parser.add_argument("--direction", choices=DIRECTIONS, default="forward",
                        help="what one profiled call runs: the forward, the backward over one forward's graph, or both")
    args = parser.parse_args(argv)
    if args.target:
        run_target(*args.target)
        return 0
    from harness.config import ConfigError

    runs = []
    for backend in args.backends:  # every point checked before the first profile starts
        for ablation in args.ablations:
            try:
                ablation_switches(backend, ablation)
            except ConfigError as err:
                parser.error(f"--ablations: {err}")
            runs.append((backend, ablation))
    import pandas as pd
    import torch

    from harness import provenance, store

    problem = headline_problem(args.shape)
    prov = provenance.collect(torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu"))
    rows, failures = [], []
    for backend, ablation in runs:
        launches, log = profile_backend(backend, args.shape, args.timeout, ablation, args.direction)
        if not launches:
            failures.append((backend, ablation))
            print(f"[profile] {backend} {ablation}: no kernel profiled — {log[-600:]}", flush=True)
            continue
        rows += backend_rows(backend, args.shape, launches, problem, ablation, args.direction)
        t = forward_totals(launches)
        print(f"[profile] {backend} {ablation} {args.shape} {args.direction}: {len(launches)} launches, "
              f"{t['duration_ns'] / 1e3:.1f} us, "
              f"DRAM read {t['dram_read_bytes'] / 1e9:.3f} GB write {t['dram_write_bytes'] / 1e9:.3f} GB, "
              f"occupancy {t['achieved_occupancy_pct']:.1f} %, max regs {t['registers_per_thread']:.0f}, "
              f"local ld/st {t['local_load_requests'] / 1e6:.2f}/{t['local_store_requests'] / 1e6:.2f} M requests",
              flush=True)
        for launch in launches:
            print(f"    {launch['kernel'][:60]:60} {launch['duration_ns'] / 1e3:9.1f} us "
                  f"R {launch['dram_read_bytes'] / 1e6:9.1f} MB W {launch['dram_write_bytes'] / 1e6:9.1f} MB "
                  f"occ {launch['achieved_occupancy_pct']:5.1f} % regs {launch['registers_per_thread']:4.0f} "
                  f"local {(launch['local_load_requests'] + launch['local_store_requests']) / 1e6:6.2f} M req",
                  flush=True)
            print(f"    {'':60} L2 {launch['l2_throughput_pct']:5.1f} % hit {launch['l2_hit_rate_pct']:5.1f} % "
                  f"DRAM {launch['dram_throughput_pct']:5.1f} % tensor {launch['tensor_pipe_active_pct']:5.1f} % "
                  f"issue {launch['issue_active_pct']:5.1f} % stalls: " + stall_summary(launch), flush=True)
    if rows:
        df = pd.DataFrame(rows)
        versions = [key for key in prov if key.startswith("v_")]  # every declared package (harness.provenance)
        for key in (*versions, "gpu_name", "gpu_uuid", "driver", "git_commit", "git_dirty"):
            df[key] = prov.get(key)
        df["tool"] = "ncu --clock-control none"
        df["problem"] = f"headline bf16 {problem.shape.label()}"
        path = store.write_atomic(df, Path(args.out) / "profile.ncu.parquet")
        print(f"[profile] {len(df)} rows -> {path}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
