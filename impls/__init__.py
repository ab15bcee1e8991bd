"""Mamba-2 SSD forward: one interface (three stages and their composition), many backends.

    from impls import ssd_forward
    out = ssd_forward(x, dt, A, B, C, chunk_size=256, D=D, dt_bias=dt_bias, dt_softplus=True, backend="mamba_ssm")

The contract and the math are in impls/README.md. The names below are imported on first use, so that importing a
light submodule (impls.declaration: what the backend folders declare) does not import torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "impls.api": ("chunk_cumsum", "compute_out", "fwd_pass_state", "seq_idx_from_cu_seqlens", "ssd_forward"),
    "impls.autograd": ("ssd",),
    "impls.problem": ("Problem", "Shape"),
    "impls.registry": ("Backend", "BackendUnavailable", "ForwardResult", "backend_class", "get_backend",
                       "list_backends", "register", "switch_table"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    """`impls.ssd_forward` and the other exports, or a submodule (`impls.registry`), imported when first asked."""
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value
        return value
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
