"""dA's terms as the references' autograd forms them, for the gradient gate's floor of dA (harness/gradient_gate.py
sum_floor): a head's dA is the sum over batch and time of dt_s · ∂L/∂(dt_s A)."""

from __future__ import annotations

import torch


class DecayTerms:
    """dA's terms as autograd forms them through reference stages: at each position, the processed dt times the
    gradient of dt·A there (the reverse cumsum, within the chunk, of dA_cumsum's gradient); a head's dA is their sum
    over batch and time. Wraps one backend instance's chunk_cumsum and keeps the terms of every backward through it,
    in the order run (a batch row at a time: `terms` joins them by batch row)."""

    def __init__(self, backend):
        self.parts, self._stage = [], backend.chunk_cumsum
        backend.chunk_cumsum = self._chunk_cumsum

    def _chunk_cumsum(self, *args, **kwargs):
        dt, dA_cumsum = self._stage(*args, **kwargs)
        if dA_cumsum.requires_grad:
            kept = dt.detach().to(torch.float64)
            dA_cumsum.register_hook(
                lambda g: self.parts.append(kept * g.to(torch.float64).flip(-1).cumsum(-1).flip(-1)))
        return dt, dA_cumsum

    def terms(self) -> torch.Tensor | None:
        """(batch, nheads, nchunks, chunk): every position's term; None when no backward ran through it."""
        return torch.cat(self.parts) if self.parts else None

    def per_head_squares(self) -> torch.Tensor | None:
        """(nheads,): each head's sum of squared terms over batch and time; None when no backward ran through it."""
        terms = self.terms()
        return None if terms is None else terms.square().sum(dim=(0, 2, 3))
