"""A stand-in for Triton's CUDA driver on a machine without a GPU, for measuring and checking the Triton backend's
host path: kernels compile for sm_90 for real (Triton's whole pipeline and the bundled ptxas), `JITFunction.run`
runs all its per-launch work (binding, specialisation, cache lookup, launch metadata), the launcher expands the
host-built tensor descriptors as Triton's own does (`wrap_handle_tensordesc`), and only the final C call is
replaced by a recorder: the arguments the driver would have been given are kept in `LAUNCHES` (a tensor map
encoding by `fill_tma_descriptor` is recorded as the tuple of its inputs). Nothing touches a GPU.

The process must not run under the Triton interpreter (TRITON_INTERPRET unset before impls.triton is imported);
`install()` makes this the active driver. Used by scripts/host_path_cpu.py (`--through triton`) and the CPU tests of
impls/triton/launcher.py; `python -m experiments.triton_fake_driver [SWITCHES] [PATH]` compares the launch paths.
"""

from __future__ import annotations

import torch
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.driver import wrap_handle_tensordesc
from triton.runtime import driver

ARCH = 90
LAUNCHES: list[tuple] = []  # the driver-level arguments of every launch, when recording
_recording = [False]


class _Utils:
    def __init__(self):
        self.loaded = 0

    def load_binary(self, name, kernel, shared, device):
        # a module (not None: CompiledKernel loads once, as on a GPU) and a function token per loaded kernel, so
        # that a recorded launch says which compiled kernel it launched
        self.loaded += 1
        return object(), self.loaded, 0, 0, 1024  # module, function, registers, spills, max threads

    def get_device_properties(self, device):
        return {"max_shared_mem": 232448, "multiprocessor_count": 132}

    def fill_tma_descriptor(self, *args):
        return ("CUtensorMap",) + tuple(tuple(a) if isinstance(a, list) else a for a in args)


class _Launcher:
    """Triton's CudaLauncher with the driver call replaced by a recorder."""

    def __init__(self, src, metadata):
        signature = dict(src.signature.items())
        self.launch = wrap_handle_tensordesc(_record, signature, getattr(metadata, "tensordesc_meta", None))

    def __call__(self, grid_x, grid_y, grid_z, stream, function, *args):
        self.launch(grid_x, grid_y, grid_z, stream, function, False, False, None, None, *args)


def _record(*args) -> None:
    if _recording[0]:
        # the launcher's own leading arguments (grid, stream, function, flags, scratch, packed metadata), the launch
        # metadata and hooks (objects made per launch), then the kernel's arguments as the driver gets them
        LAUNCHES.append(args[:10] + args[13:])


class FakeDriver:
    def __init__(self):
        self.utils = _Utils()
        self.launcher_cls = _Launcher

    def is_active(self):
        return True

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return GPUTarget("cuda", ARCH, 32)

    def get_active_torch_device(self):
        return torch.device("cpu")


def install() -> None:
    """Make the stand-in the active driver (for the rest of the process)."""
    driver.set_active(FakeDriver())


class recording:
    """Context manager: LAUNCHES cleared, then every launch inside recorded."""

    def __enter__(self):
        LAUNCHES.clear()
        _recording[0] = True
        return LAUNCHES

    def __exit__(self, *exc):
        _recording[0] = False


# --- the two launch paths compared (switch launch_path), for the CPU tests and by hand -------------------------------

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

    import impls
    from impls import registry
    from impls.triton import launcher

    cls = registry.backend_class("triton")
    cls.check_device = lambda self, device: (True, "")
    cls.available = classmethod(lambda cls: (True, ""))
    pool: list[torch.Tensor] = []
    cursor = [0]

    def empty(shape, dt, device):
        i, cursor[0] = cursor[0], cursor[0] + 1
        if i == len(pool) or tuple(pool[i].shape) != tuple(shape) or pool[i].dtype != dt:
            pool[i:] = [torch.empty(shape, dtype=dt)]
        return pool[i]

    cls._empty = staticmethod(empty)
    runs = [0]
    real_run = jit.JITFunction.run

    def counted(self, *args, **kwargs):
        runs[0] += 1
        return real_run(self, *args, **kwargs)

    jit.JITFunction.run = counted
    paths = {p: impls.get_backend("triton", **{**switches, "launch_path": p}) for p in launcher.PATHS}

    def forward(path: str, kw: dict) -> tuple[list, int]:
        before = runs[0]
        cursor[0] = 0
        with recording() as launches:
            impls.ssd_forward(**kw, backend=paths[path])
        return [_normal(a) for a in launches], runs[0] - before

    try:
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
    finally:
        jit.JITFunction.run = real_run


def main(argv=None) -> int:
    import argparse
    import json

    from experiments.host_profile import parse_switches

    parser = argparse.ArgumentParser(prog="python -m experiments.triton_fake_driver",
                                     description="The Triton backend's host launch paths compared without a GPU "
                                                 "(a fake driver), as JSON.")
    parser.add_argument("switches", nargs="?", default="", help="switch overrides, k=v,k=v")
    parser.add_argument("path", nargs="?", default="plain", help="the launch path to compare against")
    args = parser.parse_args(argv)
    install()
    print(json.dumps(compare_launch_paths(parse_switches(args.switches), args.path)))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
