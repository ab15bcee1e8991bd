"""Where the host's time goes in one forward: `python -m instruments.host_profile [--backends cutile,triton]
[--shape B,L,H,P,G,N,Q] [--calls 300] [--dtype bfloat16] [--top 25] [--switches name=value,...]`.

For each backend, on the headline problem (dt_bias, softplus, D per head, no z), after a warm-up that compiles and
resolves tuning, it prints: the host time of one call through the public entry (`impls.ssd_forward(...,
backend=<built>)`) and of the backend's own `ssd_forward` (what the harness timed before it went through the public
entry), each with the device synchronised before the call (medians of ABBA-ordered calls, µs); the rate of
back-to-back public calls (µs per call over `calls` calls, then one synchronisation: what an eager timing loop
measures when the host is slower than the kernels); and the functions that take the host's time (cProfile of
`calls` public calls, sorted by own time).

It uses only `impls.get_backend`, `impls.ssd_forward` and the backend's `ssd_forward`, so it also runs against an
older tree: `PYTHONPATH=<that tree> python <this tree>/instruments/host_profile.py`, from inside that tree (its
tuning records are read from the working directory).
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    # run as a file, the folder of this file comes first on sys.path, and its profile.py would hide the standard
    # library's (which cProfile imports)
    sys.path.pop(0)

import argparse  # noqa: E402
import cProfile  # noqa: E402
import io  # noqa: E402
import pstats  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

S4 = (16, 2048, 32, 64, 1, 64, 128)


def headline_inputs(shape, dtype, device):
    """Random inputs of the headline problem, as the harness's `headline` problem defines it."""
    batch, seqlen, nheads, headdim, ngroups, dstate, _ = shape
    gen = torch.Generator(device=device).manual_seed(0)

    def rnd(*s, scale=1.0):
        return (torch.randn(*s, generator=gen, device=device) * scale).to(dtype)

    x = rnd(batch, seqlen, nheads, headdim)
    dt = torch.rand(batch, seqlen, nheads, generator=gen, device=device).to(dtype) - 2.0
    A = -torch.rand(nheads, generator=gen, device=device) - 0.5
    B = rnd(batch, seqlen, ngroups, dstate, scale=0.5)
    C = rnd(batch, seqlen, ngroups, dstate, scale=0.5)
    D = torch.randn(nheads, generator=gen, device=device)
    dt_bias = torch.rand(nheads, generator=gen, device=device) - 1.0
    return x, dt, A, B, C, D, dt_bias


def calls_of(backend, shape, inputs):
    """(public call, the backend's own call) with the same arguments."""
    import impls

    x, dt, A, B, C, D, dt_bias = inputs
    chunk = shape[-1]

    def public():
        return impls.ssd_forward(x, dt, A, B, C, chunk, D=D, dt_bias=dt_bias, dt_softplus=True, backend=backend)

    def own():
        return backend.ssd_forward(x, dt, A, B, C, chunk, D, None, dt_bias, None, None, None, True,
                                   (0.0, float("inf")), None)

    return public, own


def synced_host_us(fn) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e6


def abba_host_us(first, second, calls: int) -> tuple[float, float]:
    a, b = [], []
    for _ in range(max(1, calls // 2)):
        a.append(synced_host_us(first))
        b.append(synced_host_us(second))
        b.append(synced_host_us(second))
        a.append(synced_host_us(first))
    return statistics.median(a), statistics.median(b)


def back_to_back_us(fn, calls: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e6 / calls


def profile_text(fn, calls: int, top: int) -> str:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def parse_switches(text: str) -> dict:
    """"tma=true,tma_descriptors=host" -> {"tma": True, "tma_descriptors": "host"} (values read as YAML scalars)."""
    import yaml

    out = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, eq, value = item.partition("=")
        if not eq or not name.strip() or not value.strip():
            raise ValueError(f"--switches: expected name=value items separated by commas, got {item!r}")
        out[name.strip()] = yaml.safe_load(value)
    return out


def report(name: str, backend, shape, dtype, calls: int, top: int, switches: dict | None = None) -> None:
    """Host times and the profile of `backend` (built as `name` with `switches`)."""
    public, own = calls_of(backend, shape, headline_inputs(shape, dtype, torch.device("cuda")))
    for _ in range(20):
        public()
        own()
    torch.cuda.synchronize()
    host_public, host_own = abba_host_us(public, own, calls)
    print(f"== {name} shape={shape} {dtype}" + (f" switches {switches}" if switches else ""))
    print(f"host µs per call, device synchronised before each (median of {calls}): public {host_public:.1f}, "
          f"backend's own {host_own:.1f}, difference {host_public - host_own:.1f}")
    print(f"back-to-back public calls: {back_to_back_us(public, calls):.1f} µs per call; backend's own: "
          f"{back_to_back_us(own, calls):.1f}")
    print(profile_text(public, calls, top))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="cutile,triton")
    parser.add_argument("--shape", default=",".join(map(str, S4)), help="batch,seqlen,nheads,headdim,ngroups,dstate,"
                        "chunk_size")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--switches", default="", help="switches for every backend named (each must have them), "
                        "e.g. --backends triton --switches tma=true,tma_descriptors=host,state_pass=serial")
    args = parser.parse_args(argv)
    try:
        switches = parse_switches(args.switches)
    except ValueError as exc:
        parser.error(str(exc))
    shape = tuple(int(v) for v in args.shape.split(","))
    if len(shape) != 7:
        parser.error(f"--shape: expected 7 integers (batch,seqlen,nheads,headdim,ngroups,dstate,chunk_size), got "
                     f"{args.shape}")
    if args.calls < 2:
        parser.error(f"--calls: expected at least 2, got {args.calls}")
    if not torch.cuda.is_available():
        raise SystemExit("instruments.host_profile: needs a CUDA device (it times kernel launches)")
    names = [name.strip() for name in args.backends.split(",")]
    import impls

    backends = []
    for name in names:  # every backend built with the switches before any is profiled
        try:
            backends.append((name, impls.get_backend(name, **switches)))
        except (ValueError, impls.BackendUnavailable) as exc:
            parser.error(str(exc))
    for name, backend in backends:
        report(name, backend, shape, getattr(torch, args.dtype), args.calls, args.top, switches)


if __name__ == "__main__":
    main()
