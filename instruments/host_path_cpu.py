"""The host (Python) cost per call of the public entries and of the cuTile/Triton backends, kernel launches stubbed.

Runs on a CPU machine: CPU tensors of the headline shapes (torch.empty, never touched), the backends' device check
and availability answered yes, every launch replaced by a no-op (cuTile: impls.cutile.common.launch; Triton:
JITFunction.run), so what is timed is the Python before the launches: argument checks, tuning resolution, output
allocation, launch descriptions. Prints µs per call, median of N calls (time.perf_counter), for the backend's
method and for the public entry (impls.<stage>(..., backend=<built backend>)); their difference is the entry's own
layer. Numbers are this machine's, not a GPU host's.

With `--through triton` the Triton launches are not stubbed at Triton's door: the stand-in driver
(instruments/intercept.py) takes the CUDA driver's place, so Triton's own per-launch work (JITFunction.run, the
launcher's descriptor expansion) is timed too, and only the final driver call is left out; the kernels compile for
sm_90 on first use.
`--switches` builds the Triton backend with those switches (the cuTile backend with its defaults).

    python -m instruments.host_path_cpu [--n N] [--through stub|triton] [--backends cutile triton] [--shapes S4 S1]
        [--switches tma=true,tma_descriptors=host,state_pass=serial,launch_path=cached]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import sys
import time

import torch

import impls
from impls import registry
from instruments import intercept

SHAPES = {"S4": (16, 2048, 32, 64, 1, 64, 128), "S1": (8, 4096, 80, 64, 1, 128, 256)}
NO_LIMIT = (0.0, math.inf)


@contextlib.contextmanager
def launches_stubbed(through: str = "stub"):
    """Within: cuTile's launches dropped, Triton's dropped at its door (`stub`: JITFunction.run) or recorded at the
    driver's (`triton`: the stand-in driver), both backends available on the CPU (instruments/intercept.py)."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(intercept.backend_launches("cutile"))
        stack.enter_context(intercept.jit_dropped() if through == "stub" else intercept.stand_in_driver())
        stack.enter_context(intercept.device_answered("cutile", "triton"))
        getattr(registry, "clear_cache", lambda: None)()  # absent in older trees (nothing cached there)
        yield


def inputs(batch, seqlen, nheads, headdim, ngroups, dstate, chunk) -> dict:
    def empty(*shape, dtype=torch.bfloat16):
        return torch.empty(*shape, dtype=dtype)

    nchunks = math.ceil(seqlen / chunk)
    return dict(x=empty(batch, seqlen, nheads, headdim), dt=empty(batch, seqlen, nheads),
                A=empty(nheads, dtype=torch.float32), B=empty(batch, seqlen, ngroups, dstate),
                C=empty(batch, seqlen, ngroups, dstate), D=empty(nheads, dtype=torch.float32),
                dt_bias=empty(nheads, dtype=torch.float32), chunk=chunk,
                dtc=empty(batch, nheads, nchunks, chunk, dtype=torch.float32),
                dA=empty(batch, nheads, nchunks, chunk, dtype=torch.float32))


def calls(be, t) -> tuple[dict, dict]:
    """(public entries, backend methods), stage -> zero-argument call."""
    q = t["chunk"]
    states = be.fwd_pass_state(t["B"], t["x"], t["dtc"], t["dA"], None, None, None)[0]  # in the backend's layout
    public = {
        "chunk_cumsum": lambda: impls.chunk_cumsum(t["dt"], t["A"], q, t["dt_bias"], True, backend=be),
        "fwd_pass_state": lambda: impls.fwd_pass_state(t["B"], t["x"], t["dtc"], t["dA"], backend=be),
        "compute_out": lambda: impls.compute_out(t["C"], t["B"], t["x"], t["dtc"], t["dA"], states, t["D"],
                                                 backend=be),
        "ssd_forward": lambda: impls.ssd_forward(t["x"], t["dt"], t["A"], t["B"], t["C"], q, t["D"],
                                                 dt_bias=t["dt_bias"], dt_softplus=True, backend=be),
    }
    backend = {
        "chunk_cumsum": lambda: be.chunk_cumsum(t["dt"], t["A"], q, t["dt_bias"], True, NO_LIMIT),
        "fwd_pass_state": lambda: be.fwd_pass_state(t["B"], t["x"], t["dtc"], t["dA"], None, None, None),
        "compute_out": lambda: be.compute_out(t["C"], t["B"], t["x"], t["dtc"], t["dA"], states, t["D"], None, None),
        "ssd_forward": lambda: be.ssd_forward(t["x"], t["dt"], t["A"], t["B"], t["C"], q, t["D"], None,
                                              t["dt_bias"], None, None, None, True, NO_LIMIT, None),
    }
    return public, backend


def median_us(fn, n: int) -> float:
    for _ in range(50):
        fn()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main(argv: list[str] | None = None) -> None:
    from instruments.host_profile import parse_switches

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="timed calls per point (median)")
    parser.add_argument("--through", choices=("stub", "triton"), default="stub",
                        help="stub: JITFunction.run replaced by a no-op; triton: Triton's launch path runs, the "
                             "driver call recorded (instruments/intercept.py)")
    parser.add_argument("--backends", nargs="+", choices=("cutile", "triton"), default=["cutile", "triton"])
    parser.add_argument("--shapes", nargs="+", choices=tuple(SHAPES), default=list(SHAPES))
    parser.add_argument("--switches", default="", help="Triton switches, name=value[,name=value...]")
    args = parser.parse_args(argv)
    switches = parse_switches(args.switches)  # a bad item fails here, before anything is built
    if args.through == "triton" and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        parser.error("--through triton compiles real kernels: unset TRITON_INTERPRET")
    with launches_stubbed(args.through):
        built = {name: impls.get_backend(name, **(switches if name == "triton" else {})) for name in args.backends}
        for shape in args.shapes:
            t = inputs(*SHAPES[shape])
            for name, be in built.items():
                public, backend = calls(be, t)
                for stage in public:
                    b, p = median_us(backend[stage], args.n), median_us(public[stage], args.n)
                    print(f"{shape} {name:7s} {stage:15s} backend {b:7.1f}  public {p:7.1f}  entry {p - b:6.1f} µs")


if __name__ == "__main__":
    main(sys.argv[1:])
