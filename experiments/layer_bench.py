"""`python -m experiments.layer_bench --backends triton,cutile,mamba_ssm --shape mamba2_2p7b` — the whole Mamba-2
layer (models/mamba2.py) per SSD backend, and the SSD's share of it.

Per backend: the layer built with the same parameters (one seed) and the backend's switches (`--switch
triton.tma=True`); a correctness gate at a small size first (batch 1, `--gate-seqlen` tokens, fresh inputs): the
layer's output and final states against the float64 reference of the block (models/mamba2_reference.py, the SSD
stepped sequentially), outputs NaN-poisoned, relative error (whole tensor and every (batch, chunk) block) within the
tolerance table's entry for the dtype (tf32's where the backend reports tf32 matmuls); a backend that fails its gate
or cannot run is reported with the reason and not timed. Then, at the shape's size, under torch.inference_mode():
the first call (compilation, tuning) timed apart; the layer's forward and `impls.ssd_forward` alone on the SSD
arguments the layer hands over (the same views of the same projections), each with triton.testing.do_bench(...,
return_mode="median") and the p20/p80 quantiles of the same samples, L2 flushed before every repetition
(experiments/timing.py); share = SSD median / layer median. Without CUDA (`--device cpu`, the Triton interpreter):
wall-clock medians, for trying the script only.

The layer's sizes come from the shape (conf/shape/<name>.yaml): d_model = nheads·headdim / expand, d_state =
dstate, headdim, ngroups, chunk_size; batch and seqlen from the shape unless --batch / --seqlen. Each result is one
printed line and, with --json, one JSON line (the layer's describe(), the timings, the gate's errors and the
provenance of experiments/provenance.py).
"""

from __future__ import annotations

import os

import torch

# Without CUDA the Triton-based backends run in the interpreter; the flag must be set before any @triton.jit.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import argparse  # noqa: E402
import ast  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402

import impls  # noqa: E402
from experiments import provenance, timing  # noqa: E402
from impls.cli import load_shape  # noqa: E402
from impls.problem import DTYPES, Shape  # noqa: E402
from impls.tolerance import poisoned_allocations  # noqa: E402
from models.mamba2 import Mamba2, Mamba2Config  # noqa: E402
from models.mamba2_reference import layer_errors, layer_tolerance, mamba2_float64  # noqa: E402

QUANTILES = (0.2, 0.8)


@dataclass(frozen=True)
class Settings:
    """What the command line asks for, checked."""

    backends: tuple[str, ...]
    shape_name: str
    shape: Shape
    dtype: torch.dtype
    device: torch.device
    expand: int = 2
    switches: dict = field(default_factory=dict)  # backend -> {switch: value}
    gate_seqlen: int = 0  # 0: 2.5 chunks
    seed: int = 0
    warmup_ms: int = 25
    rep_ms: int = 100
    cpu_reps: int = 3
    json_path: str | None = None


@dataclass(frozen=True)
class Gate:
    """The gate's verdict: each error ("out", "out[blocks]", "final_states", ...), the tolerance, and the failures."""

    errors: dict
    tolerance: float

    @property
    def failures(self) -> dict:
        return {name: err for name, err in self.errors.items() if not err <= self.tolerance}


@dataclass(frozen=True)
class LayerTiming:
    """One backend's result: status "ok", "gate-failed" or "refused" (with the reason), and its measurements (ms)."""

    backend: str
    status: str
    reason: str = ""
    describe: dict = field(default_factory=dict)
    gate: Gate | None = None
    timer: str = ""
    first_call_s: float = math.nan
    layer: dict = field(default_factory=dict)  # median_ms, p20_ms, p80_ms
    ssd: dict = field(default_factory=dict)

    @property
    def ssd_share(self) -> float:
        if not self.layer or not self.ssd:
            return math.nan
        return self.ssd["median_ms"] / self.layer["median_ms"]


def layer_config(shape: Shape, expand: int = 2) -> Mamba2Config:
    """The layer whose SSD has the shape's sizes; ValueError naming --shape when nheads·headdim is not a multiple
    of expand."""
    d_inner = shape.nheads * shape.headdim
    if d_inner % expand:
        raise ValueError(f"--shape: expected nheads·headdim ({d_inner}) a multiple of --expand {expand}")
    return Mamba2Config(d_model=d_inner // expand, d_state=shape.dstate, expand=expand, headdim=shape.headdim,
                        ngroups=shape.ngroups, chunk_size=shape.chunk_size)


