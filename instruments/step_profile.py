"""Where a language-model step's time goes: the torch profiler over a few prefill or training steps of
models/mamba2_lm.py, split into the SSD's forward (a profiler range around every `impls.ssd` call), the SSD's backward
(the autograd node of impls/autograd.py) and the rest; the SSD's share, with which analysis/end_to_end.py predicts the
end-to-end speedup a faster SSD gives.

    python -m instruments.step_profile --backends triton,mamba_ssm --shape mamba2_130m --seqlen 512 \
        --directions forward,train_step [--n-layer 2] [--batch 1] [--steps 5] [--glue torch] [--compile default] \
        [--out lm.step_profile.parquet]

On CUDA the times are the kernels' device time (every kernel the profiler saw, per step); on the CPU they are the
ranges' host time, which includes the Python between kernels. One row per (backend, direction), with the card and the
packages' versions (harness/provenance.py), in a table of its own: --out ends with SUFFIX, which the results store
skips (harness/store.py OTHER_TABLES) and analysis/end_to_end.py `load_step_profiles` reads beside the rows."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

import impls

SSD_RANGE = "ssd.forward"
SSD_BACKWARD_NODE = "_SSDBackward"  # impls/autograd.py's Function, as autograd names its node
DIRECTIONS = ("forward", "train_step")
SUFFIX = ".step_profile.parquet"


@dataclass(frozen=True)
class StepProfile:
    """Per step, in milliseconds: all the step's time, the SSD's forward calls and backward; `share` =
    (ssd_forward + ssd_backward) / total; `clock`: "device" (CUDA kernels) or "host" (CPU ranges)."""

    total_ms: float
    ssd_forward_ms: float
    ssd_backward_ms: float
    share: float
    steps: int
    clock: str


@contextlib.contextmanager
def ssd_ranges() -> Iterator[None]:
    """Every `impls.ssd` call inside a profiler range named SSD_RANGE (models/mamba2.py calls it as `impls.ssd`)."""
    original = impls.ssd

    def marked(*args, **kwargs):
        with record_function(SSD_RANGE):
            return original(*args, **kwargs)

    impls.ssd = marked
    try:
        yield
    finally:
        impls.ssd = original


def _device_us(event) -> float:
    # torch >= 2.4 names it device_time_total; older releases cuda_time_total
    return float(getattr(event, "device_time_total", getattr(event, "cuda_time_total", 0.0)))


def outermost(events, matches) -> list:
    """The events that `matches` and have no ancestor (cpu_parent chain) that matches too: the autograd node can be
    recorded twice, nested (the engine's evaluate_function and the node's own range, e.g. once torch.compile has run
    in the process), and each must count once."""
    def nested(event) -> bool:
        parent = event.cpu_parent
        while parent is not None:
            if matches(parent):
                return True
            parent = parent.cpu_parent
        return False

    return [e for e in events if matches(e) and not nested(e)]


def split(events, clock: str, steps: int, step_range: str) -> StepProfile:
    """The SSD's forward, its backward and the whole of `steps` steps from the profiler's events (not averaged).

    On the device clock the whole is the device time under every top-level event: the `step_range` ranges and, for
    a training step, the autograd engine's nodes, which run on a thread of their own outside those ranges."""
    def time_of(event) -> float:
        return _device_us(event) if clock == "device" else float(event.cpu_time_total)

    if clock == "device":
        whole = sum(time_of(e) for e in events if e.cpu_parent is None)
    else:
        whole = sum(time_of(e) for e in events if e.name == step_range)
    forward = sum(time_of(e) for e in outermost(events, lambda e: e.name == SSD_RANGE))
    backward = sum(time_of(e) for e in outermost(events, lambda e: e.name.endswith(SSD_BACKWARD_NODE)))
    per = 1e-3 / steps
    share = (forward + backward) / whole if whole > 0 else float("nan")
    return StepProfile(whole * per, forward * per, backward * per, share, steps, clock)


def profile_step(step: Callable[[], object], device: torch.device, steps: int = 5, warmup: int = 2) -> StepProfile:
    """`step` (one prefill or training step) profiled over `steps` calls after `warmup` unprofiled ones."""
    if steps < 1 or warmup < 0:
        raise ValueError(f"steps: expected >= 1 (and warmup >= 0), got steps={steps}, warmup={warmup}")
    cuda = device.type == "cuda"
    with ssd_ranges():
        for _ in range(warmup):
            step()
        if cuda:
            torch.cuda.synchronize(device)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=activities) as prof:
            for _ in range(steps):
                with record_function("step"):
                    step()
            if cuda:
                torch.cuda.synchronize(device)
    return split(prof.events(), "device" if cuda else "host", steps, "step")


