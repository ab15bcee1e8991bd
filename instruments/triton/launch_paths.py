"""The Triton backend's two launch paths (switch launch_path) compared without a GPU: the forward on small
problems launched through `kernel[grid](...)` and through the compiled-kernel cache, under the stand-in driver
(instruments/intercept.py: real sm_90 compilation, only the driver call recorded), must hand the driver the same
arguments. `python -m instruments.triton.launch_paths [switches] [problem]` prints the checks as JSON (the CPU tests
of impls/triton/launcher.py run it in a process without the interpreter).
"""

from __future__ import annotations

import torch

from instruments.intercept import device_answered, patched, recording, stand_in_driver


def _normal(value):
    """A recorded argument made comparable: a tensor by its pointer, dtype, shape and strides."""
    if isinstance(value, torch.Tensor):
        return "tensor", value.data_ptr(), str(value.dtype), tuple(value.shape), value.stride()
    if isinstance(value, tuple):
        return tuple(_normal(v) for v in value)
    return value


PROBLEMS = {  # name -> (Problem fields, dtype): small problems whose optional operands change the launches
    "plain": (dict(shape=(1, 256, 4, 32, 1, 32, 64)), torch.bfloat16),
    "z-init-seq_idx-Dchannel": (dict(shape=(2, 200, 4, 32, 2, 32, 64), has_z=True, has_initial_states=True,
                                     nseqs=2, D_per_channel=True), torch.float16),
    "varlen-fp32": (dict(shape=(1, 300, 4, 32, 1, 32, 64), varlen=True, nseqs=3, has_initial_states=True),
                    torch.float32),
}


def _problem_inputs(name: str, seed: int, x_offset: int = 0) -> dict:
    """The forward's keyword arguments for problem `name` on the CPU; with `x_offset`, x copied that many elements
    into a fresh storage (its alignment changes, its values do not)."""
    from impls.inputs import make_inputs
    from impls.problem import Problem, Shape

    fields, dtype = PROBLEMS[name]
    problem = Problem(**{**fields, "shape": Shape(*fields["shape"])})
    kw = make_inputs(problem, seed=seed, dtype=dtype).forward_kwargs()
    if x_offset:
        x = kw["x"]
        moved = torch.empty(x.numel() + x_offset, dtype=x.dtype)[x_offset:].view(x.shape)
        moved.copy_(x)
        kw["x"] = moved
    return kw


def compare_launch_paths(switches: dict, problem: str = "plain") -> dict:
    """The forward of the Triton backend on a small problem (PROBLEMS), launched by launch_path 'triton' and
    'cached' (after `install()`): the driver-level arguments of every launch, compared. Returns {check: bool or
    count}: the cached path's first call (through Triton), its second (from the cache, no JITFunction.run), a call
    on new inputs, and — with tma off — a call whose x is 2 bytes off 16-byte alignment (a new specialisation: a new
    cache entry) all pass the driver what launch_path='triton' passes: the same compiled kernel (each loaded kernel
    has its own function token) with the same arguments. Outputs come from a pool that hands out one buffer per
    allocation of a forward, in allocation order, so that the two paths' pointers agree and two outputs of one
    shape and dtype (dt and dA_cumsum) are two buffers: a swap of them would show."""
    import triton.runtime.jit as jit

    from impls import registry

    cls = registry.backend_class("triton")
    pool: list[torch.Tensor] = []
    cursor = [0]

    def empty(shape, dt, device):
        i, cursor[0] = cursor[0], cursor[0] + 1
        if i == len(pool) or tuple(pool[i].shape) != tuple(shape) or pool[i].dtype != dt:
            pool[i:] = [torch.empty(shape, dtype=dt)]
        return pool[i]

    runs = [0]
    real_run = jit.JITFunction.run

    def counted(self, *args, **kwargs):
        runs[0] += 1
        return real_run(self, *args, **kwargs)

    with device_answered("triton"), patched(cls, _empty=staticmethod(empty)), patched(jit.JITFunction, run=counted):
        return _compared(switches, problem, runs, cursor)


def _compared(switches: dict, problem: str, runs: list[int], cursor: list[int]) -> dict:
    import impls
    from impls.triton import launcher

    paths = {p: impls.get_backend("triton", **{**switches, "launch_path": p}) for p in launcher.PATHS}

    def forward(path: str, kw: dict) -> tuple[list, int]:
        before = runs[0]
        cursor[0] = 0
        with recording() as launches:
            impls.ssd_forward(**kw, backend=paths[path])
        return [_normal(a) for a in launches], runs[0] - before

    launcher.clear()
    first, second = _problem_inputs(problem, 1), _problem_inputs(problem, 2)
    want, _ = forward("triton", first)
    miss, miss_runs = forward("cached", first)
    hit, hit_runs = forward("cached", first)
    want2, _ = forward("triton", second)
    hit2, _ = forward("cached", second)
    out = {"launches": len(want), "miss_equal": miss == want, "miss_runs": miss_runs, "hit_equal": hit == want,
           "hit_runs": hit_runs, "new_inputs_equal": hit2 == want2 and want2 != want}
    if not switches.get("tma"):
        entries = len(launcher._COMPILED)
        odd = _problem_inputs(problem, 1, x_offset=1)
        want3, _ = forward("triton", odd)
        got3, odd_runs = forward("cached", odd)
        out.update(misaligned_equal=got3 == want3, misaligned_new_entries=len(launcher._COMPILED) - entries,
                   misaligned_runs=odd_runs)
    return out


def main(argv=None) -> int:
    import argparse
    import json

    from instruments.host_profile import parse_switches

    parser = argparse.ArgumentParser(prog="python -m instruments.triton.launch_paths",
                                     description="The Triton backend's host launch paths compared without a GPU "
                                                 "(the stand-in driver), as JSON.")
    parser.add_argument("switches", nargs="?", default="", help="switch overrides, k=v,k=v")
    parser.add_argument("path", nargs="?", default="plain", choices=tuple(PROBLEMS), help="the problem run")
    args = parser.parse_args(argv)
    with stand_in_driver():
        print(json.dumps(compare_launch_paths(parse_switches(args.switches), args.path)))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
