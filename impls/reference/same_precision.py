"""The chunked reference at a backend's own precision: what a correct kernel of that precision achieves, against
which the gate measures a backend's error (harness/correctness.py, impls/README.md "The gate's bound").

Inputs stay in their dtype; dt's softplus is the textbook log(1 + exp(v)) in float32 (upstream's form: its rounding
of 1 + exp(v) costs ~1e-5 relative at typical dt, which torch's exact softplus does not show), exp and log taken
through exp2 and log2 as the GPU kernels take them; every matmul operand
is rounded to the stage's precision as `Backend.precision` reports it (bfloat16, float16, tf32; float32 and float64
keep them as computed), including the operands a kernel forms on the way (the decay-weighted x of a chunk's state,
the masked scores before they meet x); sums run in float32 (float64 for float64 inputs); states and outputs are
rounded to their dtypes as the reference stages return them.
"""

from __future__ import annotations

import torch

from impls.reference.backend import ReferenceBackend
from impls.reference.chunk_cumsum import chunk_cumsum
from impls.reference.compute_out import compute_out
from impls.reference.fwd_pass_state import fwd_pass_state

ROUNDED_TO = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def round_tf32(t: torch.Tensor) -> torch.Tensor:
    """float32 values rounded to tf32's 10-bit mantissa, to nearest, ties to even (what a tf32 tensor core reads)."""
    if t.dtype != torch.float32:
        raise ValueError(f"round_tf32: expected a float32 tensor, got {t.dtype}")
    bits = t.contiguous().view(torch.int32)
    lsb = (bits >> 13) & 1
    rounded = (bits + 0xFFF + lsb) & ~0x1FFF
    finite = torch.isfinite(t)
    return torch.where(finite, rounded.view(torch.float32), t)


LOG2E, LN2 = 1.4426950408889634, 0.6931471805599453


def textbook_softplus(v: torch.Tensor) -> torch.Tensor:
    """log(1 + exp(v)) as written, with exp and log as Triton and cuTile lower them on the GPU: exp2(v·log2 e) and
    log2(·)·ln 2, each product rounded in v's dtype (the rounding of v·log2 e costs |v|·2^-24 relative in exp(v))."""
    return torch.log2(1 + torch.exp2(v * LOG2E)) * LN2


def operand_rounding(precision: str):
    """The rounding a matmul operand gets at `precision` (a `Backend.precision` answer), or None for none."""
    if precision in ROUNDED_TO:
        dtype = ROUNDED_TO[precision]
        return lambda t: t.to(dtype).to(t.dtype)
    if precision == "tf32":  # straight through: the value rounded, the gradient passed as it is
        return lambda t: t + (round_tf32(t.detach()) - t.detach()) if t.dtype == torch.float32 else t
    if precision in ("float32", "float64", "none"):
        return None
    raise ValueError(f"precision: expected bfloat16, float16, tf32, float32, float64 or none, got {precision!r}")


class SamePrecisionReference(ReferenceBackend):
    """The reference stages with each stage's matmul operands rounded to `precisions[stage]`."""

    name = "reference"

    def __init__(self, precisions: dict[str, str]):
        super().__init__()
        self.rounding = {stage: operand_rounding(p) for stage, p in precisions.items()}

    def chunk_cumsum(self, dt, A, chunk_size, dt_bias, dt_softplus, dt_limit):
        return chunk_cumsum(dt, A, chunk_size, dt_bias, dt_softplus, dt_limit, textbook_softplus)

    def fwd_pass_state(self, B, x, dt, dA_cumsum, initial_states, seq_idx, state_dtype):
        return fwd_pass_state(B, x, dt, dA_cumsum, initial_states, seq_idx, state_dtype,
                              self.rounding.get("fwd_pass_state"))

    def compute_out(self, C, B, x, dt, dA_cumsum, states, D, z, seq_idx, initial_states=None):
        return compute_out(C, B, x, dt, dA_cumsum, states, D, z, seq_idx, self.rounding.get("compute_out"),
                           initial_states)