def lm_step(backend: str, shape_name: str, direction: str, *, seqlen: int | None = None, batch: int | None = None,
            n_layer: int | None = None, dtype: str = "bfloat16", device: str | None = None, seed: int = 0,
            glue: str = "torch", compile: str | None = None, autocast: bool = False):
    """A model of the shape's sizes (conf/shape/<name>.yaml) on `backend` and a zero-argument call of one step of
    `direction`, as the mamba2_lm workload builds and times them (harness/workloads/mamba2_lm.py: its options
    `glue`, `compile` and `autocast`, checked as it checks them)."""
    from harness.workloads.mamba2_lm import (
        ADAMW,
        OPTIONS,
        LMInputs,
        adamw_step,
        autocast_dtype,
        compiled,
        lm_config,
        parameter_dtype,
    )
    from impls.cli import load_shape
    from impls.problem import Problem
    from models.mamba2_lm import Mamba2LM

    if direction not in DIRECTIONS:
        raise ValueError(f"direction: expected one of {DIRECTIONS}, got {direction!r}")
    shape = load_shape(shape_name)
    shape = dataclasses.replace(shape, **{k: v for k, v in (("seqlen", seqlen), ("batch", batch)) if v is not None})
    problem = Problem(shape, dtype=dtype)
    options = {**OPTIONS, "n_layer": n_layer, "glue": glue, "compile": compile, "autocast": autocast}
    config = lm_config(problem, options)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.manual_seed(seed)
    model = compiled(Mamba2LM(config, backend, device=str(dev), dtype=parameter_dtype(problem, options), glue=glue),
                     options)
    ids = torch.randint(0, config.vocab_size, (shape.batch, shape.seqlen), device=dev)
    inputs = LMInputs(model, ids, autocast_dtype(problem, options))
    if direction == "forward":
        def step():
            with torch.inference_mode(), inputs.precision():
                return model(ids)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), **ADAMW)

        def step():
            adamw_step(model, ids, optimizer, inputs.precision)
    return step, dev, shape


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="triton", help="comma-separated backends")
    parser.add_argument("--shape", default="mamba2_130m", help="a conf/shape/ name")
    parser.add_argument("--seqlen", type=int, default=None)
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--n-layer", type=int, default=None)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--directions", default="forward,train_step")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--glue", default="torch", help="the conv's and norm's form (models/glue.py)")
    parser.add_argument("--compile", default=None, help="a torch.compile mode for the model's call (default: eager)")
    parser.add_argument("--autocast", action="store_true",
                        help="mixed precision: float32 parameters, the forward under torch.autocast in --dtype")
    parser.add_argument("--out", default=None, help=f"a Parquet file for the rows, its name ending {SUFFIX}")
    args = parser.parse_args(argv)
    if args.out and not args.out.endswith(SUFFIX):
        parser.error(f"--out: expected a name ending {SUFFIX} (a table of its own beside result rows, which the "
                     f"results store skips), got {args.out!r}")
    rows = []
    for backend in args.backends.split(","):
        for direction in args.directions.split(","):
            step, dev, shape = lm_step(backend, args.shape, direction, seqlen=args.seqlen, batch=args.batch,
                                       n_layer=args.n_layer, dtype=args.dtype, glue=args.glue, compile=args.compile,
                                       autocast=args.autocast)
            result = profile_step(step, dev, steps=args.steps)
            row = {"backend": backend, "direction": direction, "shape": args.shape, "dtype": args.dtype,
                   **{f: getattr(shape, f) for f in ("batch", "seqlen", "nheads", "headdim", "ngroups", "dstate",
                                                     "chunk_size")},
                   "n_layer": args.n_layer, "glue": args.glue, "compile": args.compile, "autocast": args.autocast,
                   **asdict(result)}
            print(", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                  flush=True)
            rows.append(row)
    if args.out:
        import pandas as pd

        from harness.provenance import collect

        provenance = collect(dev)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(args.out).with_suffix(".partial")
        pd.DataFrame([{**provenance, **row} for row in rows]).to_parquet(tmp)
        tmp.replace(args.out)  # whole or not at all
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