def build_layer(settings: Settings, backend: str) -> Mamba2:
    """The layer on `backend` with its switches; the same parameters for every backend (one seed)."""
    with torch.random.fork_rng(devices=[]):  # parameters drawn on the CPU: one seed, the same on every machine
        torch.manual_seed(settings.seed)
        layer = Mamba2(layer_config(settings.shape, settings.expand), backend, settings.switches.get(backend),
                       device="cpu", dtype=settings.dtype)
    return layer.to(settings.device).requires_grad_(False)


def gate(layer: Mamba2, settings: Settings) -> Gate:
    """The layer at batch 1 and the gate's seqlen against the float64 reference, outputs poisoned."""
    c = layer.config
    seqlen = settings.gate_seqlen or (5 * c.chunk_size) // 2
    gen = torch.Generator().manual_seed(settings.seed + 1)
    u = torch.randn(1, seqlen, c.d_model, generator=gen).to(device=settings.device, dtype=settings.dtype)
    with torch.inference_mode():
        expected = mamba2_float64(layer, u)
        with poisoned_allocations():
            got = layer(u, return_final_states=True)
    return Gate(layer_errors(got, expected, c.chunk_size), layer_tolerance(layer, settings.dtype, settings.device))


def measure(fn, settings: Settings) -> dict:
    """median_ms and p20/p80 of `fn`: do_bench on the GPU, wall clock on the CPU."""
    if settings.device.type == "cuda":
        return timing.gpu_times(fn, settings.warmup_ms, settings.rep_ms, False, QUANTILES)
    return timing.cpu_times(fn, 1, settings.cpu_reps, QUANTILES)


def run_backend(settings: Settings, backend: str) -> LayerTiming:
    """Build, gate, then time the layer and its SSD alone. A backend that cannot run is "refused", any other
    exception "failed", a gate over tolerance "gate-failed": each a result with its reason, none of them timed."""
    layer = verdict = None
    try:
        layer = build_layer(settings, backend)
        verdict = gate(layer, settings)
        if verdict.failures:
            return LayerTiming(backend, "gate-failed", f"over tolerance {verdict.tolerance}: {verdict.failures}",
                               layer.describe(), verdict)
        return timed(layer, verdict, settings)
    except (impls.BackendUnavailable, ValueError, NotImplementedError) as exc:
        status = "refused"
        reason = f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # noqa: BLE001 - a backend that crashes is a result; the next backend still runs
        status = "failed"
        reason = f"{type(exc).__name__}: {exc}"
    return LayerTiming(backend, status, reason, layer.describe() if layer is not None else {}, verdict)


def timed(layer: Mamba2, verdict: Gate, settings: Settings) -> LayerTiming:
    """The first call, then the layer's forward and the SSD alone on the arguments the layer hands it."""
    s = settings.shape
    gen = torch.Generator().manual_seed(settings.seed + 2)
    u = torch.randn(s.batch, s.seqlen, layer.config.d_model, generator=gen).to(settings.device, settings.dtype)
    with torch.inference_mode():
        first = timing.first_call(lambda: layer(u), settings.device)
        layer_times = measure(lambda: layer(u), settings)
        call = layer.ssd_call(u)
        ssd_times = measure(lambda: impls.ssd_forward(**call.kwargs, backend=layer.backend), settings)
    timer = "do_bench-median" if settings.device.type == "cuda" else "cpu-wall"
    return LayerTiming(layer.backend.name, "ok", "", layer.describe(), verdict, timer, first, layer_times,
                       ssd_times)


