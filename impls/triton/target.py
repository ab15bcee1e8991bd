"""Where the Triton kernels run: the interpreter or a GPU, its architecture name (the key of the fallback
configurations) and the device name tuning records are bound to.
"""

from __future__ import annotations

import functools

import torch


@functools.cache
def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1 when the kernels were defined): fixed for
    the process once the kernel modules are imported, so read once (every public call asks)."""
    from triton.runtime.interpreter import InterpretedFunction

    from impls.triton.chunk_cumsum import chunk_cumsum_kernel

    return isinstance(chunk_cumsum_kernel, InterpretedFunction)


def arch(device: torch.device) -> str:
    if interpreting() or device.type != "cuda":
        return "interpreter"
    major, _ = torch.cuda.get_device_capability(device)
    return {9: "sm90", 10: "sm100"}.get(major, "other")


def device_name(device: torch.device) -> str:
    if interpreting() or device.type != "cuda":
        return "triton-interpreter"
    return torch.cuda.get_device_name(device)

