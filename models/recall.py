"""A synthetic task with learnable structure for short training runs: multi-query associative recall, drawn from a
seeded generator (nothing is downloaded).

One sequence: `n_pairs` key-value pairs (distinct keys), then `n_queries` of those keys (distinct ones while
n_queries <= n_pairs, else drawn with repetition), each followed by its value:

    k₁ v₁ k₂ v₂ … k_n v_n  q₁ v(q₁) q₂ v(q₂) …      keys in [0, n_keys), values in [n_keys, n_keys + n_values)

The targets are the values after each query key (the position of qᵢ predicts v(qᵢ)); every other position is
ignored (IGNORE). Every sequence has the same number of targets, so the mean loss over a batch is the mean of its
halves' means (what DDP's gradient averaging needs, models/ddp.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from impls import validate as check

IGNORE = -100  # the target of a position that predicts nothing (F.cross_entropy's ignore_index)


@dataclass(frozen=True)
class RecallTask:
    """The task's sizes: pairs per sequence, queries per sequence (distinct keys up to n_pairs of them, with
    repetition beyond), the key and value vocabularies (n_keys >= n_pairs: keys of a sequence are distinct)."""

    n_pairs: int = 8
    n_queries: int = 24
    n_keys: int = 16
    n_values: int = 16

    def __post_init__(self):
        for arg in ("n_pairs", "n_queries", "n_keys", "n_values"):
            check.positive_int(arg, getattr(self, arg))
        if self.n_keys < self.n_pairs:
            check.fail("n_keys", f">= n_pairs = {self.n_pairs} (a sequence's keys are distinct)", self.n_keys)

    @property
    def vocab_size(self) -> int:
        return self.n_keys + self.n_values

    @property
    def seqlen(self) -> int:
        return 2 * (self.n_pairs + self.n_queries)


@dataclass(frozen=True)
class RecallBatch:
    """Token ids (batch, seqlen) and targets (batch, seqlen): a value id where the position must recall one, else
    IGNORE."""

    input_ids: torch.Tensor
    targets: torch.Tensor

    def to(self, device) -> RecallBatch:
        return RecallBatch(self.input_ids.to(device), self.targets.to(device))

    def rows(self, start: int, stop: int) -> RecallBatch:
        """Sequences start … stop − 1 (a data-parallel rank's share)."""
        return RecallBatch(self.input_ids[start:stop], self.targets[start:stop])


def _first_columns(scores: torch.Tensor, count: int) -> torch.Tensor:
    """Per row, the indices of its `count` smallest scores: a uniformly random subset of distinct columns."""
    return scores.argsort(dim=-1)[:, :count]


def recall_batch(task: RecallTask, batch: int, generator: torch.Generator) -> RecallBatch:
    """`batch` sequences of the task drawn from `generator` (on the CPU; the same generator state gives the same
    batch on every machine)."""
    keys = _first_columns(torch.rand(batch, task.n_keys, generator=generator), task.n_pairs)
    values = task.n_keys + torch.randint(0, task.n_values, (batch, task.n_pairs), generator=generator)
    if task.n_queries <= task.n_pairs:
        asked = _first_columns(torch.rand(batch, task.n_pairs, generator=generator), task.n_queries)
    else:
        asked = torch.randint(0, task.n_pairs, (batch, task.n_queries), generator=generator)
    query_keys, answers = keys.gather(1, asked), values.gather(1, asked)
    context = torch.stack([keys, values], dim=-1).flatten(1)
    queries = torch.stack([query_keys, answers], dim=-1).flatten(1)
    input_ids = torch.cat([context, queries], dim=1)
    targets = torch.full_like(input_ids, IGNORE)
    query_positions = 2 * task.n_pairs + 2 * torch.arange(task.n_queries)
    targets[:, query_positions] = answers
    return RecallBatch(input_ids, targets)
