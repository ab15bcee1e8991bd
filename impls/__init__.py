"""Mamba-2 SSD forward: one interface (three stages and their composition), many backends.

    from impls import ssd_forward
    out = ssd_forward(x, dt, A, B, C, chunk_size=256, D=D, dt_bias=dt_bias, dt_softplus=True, backend="mamba_ssm")

The contract and the math are in impls/README.md.
"""

from impls.api import chunk_cumsum, compute_out, fwd_pass_state, seq_idx_from_cu_seqlens, ssd_forward  # noqa: F401
from impls.problem import Problem, Shape  # noqa: F401
from impls.registry import (  # noqa: F401
    Backend,
    BackendUnavailable,
    ForwardResult,
    backend_class,
    get_backend,
    list_backends,
    register,
    switch_table,
)
