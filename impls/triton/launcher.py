"""How the Triton backend launches its kernels (switch `launch_path`): through Triton's `kernel[grid](...)` on every
call, or through the kernel Triton compiled for the same arguments once it has.

'triton': every launch is `JITFunction.run`: it binds and specialises every argument (a tensor's dtype and 16-byte
alignment, an integer's width, whether it is 1 or a multiple of 16, each element of a tuple likewise; about 44
arguments per launch in compute_out, its strides in one tuple per tensor),
computes the cache key, finds the compiled kernel, builds the launch metadata and hands the arguments to the
kernel's launcher, which encodes each host-built tensor descriptor (CUtensorMap) and calls the driver.
'cached': the first launch with a given signature goes through `kernel[grid](...)` as above (so compilation,
Triton's checks all run); the compiled kernel it returns is kept under a key at least as fine as Triton's
specialisation (`signature`: each tensor's dtype and 16-byte alignment, each scalar's exact value, each tuple's
elements likewise, each descriptor's dtype, block and padding, the constexprs and launch options, the device), and
later launches with the same key call that kernel's launcher directly. The launcher still
encodes the descriptors from the arguments of the call (their base pointers, shapes and strides), so nothing of a
previous call's tensors is reused. What the cached path skips is Triton's per-launch binding; two things
`JITFunction.run` does at every launch it does not: the check that the Python globals a kernel read at compile time
are unchanged (the backend's kernels read module constants only), and the JIT function's pre-run hooks (the backend
sets none). The key holds the active driver, so kernels kept under a stand-in driver (the compile-only tools, the
CPU fake driver) are not launched under another.
"""

from __future__ import annotations

import torch
from triton import knobs
from triton.runtime import driver
from triton.tools.tensor_descriptor import TensorDescriptor

from impls.triton.target import interpreting

PATHS = ("triton", "cached")
EXP2_FTZ_INTERPRETED = ("switch exp2_ftz=False of backend 'triton': its kernels write ex2.approx.f32 as inline PTX, "
                        "and the Triton interpreter (TRITON_INTERPRET=1) runs no PTX; use exp2_ftz=True there")
MAX_ENTRIES = 512  # compiled-kernel entries kept (one per kernel, signature and launch configuration); then cleared

_COMPILED: dict[tuple, tuple] = {}  # signature -> (compiled kernel, the launch arguments after the positional ones)
_TENSOR = torch.Tensor


class HostDescriptor:
    """A host-built tensor descriptor of the cached path: what the launcher reads of one (base, shape, strides,
    padding; its box comes from the compiled kernel), without TensorDescriptor's per-call validation, which
    impls.triton.descriptors.require has done in its own terms. `full()` makes the TensorDescriptor that a launch
    through Triton needs."""

    __slots__ = ("base", "shape", "strides", "block_shape", "padding")

    def __init__(self, base: torch.Tensor, block_shape: tuple[int, ...], padding: str = "zero"):
        self.base = base
        self.shape = base.shape
        self.strides = base.stride()
        self.block_shape = block_shape
        self.padding = padding

    def full(self) -> TensorDescriptor:
        return TensorDescriptor.from_tensor(self.base, list(self.block_shape), self.padding)


def _other_key(a):
    """What of a positional argument other than an int or a plain tensor the compiled kernel depends on."""
    kind = type(a)
    if kind is HostDescriptor or kind is TensorDescriptor:
        return "desc", a.base.dtype, tuple(a.block_shape), a.padding
    if kind is float or kind is bool or a is None:
        return kind, a
    if kind is tuple:  # a kernel's stride tuple (Triton specialises each element as an argument of its own)
        return kind, tuple([e if type(e) is int else _other_key(e) for e in a])
    if isinstance(a, torch.Tensor):  # a subclass (nn.Parameter): what Triton reads of it, as of a tensor
        return a.dtype, not a.data_ptr() & 15
    raise TypeError(f"switch launch_path='cached' of backend 'triton': no signature rule for an argument of type "
                    f"{kind.__name__}")


