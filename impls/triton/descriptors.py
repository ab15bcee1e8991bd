"""Tensor-descriptor (TMA) loads of the Triton backend (switch `tma`): what a tensor must satisfy to be read or
written through a tensor descriptor, the global-memory workspace in-kernel descriptors are built in, and the
descriptors built on the host (switch `tma_descriptors`).

Two places a descriptor can be made (switch `tma_descriptors`):
- "device": inside the kernel, `tl.make_tensor_descriptor`, by every program (the behaviour `tma` had alone);
- "host": once per launch on the host, `triton.tools.tensor_descriptor.TensorDescriptor`, passed to the kernel as
  an argument (on sm_90 Triton hands it over as a `__grid_constant__` CUtensorMap: no per-program creation, no
  workspace).

On sm_90 a descriptor made inside a kernel becomes a TMA descriptor (PTX `tensormap.cp_fenceproxy`, loads
`cp.async.bulk.tensor`), written to a workspace that Triton asks for through `triton.set_allocator` at launch. The
hardware needs a 16-byte aligned base, 16-byte multiples for every stride but the last, and a contiguous last
dimension (Triton's own rules, `triton/language/core.py: make_tensor_descriptor`); a tensor that breaks them is
refused here with its name, before any kernel runs (no silent pointer fallback).
"""

from __future__ import annotations

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from impls.triton import launcher


def refusal(name: str, tensor: torch.Tensor) -> str | None:
    """Why `tensor` cannot be read through a tensor descriptor, or None when it can."""
    item = tensor.element_size()
    if tensor.stride(-1) != 1 and tensor.shape[-1] > 1:
        return f"{name}: its last dimension has stride {tensor.stride(-1)}, a tensor descriptor needs it contiguous"
    if tensor.data_ptr() % 16:
        return f"{name}: its data pointer is not 16-byte aligned (offset {tensor.data_ptr() % 16} bytes)"
    odd = [s for s in tensor.stride()[:-1] if (s * item) % 16]
    if odd:
        return f"{name}: strides {tuple(tensor.stride())} ({item}-byte elements) are not all 16-byte multiples"
    return None


def row_refusal(name: str, last: int, itemsize: int) -> str | None:
    """`refusal` of a contiguous tensor the backend allocates (aligned), known by its last dimension: its other
    strides are multiples of that row's bytes, and the row's own must be a 16-byte multiple."""
    if last > 1 and (last * itemsize) % 16:
        return (f"{name}: rows of {last} elements ({itemsize}-byte) are {last * itemsize} bytes, not a 16-byte "
                "multiple")
    return None


def memory_order(states: torch.Tensor) -> torch.Tensor:
    """A (…, headdim, dstate) states view as the kernels' descriptors see it: (…, dstate, headdim) when headdim is
    the contiguous dimension (transposed_layout), else as is."""
    return states.transpose(-1, -2) if states.stride(-1) != 1 and states.stride(-2) == 1 else states


def require(tensors: dict[str, torch.Tensor], where: str = "device") -> None:
    """Raise ValueError naming the first tensor a descriptor cannot read; for in-kernel descriptors (`where`
    "device") set the descriptor workspace allocator."""
    for name, tensor in tensors.items():
        reason = refusal(name, tensor)
        if reason:
            switch = "'tma'" if where == "device" else "'tma' with tma_descriptors='host'"
            raise ValueError(f"switch {switch} of backend 'triton': {reason} (run with tma=False, or pass the "
                             "tensor contiguous and aligned)")
    if where == "device":
        device = next(iter(tensors.values())).device
        triton.set_allocator(_Workspace(device))


def host(tensors: dict[str, tuple[torch.Tensor, tuple[int, ...]]], launch_path: str = "triton") -> dict:
    """Host-built descriptors, one per named (tensor, block shape), after `require` has checked every tensor (no
    AssertionError from TensorDescriptor, a ValueError naming the tensor instead): Triton's TensorDescriptor, or
    with launch_path='cached' the launcher's HostDescriptor (the same fields, made full when a launch goes through
    Triton; a zero-size dimension is refused here as TensorDescriptor refuses it)."""
    require({name: tensor for name, (tensor, _) in tensors.items()}, where="host")
    if launch_path == "cached":
        for name, (tensor, _) in tensors.items():
            if 0 in tensor.shape:
                raise ValueError(f"switch 'tma' with tma_descriptors='host' of backend 'triton': {name}: shape "
                                 f"{tuple(tensor.shape)} has an empty dimension, a tensor descriptor cannot")
        return {name: launcher.HostDescriptor(tensor, tuple(block)) for name, (tensor, block) in tensors.items()}
    return {name: TensorDescriptor.from_tensor(tensor, list(block)) for name, (tensor, block) in tensors.items()}


class _Workspace:
    """Triton's allocator protocol: `size` bytes of device memory for the kernel's descriptors."""

    def __init__(self, device: torch.device):
        self.device = device

    def __call__(self, size: int, alignment: int, stream) -> torch.Tensor:
        return torch.empty(size, dtype=torch.int8, device=self.device)
