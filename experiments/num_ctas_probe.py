"""Does cuTile's `ct.kernel(num_ctas=)` (a cluster of CTAs per tile program) run on sm_90, and what does it do to our
kernels? The tuned compute_out with `num_ctas=2` once failed at launch with "misaligned address" and lost the CUDA
context (with cuda-tile 1.7.0 on one NVIDIA H200 it no longer did: docs/perf-notes.md, versions 12–17 measured), so
every case runs in a process of its own. compute_out has the switch `num_ctas` since; the probe wraps `ct.kernel`
so that stage 2's kernel can be tried too.

    python -m experiments.num_ctas_probe [--out DIR] [--cases add add_odd_x ... fwd_pass_state] [--ctas 1 2]
                                         [--shape S1 | --shape B,L,H,P,G,N,C] [--switches heads_per_tile=1,...]

Cases, each at `num_ctas` 1 and 2:
- add: y = x + 1 over 64 × 64 tiles (no MMA, no reduction) on a 64 × 64 grid: does a cluster launch run at all;
- add_odd_x, add_odd_y: the same on a 63 × 64 and a 64 × 63 grid (a grid dimension that two CTAs do not divide);
- matmul: bf16 (1024 × 1024) · (1024 × 1024) over 128 × 128 × 64 tiles, fp32 accumulation;
- compute_out, fwd_pass_state: our stage at `--shape` (default S1, conf/shape/S1.yaml; bf16; the committed tuning
  record where one exists, else the fallback tiles), its kernels built with the given `num_ctas` (every other
  setting of the record kept), gated by experiments.correctness.check against the float64 reference, then timed
  (do_bench median, p20, p80, ms). `--switches` builds the backend with those cuTile switches (size pins such as
  heads_per_tile=1,occupancy=2 — the fallback tiles the small GPU test cases ran — over the record), so that a tile
  configuration and a shape can be tried apart: the GPU tests' clusters misaligned at their small shapes under the
  fallback tiles, and ran at S1 under its record.
Each prints one JSON line (case, num_ctas, ok, error, rel_err, timings, the kernel's registers, spills, multicast
loads and cluster barriers from its sm_90 cubin); the parent writes them to DIR/num_ctas_probe.jsonl.
Compiled on the CPU (`--compile-only`), the cases report only what the sm_90 machine code holds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import traceback

import cuda.tile as ct

CASES = ("add", "add_odd_x", "add_odd_y", "matmul", "compute_out", "fwd_pass_state")
SMALL = ("add", "add_odd_x", "add_odd_y", "matmul")
ADD_GRIDS = {"add": (64, 64), "add_odd_x": (63, 64), "add_odd_y": (64, 63)}  # grids of 64 × 64 tiles
STAGE_KERNELS = {"compute_out": ("compute_out_kernel",), "fwd_pass_state": ("fwd_pass_state_kernel",)}


def add_one(x, y, T: ct.Constant[int]):
    """y = x + 1 over T × T tiles."""
    i, j = ct.bid(0), ct.bid(1)
    ct.store(y, (i, j), ct.load(x, (i, j), (T, T)) + 1.0)


def matmul(a, b, c, TM: ct.Constant[int], TN: ct.Constant[int], TK: ct.Constant[int], KT: ct.Constant[int]):
    """c = a · b over TM × TN tiles, KT steps of TK, fp32 accumulation."""
    i, j = ct.bid(0), ct.bid(1)
    acc = ct.zeros((TM, TN), dtype=ct.float32)
    for k in range(KT):
        acc = ct.mma(ct.load(a, (i, k), (TM, TK)), ct.load(b, (k, j), (TK, TN)), acc)
    ct.store(c, (i, j), acc.astype(c.dtype))


def _bench(fn) -> dict:
    import triton.testing

    med, p20, p80 = triton.testing.do_bench(fn, quantiles=[0.5, 0.2, 0.8])
    return {"median_ms": med, "p20_ms": p20, "p80_ms": p80}


def run_small(case: str, ctas: int) -> dict:
    import torch

    stream = torch.cuda.current_stream()
    if case in ADD_GRIDS:
        gx, gy = ADD_GRIDS[case]
        x = torch.randn(gx * 64, gy * 64, device="cuda")
        y = torch.full_like(x, float("nan"))
        k = ct.kernel(add_one, num_ctas=ctas)
        go = lambda: ct.launch(stream, (gx, gy, 1), k, (x, y, 64))  # noqa: E731
        go()
        torch.cuda.synchronize()
        err = ((y - (x + 1)).norm() / (x + 1).norm()).item()
    else:
        n, tm, tn, tk = 1024, 128, 128, 64
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        c = torch.full((n, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        k = ct.kernel(matmul, num_ctas=ctas)
        go = lambda: ct.launch(stream, (n // tm, n // tn, 1), k, (a, b, c, tm, tn, tk, n // tk))  # noqa: E731
        go()
        torch.cuda.synchronize()
        ref = a.double() @ b.double()
        err = ((c.double() - ref).norm() / ref.norm()).item()
    return {"rel_err": err, "ok": err < 1e-2, **_bench(go)}


def _with_num_ctas(ctas: int, names: tuple[str, ...]) -> None:
    """`cuda.tile.kernel` wrapped so that the kernels named `names` are built with `num_ctas=ctas` (the stage's
    launcher calls `ct.kernel` through impls.cutile.common.kernel_for, which looks it up at each first build)."""

    plain = ct.kernel

    def kernel(fn=None, /, **kw):
        if fn is not None and getattr(fn, "__name__", "") in names:
            kw["num_ctas"] = ctas
        return plain(fn, **kw) if fn is not None else plain(**kw)

    ct.kernel = kernel


def probe_shape(spec: str):
    """A conf/shape preset name, or seven comma-separated sizes (batch, seqlen, nheads, headdim, ngroups, dstate,
    chunk_size)."""
    from impls.cli import load_shape
    from impls.problem import Shape

    if "," not in spec:
        return load_shape(spec)
    sizes = spec.split(",")
    if len(sizes) != 7 or not all(v.strip().isdigit() and int(v) > 0 for v in sizes):
        raise ValueError(f"--shape: expected a preset name or 7 positive integers B,L,H,P,G,N,C, got {spec!r}")
    return Shape(*(int(v) for v in sizes))


def run_stage(case: str, ctas: int, shape: str = "S1", switches: dict | None = None) -> dict:
    import torch
    import triton.testing  # noqa: F401  (fail before the long reference if the timer is missing)

    from experiments import correctness
    from experiments.calls import forward_kwargs
    from impls import get_backend
    from impls.inputs import make_inputs
    from impls.problem import Problem

    _with_num_ctas(ctas, STAGE_KERNELS[case])
    problem = Problem(shape=probe_shape(shape), dtype="bfloat16")
    inputs = make_inputs(problem, device="cuda", draw_device="cuda")
    backend = get_backend("cutile", **(switches or {}))
    ref = correctness.reference_forward(inputs, "float64")
    report = correctness.check(backend, inputs, ref, torch.bfloat16)
    torch.cuda.synchronize()
    row = {"rel_err": report[case]["rel_err"], "ok": report[case]["ok"], "error": report[case]["error"],
           "forward_ok": report["forward"]["ok"]}
    if not row["ok"]:
        return row
    kw = forward_kwargs(inputs)
    dt, dA = backend.chunk_cumsum(kw["dt"], kw["A"], kw["chunk_size"], kw["dt_bias"], kw["dt_softplus"],
                                  kw["dt_limit"])
    states, _ = backend.fwd_pass_state(kw["B"], kw["x"], dt, dA, None, None, kw["state_dtype"])
    if case == "compute_out":
        go = lambda: backend.compute_out(kw["C"], kw["B"], kw["x"], dt, dA, states, kw["D"], None, None)  # noqa: E731
    else:
        go = lambda: backend.fwd_pass_state(kw["B"], kw["x"], dt, dA, None, None, kw["state_dtype"])  # noqa: E731
    return {**row, **_bench(go)}


def compile_facts(case: str, ctas: int, switches: dict | None = None) -> dict:
    """Registers, stack and local loads/stores of the case's kernel compiled for sm_90 on the CPU with
    `num_ctas=ctas` (our stages at the S1 record with what `switches` pin over it, every other option as the
    record); the multicast TMA loads, cluster barriers and generic 16-bit loads and stores (with a cluster: the
    exchange through the peer's shared memory) in its SASS."""
    import dataclasses

    import torch

    from impls.cutile import aot, spills
    from impls.cutile.common import ArraySpec, KernelCall

    if case in ADD_GRIDS:
        f32 = ArraySpec(torch.float32, 2)
        call = KernelCall(ct.kernel(add_one, num_ctas=ctas), (*ADD_GRIDS[case], 1), (f32, f32, 64))
    elif case == "matmul":
        bf = ArraySpec(torch.bfloat16, 2)
        call = KernelCall(ct.kernel(matmul, num_ctas=ctas), (8, 8, 1), (bf, bf, bf, 128, 128, 64, 16))
    else:
        from impls.cutile.switches import CutileSwitches

        sw = CutileSwitches(**(switches or {}))
        cfg = spills.resolved_config(case, "S1", switches=sw)
        call = aot.build_call(case, torch.bfloat16, sw, dims=spills.shape_dims("S1"), config=cfg,
                              optional=False, d_mode=spills.HEADLINE_D_MODE)
        call = dataclasses.replace(call, kernel=ct.kernel(call.kernel._pyfunc, occupancy=cfg.get("occupancy") or None,
                                                          num_ctas=ctas))
    cubin = aot.export(call, "sm_90")
    ops = aot.opcodes(aot.sass(cubin))
    usage = aot.resource_usage(cubin)
    return {"registers": usage["REG"], "stack_bytes": usage["STACK"], "smem_bytes": usage["SHARED"],
            "ldl": sum(v for k, v in ops.items() if k.startswith("LDL")),
            "stl": sum(v for k, v in ops.items() if k.startswith("STL")),
            "tma_multicast": sum(v for k, v in ops.items() if "MULTICAST" in k),
            "cluster_barriers": sum(v for k, v in ops.items() if k.startswith("UCGABAR")),
            "generic_u16": sum(v for k, v in ops.items() if k in ("LD.E.U16", "ST.E.U16")),
            "hgmma": sorted({k for k in ops if k.startswith("HGMMA")})}


def child(case: str, ctas: int, compile_only: bool, shape: str = "S1", switches: dict | None = None) -> int:
    row = {"case": case, "num_ctas": ctas, "shape": None if case in SMALL else shape,
           "switches": None if case in SMALL else (switches or {})}
    try:
        if case in SMALL or shape == "S1":  # the compile facts are read at the S1 record
            row.update(compile_facts(case, ctas, None if case in SMALL else switches))
        if not compile_only:
            row.update(run_small(case, ctas) if case in SMALL else run_stage(case, ctas, shape, switches))
    except Exception as exc:  # the probe's answer is the error itself
        row.update(ok=False, error=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc()[-2000:])
    print("PROBE " + json.dumps(row, default=str), flush=True)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/scratch/num_ctas")
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    ap.add_argument("--ctas", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--shape", default="S1", help="the stage cases' shape: a preset or B,L,H,P,G,N,C")
    ap.add_argument("--switches", default="", help="cuTile switches for the stage cases, name=value[,...] (e.g. "
                    "heads_per_tile=1,occupancy=2: the fallback tiles)")
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--child", nargs=2, metavar=("CASE", "CTAS"), help=argparse.SUPPRESS)
    ap.add_argument("--timeout", type=float, default=240)
    args = ap.parse_args(argv)
    from experiments.host_profile import parse_switches

    switches = parse_switches(args.switches)  # a bad item fails here, before any case runs
    if args.child:
        return child(args.child[0], int(args.child[1]), args.compile_only, args.shape, switches)
    probe_shape(args.shape)  # a bad --shape fails here, before any case runs
    if switches:
        from impls.cutile.switches import CutileSwitches

        CutileSwitches(**switches)  # an unknown switch fails here too
    os.makedirs(args.out, exist_ok=True)
    # each row written as its case ends: a parent cut off by the device call's limit keeps the cases it ran
    out = open(os.path.join(args.out, "num_ctas_probe.jsonl"), "w")
    for case in args.cases:
        for ctas in args.ctas:
            cmd = [sys.executable, "-m", "experiments.num_ctas_probe", "--child", case, str(ctas),
                   "--shape", args.shape, "--switches", args.switches]
            if args.compile_only:
                cmd.append("--compile-only")
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
                lines = [ln[6:] for ln in done.stdout.splitlines() if ln.startswith("PROBE ")]
                row = json.loads(lines[-1]) if lines else {"case": case, "num_ctas": ctas, "shape": args.shape,
                                                            "ok": False,
                                                            "error": f"exit {done.returncode}: {done.stderr[-1500:]}"}
                row["exit_code"] = done.returncode
            except subprocess.TimeoutExpired:
                row = {"case": case, "num_ctas": ctas, "shape": args.shape, "ok": False,
                       "error": f"timed out after {args.timeout} s"}
            print(json.dumps({k: v for k, v in row.items() if k != "trace"}), flush=True)
            out.write(json.dumps(row, default=str) + "\n")
            out.flush()
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