def signature(kernel, device: int, grid_rank: int, args: tuple, kwargs: dict) -> tuple:
    """The cache key of one launch, at least as fine as Triton's specialisation: the kernel, the active driver and
    the device, the grid's rank, each positional argument (an int by its value, a tensor by its dtype and 16-byte
    alignment, anything else, a tuple of ints among them, by `_other_key`), the keyword arguments (constexprs and
    launch options) by name, type and value (True, 1 and 1.0 are three keys, 0.0 and -0.0 two, as in Triton's),
    and the knobs JITFunction.run reads into its own key at each launch (debug, instrumentation mode)."""
    return (kernel, id(driver.active), device, grid_rank,
            tuple([a if type(a) is int else (a.dtype, not a.data_ptr() & 15) if type(a) is _TENSOR
                   else _other_key(a) for a in args]),
            tuple([(name, type(v), repr(v) if type(v) is float else v) for name, v in kwargs.items()]),
            knobs.runtime.debug, knobs.compilation.instrumentation_mode)


def _through_triton(kernel, grid, args, kwargs):
    """One launch through `kernel[grid](...)` (descriptors of the cached path made full); the compiled kernel. A
    kernel built with switch exp2_ftz off (inline PTX) is refused under the interpreter, which runs no PTX."""
    if kwargs.get("EXP2_FTZ") is False and interpreting():
        raise ValueError(EXP2_FTZ_INTERPRETED)
    args = tuple(a.full() if type(a) is HostDescriptor else a for a in args)
    return kernel[grid](*args, **kwargs)


def _tail(kernel, n_positional: int, kwargs: dict) -> tuple:
    """The kernel's parameters after the positional ones, in order: the keyword's value, else the default. Only
    constexprs may come by keyword (the launcher ignores them; a runtime value kept here would be reused by every
    later launch of the key): a runtime parameter passed by keyword raises TypeError."""
    tail = []
    for param in kernel.params[n_positional:]:
        if param.name in kwargs and not param.is_constexpr:
            raise TypeError(f"switch launch_path='cached' of backend 'triton': {kernel.fn.__name__}'s runtime "
                            f"parameter {param.name!r} is passed by keyword; pass it positionally")
        if param.name in kwargs:
            tail.append(kwargs[param.name])
        elif param.has_default:
            tail.append(param.default)
        else:
            raise TypeError(f"{kernel.fn.__name__}: parameter {param.name!r} has no value")
    return tuple(tail)


def _hooks(compiled, grid, stream, args):
    """(launch metadata, enter hook, exit hook) as JITFunction.run passes them; no metadata when neither hook chain
    has a hook (Triton 3.6's hooks are HookChains, never None)."""
    enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    if not any(h is not None and getattr(h, "calls", True) for h in (enter, leave)):
        return None, enter, leave
    return compiled.launch_metadata(grid, stream, *args), enter, leave


def launch(kernel, grid: tuple, *args, path: str, **kwargs):
    """Launch `kernel` over `grid` with `args` (positional, in the kernel's order) and `kwargs` (constexprs and
    launch options) by `path` ('triton' or 'cached'). Returns nothing."""
    if path == "triton":
        _through_triton(kernel, grid, args, kwargs)
        return
    if path != "cached":
        raise ValueError(f"switch launch_path of backend 'triton': {path!r} is not one of {PATHS}")
    device = driver.active.get_current_device()
    key = signature(kernel, device, len(grid), args, kwargs)
    entry = _COMPILED.get(key)
    if entry is None:
        tail = _tail(kernel, len(args), kwargs)  # before the launch: a keyword it refuses is refused unlaunched
        compiled = _through_triton(kernel, grid, args, kwargs)
        if not hasattr(compiled, "packed_metadata"):
            raise ValueError(f"switch launch_path of backend 'triton': 'cached' launches the kernel Triton compiled, "
                             f"and the launch of {kernel!r} returned none to keep (the Triton interpreter compiles "
                             "nothing); use launch_path='triton'")
        if len(_COMPILED) >= MAX_ENTRIES:
            _COMPILED.clear()
        _COMPILED[key] = (compiled, tail)
        return
    compiled, tail = entry
    full = args + tail
    stream = driver.active.get_current_stream(device)
    metadata, enter, leave = _hooks(compiled, grid, stream, full)
    compiled.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, stream,
                 compiled.function, compiled.packed_metadata, metadata, enter, leave, *full)


def clear() -> None:
    """Forget every compiled kernel kept by the cached path."""
    _COMPILED.clear()
