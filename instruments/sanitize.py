"""compute-sanitizer (memcheck, racecheck) over one call of every cuTile and Triton stage at two shapes, and over
the forward with each fused arrangement (FUSED).

    python -m instruments.sanitize [--tools memcheck racecheck] [--backends cutile triton] [--out DIR]

Each (tool, backend, shape, stage) runs in its own process under `compute-sanitizer --tool <tool>`: the target
process builds the stage's inputs with the backend's own earlier stages, then counts the kernel launches of the
stage call alone (Triton's launch hook, cuTile's `launch`), which must not be zero — a check that launched
nothing proves nothing. The sanitizer's "ERROR SUMMARY" is parsed. A negative control, a Triton kernel that
writes past the end of its buffer, runs through the same path and must be flagged by memcheck; if it is not,
the whole check fails. Prints a table, writes it as CSV under --out, exits 1 on any error, a zero launch count or
an unflagged control.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

SHAPES = {  # (batch, seqlen, nheads, headdim, ngroups, dstate, chunk): a ragged last chunk; a full-size head
    "ragged": (2, 1000, 8, 64, 2, 64, 256),
    "d128": (1, 4096, 16, 64, 1, 128, 256),
}
STAGES = ("chunk_cumsum", "fwd_pass_state", "compute_out")
# the fused arrangements (stages 2 and 3 in one kernel whose programs hand the state on through flags), checked as
# the whole forward (impls.ssd_forward) with their switches: each backend's default fused program, and 'chunk'
FUSED = {"fused": {"fuse_state_out": True}, "fused_chunk": {"fuse_state_out": True, "fused_program": "chunk"}}
# memcheck ends with "ERROR SUMMARY: N errors"; racecheck with "RACECHECK SUMMARY: H hazards displayed (N errors,
# W warnings)" (seen on the H200, compute-sanitizer of CUDA 13.0)
SUMMARY = re.compile(r"ERROR SUMMARY:\s+(\d+)\s+error|RACECHECK SUMMARY:\s+\d+\s+hazards? displayed\s+\((\d+)\s+error")
LAUNCHES = re.compile(r"^LAUNCHES (\d+)$", re.M)


# --- the target process -----------------------------------------------------------------------------------
class LaunchCounter:
    """Counts kernel launches from Triton (launch hook) and cuTile (its `launch` function) while active."""

    def __init__(self):
        self.count = 0
        self.active = False

    def install(self):
        import triton

        triton.knobs.runtime.launch_enter_hook.add(self._hook)
        try:
            import cuda.tile as ct

            real = ct.launch

            def counted(*args, **kwargs):
                self._hook()
                return real(*args, **kwargs)

            ct.launch = counted  # impls/cutile/common.py launches through the module attribute
        except ImportError:
            pass
        return self

    def _hook(self, *args, **kwargs):
        if self.active:
            self.count += 1


def run_target(backend_name: str, stage: str, shape_name: str) -> None:
    import torch

    import impls
    from impls.inputs import make_inputs
    from impls.problem import Problem, Shape

    counter = LaunchCounter().install()
    if backend_name == "oob-control":
        count_oob_control(counter)
        return
    backend = impls.get_backend(backend_name, **FUSED.get(stage, {}))
    inputs = make_inputs(Problem(Shape(*SHAPES[shape_name])), device="cuda", seed=0)
    dt, dA = backend.chunk_cumsum(inputs.dt, inputs.A, inputs.chunk_size, inputs.dt_bias, inputs.dt_softplus,
                                  inputs.dt_limit)
    states, _ = backend.fwd_pass_state(inputs.B, inputs.x, dt, dA, None, None, None)
    calls = {
        "chunk_cumsum": lambda: backend.chunk_cumsum(inputs.dt, inputs.A, inputs.chunk_size, inputs.dt_bias,
                                                     inputs.dt_softplus, inputs.dt_limit),
        "fwd_pass_state": lambda: backend.fwd_pass_state(inputs.B, inputs.x, dt, dA, None, None, None),
        "compute_out": lambda: backend.compute_out(inputs.C, inputs.B, inputs.x, dt, dA, states, inputs.D, None,
                                                   None),
        **{name: lambda: impls.ssd_forward(**inputs.forward_kwargs(), backend=backend) for name in FUSED},
    }
    torch.cuda.synchronize()
    counter.active = True
    calls[stage]()
    torch.cuda.synchronize()
    counter.active = False
    print(f"LAUNCHES {counter.count}", flush=True)


def count_oob_control(counter) -> None:
    """A kernel that writes 4096 elements past the end of a 1024-element buffer."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def write_past_end(ptr, n, BLOCK: tl.constexpr):
        offsets = tl.arange(0, BLOCK) + n  # deliberately unmasked and out of bounds
        tl.store(ptr + offsets, tl.zeros((BLOCK,), dtype=tl.float32))

    buf = torch.empty(1024, device="cuda")
    counter.active = True
    write_past_end[(1,)](buf, 1024 * 1024, BLOCK=4096)
    torch.cuda.synchronize()
    counter.active = False
    print(f"LAUNCHES {counter.count}", flush=True)


