"""What the layer's Triton kernels share: where they can run, their accumulation dtype, and the fixed-order sum of
per-program partials that keeps the parameter gradients deterministic."""

from __future__ import annotations

import functools

import torch
import triton.language as tl

NO_DEVICE = ("no CUDA device, and the Triton interpreter is off (set TRITON_INTERPRET=1 before the kernels are "
             "imported to run them on the CPU)")


@functools.cache
def interpreting() -> bool:
    """Whether these kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1 when they were decorated: fixed for
    the process once the module is imported)."""
    from triton.runtime.interpreter import InterpretedFunction

    from models.kernels.causal_conv import conv_fwd_kernel

    return isinstance(conv_fwd_kernel, InterpretedFunction)


def refusal(device: torch.device) -> str | None:
    """Why the kernels cannot run on tensors of `device` (None where they can): CUDA compiled, the CPU only under
    the interpreter."""
    if device.type == "cuda" or (device.type == "cpu" and interpreting()):
        return None
    if device.type == "cpu":
        return "tensors on the CPU, and the Triton interpreter is off (TRITON_INTERPRET=1 before import)"
    return f"tensors on {device}: the kernels run on CUDA devices, or on the CPU under the Triton interpreter"


def available() -> tuple[bool, str]:
    """Whether the kernels can run anywhere in this process (a CUDA device, or the interpreter)."""
    if interpreting() or torch.cuda.is_available():
        return True, ""
    return False, NO_DEVICE


def acc_dtype(dtype: torch.dtype):
    """The kernels accumulate in fp32, in float64 for float64 inputs."""
    return tl.float64 if dtype == torch.float64 else tl.float32


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """The torch dtype of the partials (acc_dtype's)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def sum_partials(partials: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Per-program partials (programs, ...) summed over the programs in one fixed order (a torch reduction over a
    leading dimension: no atomics), in `dtype`."""
    return partials.sum(0).to(dtype)
