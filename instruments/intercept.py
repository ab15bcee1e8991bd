"""Kernel launches on a machine without a GPU, one interceptor for both languages: the backends told that a device
is there, and each launch dropped, recorded or compiled for sm_90 instead of run, at the level an instrument needs.
Every context manager here puts back what it replaced when it ends.

- the backend's own launch function, both languages (`backend_launches`: cuTile's
  `impls.cutile.common.launch(call)`, Triton's `impls.triton.launcher.launch(kernel, grid, ...)`), dropped or
  recorded: nothing compiled;
- Triton's JIT entry, `JITFunction.run`: dropped (`jit_dropped`), or compiled for sm_90 and not run
  (`compile_only`);
- Triton's CUDA driver (`stand_in_driver`): kernels compiled for real and Triton's per-launch work done, only the
  driver's C call recorded (`recording`). cuTile has no such level: its ahead-of-time build is
  instruments/cutile/aot.py.

`device_answered(*backends)` makes the named backends available on any device; `compile_only` also answers for the
card whose tuning records are committed (GPU, sm_90). The Triton levels need a process that does not run under the
interpreter (TRITON_INTERPRET unset before impls.triton is imported).
"""

from __future__ import annotations

import contextlib
import importlib
import os

import torch

GPU = "NVIDIA H200"  # the card the answers stand for (its tuning records are the committed ones)
ARCH = 90  # its compute capability, as Triton's target names it
LAUNCH_FUNCTIONS = {"cutile": "impls.cutile.common", "triton": "impls.triton.launcher"}  # modules holding `launch`
_ABSENT = object()


@contextlib.contextmanager
def patched(owner, **attributes):
    """Within: `owner`'s attributes set to the values given (a class's own entries or a module's names); on exit
    each is put back as it was, or removed where `owner` had none of its own."""
    saved = {name: vars(owner).get(name, _ABSENT) for name in attributes}
    for name, value in attributes.items():
        setattr(owner, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, value)


@contextlib.contextmanager
def device_answered(*backends: str):
    """Within: each named backend (a registry name) is available and takes any device."""
    from impls import registry

    with contextlib.ExitStack() as stack:
        for name in backends:
            stack.enter_context(patched(registry.backend_class(name), available=classmethod(lambda cls: (True, "")),
                                        check_device=lambda self, device: (True, "")))
        yield


def _dropped(*args, **kwargs) -> None:
    return None


@contextlib.contextmanager
def backend_launches(backend: str, record=None):
    """Within: the backend's own launch function calls `record` with its arguments instead of launching (None: the
    launch is dropped). cuTile's stages launch through `impls.cutile.common.launch(call)`, Triton's through
    `impls.triton.launcher.launch(kernel, grid, *args, path=..., **kwargs)`."""
    if backend not in LAUNCH_FUNCTIONS:
        raise ValueError(f"backend: expected one of {sorted(LAUNCH_FUNCTIONS)}, got {backend!r}")
    with patched(importlib.import_module(LAUNCH_FUNCTIONS[backend]), launch=record or _dropped):
        yield


def _triton_process() -> None:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("TRITON_INTERPRET is set: unset it to compile for a GPU")


@contextlib.contextmanager
def jit_dropped():
    """Within: Triton's `JITFunction.run` returns at once: nothing is compiled or launched, and everything the
    backend does before it runs."""
    import triton.runtime.jit as jit

    with patched(jit.JITFunction, run=_dropped):
        yield


# --- Triton's CUDA driver, stood in for -------------------------------------------------------------------------------
LAUNCHES: list[tuple] = []  # the driver-level arguments of every launch, while `recording`
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
        from triton.backends.nvidia.driver import wrap_handle_tensordesc

        signature = dict(src.signature.items())
        self.launch = wrap_handle_tensordesc(_record, signature, getattr(metadata, "tensordesc_meta", None))

    def __call__(self, grid_x, grid_y, grid_z, stream, function, *args):
        self.launch(grid_x, grid_y, grid_z, stream, function, False, False, None, None, *args)


def _record(*args) -> None:
    if _recording[0]:
        # the launcher's own leading arguments (grid, stream, function, flags, scratch, packed metadata), the launch
        # metadata and hooks (objects made per launch), then the kernel's arguments as the driver gets them
        LAUNCHES.append(args[:10] + args[13:])


class StandInDriver:
    """Triton's CUDA driver on a machine without a GPU: kernels compile for sm_90 for real (Triton's whole pipeline
    and the bundled ptxas), `JITFunction.run` does all its per-launch work (binding, specialisation, cache lookup,
    launch metadata), the launcher expands host-built tensor descriptors as Triton's own does
    (`wrap_handle_tensordesc`), and only the final C call is replaced by a recorder (`recording`; a tensor map
    encoding by `fill_tma_descriptor` is recorded as the tuple of its inputs)."""

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
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", ARCH, 32)

    def get_active_torch_device(self):
        return torch.device("cpu")


@contextlib.contextmanager
def stand_in_driver():
    """Within: the stand-in is Triton's active driver (the one before it, None until a launch asked for one,
    put back on exit)."""
    from triton.runtime import driver

    _triton_process()
    saved = driver._active
    driver.set_active(StandInDriver())
    try:
        yield
    finally:
        driver._active = saved


@contextlib.contextmanager
def recording():
    """Within: LAUNCHES cleared, then the driver-level arguments of every launch under the stand-in appended."""
    LAUNCHES.clear()
    _recording[0] = True
    try:
        yield LAUNCHES
    finally:
        _recording[0] = False


@contextlib.contextmanager
def compile_only():
    """Within: every Triton kernel launch compiles for sm_90 and returns without running, the Triton backend answers
    as on the GPU (available, its target sm90 and its device name GPU: the committed tuning records apply); yields
    the list the compiled kernels are appended to, (kernel name, CompiledKernel)."""
    import collections

    import triton.runtime.jit as jit

    from impls.triton import target

    compiled, caches = [], {}  # caches: JITFunction -> its own binders and kernels, put back on the way out
    real_run = jit.JITFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        if self not in caches:  # binders made here hold the sm_90 target answered here: give them a cache of their own
            caches[self] = self.device_caches
            self.device_caches = collections.defaultdict(self.create_binder)
        kernel = real_run(self, *args, grid=grid, warmup=True, **kwargs)
        compiled.append((self.fn.__name__, kernel))
        return kernel

    with contextlib.ExitStack() as stack:
        stack.enter_context(stand_in_driver())
        stack.enter_context(patched(jit.JITFunction, run=run))
        stack.enter_context(patched(target, arch=lambda device: "sm90", device_name=lambda device: GPU))
        stack.enter_context(device_answered("triton"))
        try:
            yield compiled
        finally:
            for fn, cache in caches.items():
                fn.device_caches = cache
