"""The one tolerance table: relative error ‖out − ref‖ / ‖ref‖ against the float64 reference, per dtype."""

from __future__ import annotations

import contextlib

import torch

REL_TOL: dict[torch.dtype, float] = {
    torch.float64: 1e-10,
    torch.float32: 1e-4,
    torch.float16: 5e-3,
    torch.bfloat16: 2e-2,
}
TF32_REL_TOL = 2e-3  # float32 inputs through a tf32 matmul
MAMBA_SSM_FACTOR = 2.0  # on the GPU a backend's error must also be <= 2x mamba-ssm's on the same inputs


def tolerance(dtype: torch.dtype, tf32: bool = False) -> float:
    if dtype == torch.float32 and tf32:
        return TF32_REL_TOL
    return REL_TOL[dtype]


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64; NaN or inf anywhere in out gives inf (never passes)."""
    out64, ref64 = out.detach().to(torch.float64), ref.detach().to(device=out.device, dtype=torch.float64)
    if out64.shape != ref64.shape:
        raise ValueError(f"out: expected shape {tuple(ref64.shape)}, got {tuple(out64.shape)}")
    if not bool(torch.isfinite(out64).all()):
        return float("inf")
    denom = torch.linalg.vector_norm(ref64).item()
    num = torch.linalg.vector_norm(out64 - ref64).item()
    return num / denom if denom > 0 else num


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fills a float tensor with NaN (ints with their minimum), so reads of unwritten memory show."""
    if t.is_floating_point():
        return t.fill_(float("nan"))
    return t.fill_(torch.iinfo(t.dtype).min)


@contextlib.contextmanager
def poisoned_allocations():
    """Within the block, torch.empty / empty_like / empty_strided / Tensor.new_empty return poisoned tensors
    (NaN for floats, the minimum for integers), so a kernel that leaves part of its (internally allocated)
    output unwritten shows it instead of passing on stale memory."""
    originals = {name: getattr(torch, name) for name in ("empty", "empty_like", "empty_strided")}
    new_empty = torch.Tensor.new_empty

    def poisoning(fn):
        def allocate(*args, **kwargs):
            t = fn(*args, **kwargs)
            if t.numel():
                poison_(t)
            return t

        return allocate

    try:
        for name, fn in originals.items():
            setattr(torch, name, poisoning(fn))
        torch.Tensor.new_empty = poisoning(new_empty)
        yield
    finally:
        for name, fn in originals.items():
            setattr(torch, name, fn)
        torch.Tensor.new_empty = new_empty