# --- the driver ---------------------------------------------------------------------------------------------
def sanitizer() -> str:
    found = shutil.which("compute-sanitizer")
    toolkit = Path("/usr/local/cuda")
    for candidate in (found, toolkit / "bin/compute-sanitizer", toolkit / "compute-sanitizer/compute-sanitizer"):
        if candidate and Path(candidate).exists():
            return str(candidate)
    raise SystemExit("compute-sanitizer not found (it ships with the CUDA toolkit)")


def check(tool: str, backend: str, stage: str, shape: str, timeout: int) -> dict:
    cmd = [sanitizer(), "--tool", tool, "--target-processes", "all", sys.executable, "-m", "instruments.sanitize",
           "--target", backend, stage, shape]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=os.environ)
        out = res.stdout + res.stderr
    except subprocess.TimeoutExpired as exc:
        out = f"timeout after {timeout} s: {exc}"
    summary = SUMMARY.search(out)
    launches = LAUNCHES.search(out)
    return {"tool": tool, "backend": backend, "stage": stage, "shape": shape,
            "launches": int(launches.group(1)) if launches else 0,
            "errors": int(summary.group(1) or summary.group(2)) if summary else -1,  # -1: no summary (it died)
            "tail": out[-400:].replace("\n", " | ")}


def verdict(row: dict) -> str:
    if row["backend"] == "oob-control":
        return "ok (flagged)" if row["errors"] > 0 else "FAIL: control not flagged"
    if row["launches"] == 0:
        return "FAIL: no launch"
    return "ok" if row["errors"] == 0 else "FAIL"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", nargs=3, metavar=("BACKEND", "STAGE", "SHAPE"), help=argparse.SUPPRESS)
    parser.add_argument("--tools", nargs="+", default=["memcheck", "racecheck"])
    parser.add_argument("--backends", nargs="+", default=["cutile", "triton"])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--out", default="results/scratch/sanitize")
    parser.add_argument("--timeout", type=int, default=300)
    parser.add_argument("--jobs", type=int, default=1, help="sanitizer processes at once (they share the GPU)")
    args = parser.parse_args(argv)
    if args.target:
        run_target(*args.target)
        return 0
    jobs = [("memcheck", "oob-control", "write_past_end", "-")] + [
        (tool, backend, stage, shape)
        for tool, backend, shape, stage in itertools.product(args.tools, args.backends, args.shapes,
                                                             (*STAGES, *FUSED))]
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:  # each job is its own sanitizer process
        rows = list(pool.map(lambda job: check(*job, args.timeout), jobs))
    for row in rows:
        row["verdict"] = verdict(row)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "sanitize.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"{'tool':10} {'backend':12} {'shape':7} {'stage':15} {'launches':>8} {'errors':>6}  verdict")
    for r in rows:
        print(f"{r['tool']:10} {r['backend']:12} {r['shape']:7} {r['stage']:15} {r['launches']:8d} "
              f"{r['errors']:6d}  {r['verdict']}")
    return 0 if all(r["verdict"].startswith("ok") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
