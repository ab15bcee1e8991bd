"""How the harness calls a backend: the forward's arguments drawn from `Inputs`, and the whole forward through the
public entry, `impls.ssd_forward(..., backend=<the built backend>)`, so that what is checked and timed includes
what a user's call pays. The gate (harness/correctness.py) and the timing step (harness/measure_time.py)
both call through here."""

from __future__ import annotations

from impls.api import seq_idx_from_cu_seqlens, ssd_forward
from impls.inputs import Inputs

FORWARD_ARGS = ("x", "dt", "A", "B", "C", "chunk_size", "D", "z", "dt_bias", "initial_states", "seq_idx",
                "cu_seqlens", "dt_softplus", "dt_limit", "state_dtype")


def forward_kwargs(inputs: Inputs) -> dict:
    """The arguments the harness calls the forward with (seq_idx derived from cu_seqlens where absent)."""
    kw = inputs.forward_kwargs()
    if kw["cu_seqlens"] is not None and kw["seq_idx"] is None:
        kw["seq_idx"] = seq_idx_from_cu_seqlens(kw["cu_seqlens"], inputs.x.shape[1])
    kw["dt_limit"] = tuple(float(v) for v in kw["dt_limit"])
    return kw


def forward_arguments(inputs: Inputs) -> dict:
    """`forward_kwargs` restricted to the forward's own arguments (FORWARD_ARGS): what `ssd_forward(**...)` takes."""
    kw = forward_kwargs(inputs)
    return {k: kw[k] for k in FORWARD_ARGS}


def public_forward(backend, kw: dict):
    """The whole forward as a user calls it: the public entry, on a built backend or by name."""
    return ssd_forward(**{k: kw[k] for k in FORWARD_ARGS}, backend=backend)


def public_forward_call(backend, kw: dict):
    """`public_forward` as a zero-argument call (to time)."""
    return lambda: public_forward(backend, kw)
