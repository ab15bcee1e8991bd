"""Writes impls/triton/switch_launch_effects.json: for every stage of the forward and each code switch of the Triton
backend turned away from its default alone, whether the stage's kernel launches change, with the rows in the layout of
impls/cutile/switch_sass_effects.json ({"rows": [{"stage", "dtype", "switch", "arch", "effect"}]}) so that the analysis
(`analysis.switches.noop_table`) reads both backends' tables alike.

Triton generates a kernel's code from its source, its constexprs, the types of its arguments and its launch options.
So a stage whose launches are the same with and without the switch — the same kernels, grids, constexprs, launch
options and argument types, shapes and strides, at the fallback configuration — runs the same code either way:
"no-op on sm_90 (same launches)". Nothing is compiled or run: the launches are recorded on CPU tensors
(`launcher.launch` replaced while the stage runs), in seconds. Switches that change only the host path
(launch_path) or whole arrangements (fuse_state_out, fused_program) are left out, so the analysis never calls their
timing differences noise.
Run: `python -m instruments.triton.switch_effects` (tests/instruments/test_switch_effects.py checks that the file is
current).
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from impls.triton.tune import AWAY
from impls.triton.tune import LAUNCH_EFFECTS as PATH
from instruments.intercept import backend_launches

STAGES = ("chunk_cumsum", "fwd_pass_state", "compute_out")
DTYPES = ("bfloat16", "float32")
# the headline problem's layout, small: 80 heads of one group, headdim 64, dstate 128, chunk 256, two chunks
DIMS = {"batch": 1, "seqlen": 512, "nheads": 80, "headdim": 64, "ngroups": 1, "dstate": 128, "chunk": 256}


def _arg_key(value):
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), tuple(value.shape), tuple(value.stride()))
    if isinstance(value, (int, float, bool, str, type(None))):
        return value
    if isinstance(value, (tuple, list)):
        return tuple(_arg_key(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _arg_key(v)) for k, v in value.items()))
    if hasattr(value, "__dict__"):  # e.g. a host-built tensor descriptor: its public fields
        return (type(value).__name__, _arg_key({k: v for k, v in vars(value).items() if not k.startswith("_")}))
    return (type(value).__name__, repr(value))


def _kernel_name(kernel) -> str:
    fn = getattr(kernel, "fn", kernel)
    return f"{getattr(fn, '__module__', '')}.{getattr(fn, '__name__', repr(fn))}"


def recorded_launches(into: list):
    """Within: the backend's launches recorded into `into` instead of run, as (kernel, grid, arguments, constexprs
    and launch options); the host path (`path`) and the labels (`what`) are left out: they do not change the code."""

    def record(kernel, grid, *args, path, **kwargs):
        into.append((_kernel_name(kernel), tuple(grid), _arg_key(args), _arg_key(kwargs)))

    return backend_launches("triton", record)


def _operands(dtype: torch.dtype) -> dict:
    g = torch.Generator().manual_seed(0)
    b, L, h, p, ng, n, chunk = (DIMS[k] for k in ("batch", "seqlen", "nheads", "headdim", "ngroups", "dstate",
                                                   "chunk"))
    nchunks = -(-L // chunk)

    def rand(*shape, dt=dtype):
        return torch.randn(*shape, generator=g).to(dt)

    return {"x": rand(b, L, h, p), "dt": rand(b, L, h).abs(), "A": -rand(h, dt=torch.float32).abs(),
            "B": rand(b, L, ng, n), "C": rand(b, L, ng, n), "D": rand(h, dt=torch.float32),
            "dt_bias": rand(h, dt=torch.float32), "dt_c": rand(b, h, nchunks, chunk, dt=torch.float32).abs(),
            "dA": -rand(b, h, nchunks, chunk, dt=torch.float32).abs().cumsum(-1),
            "states": rand(b, nchunks, h, p, n)}


def stage_launches(stage: str, dtype: str, **switches) -> list:
    """The launches of one stage of the Triton backend with these switches (tuning: the fallback). The backend is
    built without the availability check (no GPU, no interpreter needed: nothing runs)."""
    from impls.registry import backend_class, make_switches

    cls = backend_class("triton")
    backend = cls(make_switches("triton", cls.Switches, cls.CANNOT_EXPRESS, None, {"tuning": "fallback", **switches}))
    o = _operands(getattr(torch, dtype))
    launches: list = []
    with recorded_launches(launches):
        if stage == "chunk_cumsum":
            backend.chunk_cumsum(o["dt"], o["A"], DIMS["chunk"], o["dt_bias"], True, (0.0, float("inf")))
        elif stage == "fwd_pass_state":
            backend.fwd_pass_state(o["B"], o["x"], o["dt_c"], o["dA"], None, None, o["x"].dtype)
        else:
            states = o["states"]
            if backend.switches.transposed_layout:  # the layout stage 2 stores with the switch (dstate-major)
                states = states.transpose(-1, -2).contiguous().transpose(-1, -2)
            backend.compute_out(o["C"], o["B"], o["x"], o["dt_c"], o["dA"], states, o["D"], None, None)
    if not launches:
        raise RuntimeError(f"triton {stage} ({dtype}) launched nothing: the recorder missed its launches")
    return launches


def effect(stage: str, dtype: str, name: str, defaults: list | None = None) -> dict:
    """The row of `name` at `stage`; `defaults`: the stage's launches at the default switches, if already recorded.
    A switch that needs others away from their defaults (decay_single: decay_factor on) is compared with them set."""
    from impls.triton.switches import TritonSwitches

    needs = {k: v for k, v in TritonSwitches.__dataclass_fields__[name].metadata.get("needs", {}).items()
             if getattr(TritonSwitches(), k) != v}
    if defaults is None or needs:
        defaults = stage_launches(stage, dtype, **needs)
    same = defaults == stage_launches(stage, dtype, **needs, **{name: AWAY[name]})
    return {"stage": stage, "dtype": dtype, "switch": name, "arch": "sm_90",
            "effect": "no-op on sm_90 (same launches)" if same else "changes the launches"}


def table() -> dict:
    return {"generated_by": "python -m instruments.triton.switch_effects",
            "rows": [row for dtype in DTYPES for stage in STAGES
                     for row in _stage_rows(stage, dtype, stage_launches(stage, dtype))]}


def _stage_rows(stage: str, dtype: str, defaults: list) -> list[dict]:
    return [effect(stage, dtype, name, defaults) for name in AWAY]


def main(argv=None) -> int:
    argparse.ArgumentParser(prog="python -m instruments.triton.switch_effects",
                            description=f"Records each stage's launches with each code switch turned away from its "
                                        f"default and rewrites {PATH.name}.").parse_args(argv)
    PATH.write_text(json.dumps(table(), indent=1) + "\n")
    print(f"[switch_effects] {PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