def report_line(settings: Settings, result: LayerTiming) -> str:
    head = f"{result.backend:<10} {settings.shape_name} {str(settings.dtype).replace('torch.', '')}"
    if result.status != "ok":
        return f"{head}  {result.status.upper()}: {result.reason}"
    lt, st = result.layer, result.ssd
    worst = max(result.gate.errors.values())
    return (f"{head}  layer {lt['median_ms']:.4f} ms (p20 {lt['p20_ms']:.4f}, p80 {lt['p80_ms']:.4f})  "
            f"ssd {st['median_ms']:.4f} ms (p20 {st['p20_ms']:.4f}, p80 {st['p80_ms']:.4f})  "
            f"ssd share {result.ssd_share:.1%}  first call {result.first_call_s:.2f} s  "
            f"gate worst {worst:.1e} <= {result.gate.tolerance:g}  [{result.timer}]")


def json_row(settings: Settings, result: LayerTiming, common: dict) -> dict:
    row = dataclasses.asdict(result)
    row.update(ssd_share=result.ssd_share, shape=settings.shape_name, shape_sizes=dataclasses.asdict(settings.shape),
               dtype=str(settings.dtype).replace("torch.", ""), quantiles=list(QUANTILES), **common)
    return row


def parse_switches(items: list[str], backends: tuple[str, ...]) -> dict:
    """["triton.tma=True", ...] -> {"triton": {"tma": True}}; values read as Python literals, else strings."""
    out: dict = {}
    for item in items:
        key, sep, raw = item.partition("=")
        backend, dot, name = key.partition(".")
        if not sep or not dot or not name:
            raise ValueError(f"--switch: expected BACKEND.SWITCH=VALUE, got {item!r}")
        if backend not in backends:
            raise ValueError(f"--switch: backend {backend!r} is not among --backends {list(backends)}")
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw
        out.setdefault(backend, {})[name] = value
    return out


def parse_args(argv=None) -> Settings:
    p = argparse.ArgumentParser(prog="python -m experiments.layer_bench", description=__doc__.splitlines()[0])
    p.add_argument("--backends", required=True, help="comma-separated registered backends, e.g. triton,cutile")
    p.add_argument("--shape", required=True, help="a conf/shape/ name, e.g. mamba2_2p7b")
    p.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch", type=int, default=0, help="overrides the shape's batch")
    p.add_argument("--seqlen", type=int, default=0, help="overrides the shape's seqlen")
    p.add_argument("--expand", type=int, default=2, help="d_inner / d_model (d_model = nheads·headdim / expand)")
    p.add_argument("--switch", action="append", default=[], help="BACKEND.SWITCH=VALUE (repeatable)")
    p.add_argument("--gate-seqlen", type=int, default=0, help="the gate's seqlen (default: 2.5 chunks)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup-ms", type=int, default=25)
    p.add_argument("--rep-ms", type=int, default=100)
    p.add_argument("--cpu-reps", type=int, default=3, help="wall-clock repetitions without CUDA")
    p.add_argument("--json", dest="json_path", help="append one JSON line per backend to this file")
    a = p.parse_args(argv)
    backends = tuple(b for b in a.backends.split(",") if b)
    if not backends:
        raise ValueError("--backends: expected at least one backend name")
    shape = load_shape(a.shape)
    for arg, value in (("--batch", a.batch), ("--seqlen", a.seqlen), ("--gate-seqlen", a.gate_seqlen)):
        if value < 0:
            raise ValueError(f"{arg}: expected >= 0 (0: the default), got {value}")
    shape = dataclasses.replace(shape, batch=a.batch or shape.batch, seqlen=a.seqlen or shape.seqlen)
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device: {a.device} asked for, but torch sees no CUDA device")
    return Settings(backends, a.shape, shape, DTYPES[a.dtype], device, a.expand, parse_switches(a.switch, backends),
                    a.gate_seqlen, a.seed, a.warmup_ms, a.rep_ms, a.cpu_reps, a.json_path)


def main(argv=None) -> list[LayerTiming]:
    settings = parse_args(argv)
    layer_config(settings.shape, settings.expand)  # a shape the layer cannot take stops here, before any backend
    common = provenance.collect(settings.device) if settings.json_path else {}
    results = []
    for backend in settings.backends:
        result = run_backend(settings, backend)
        results.append(result)
        print(report_line(settings, result), flush=True)
        if settings.json_path:
            with open(settings.json_path, "a") as f:
                f.write(json.dumps(json_row(settings, result, common), default=str) + "\n")
    return results


if __name__ == "__main__":
    main()
