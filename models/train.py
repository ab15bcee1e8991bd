"""A short training run of a small Mamba-2 language model (models/mamba2_lm.py) on associative recall
(models/recall.py), every layer's SSD on one backend: per-step loss and the final recall accuracy.

The same seed gives the same initial parameters (drawn on the CPU) and the same batches on every backend and
machine, so two backends' curves differ only by what their SSDs compute. The loss is the mean cross-entropy over the
recall targets (`recall_loss`); one step is forward, backward, gradient clipping and AdamW (`train_step`), the step
that models/ddp.py runs under DistributedDataParallel.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from impls import validate as check
from models.mamba2 import Mamba2Config
from models.mamba2_lm import Mamba2LM, Mamba2LMConfig
from models.recall import IGNORE, RecallBatch, RecallTask, recall_batch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}
# Mixed precision (`TrainConfig.autocast`): the forward under torch.autocast in this dtype, its matrix products and
# the SSD's inputs in it, the parameters, their gradients and AdamW's moments in float32 (the master weights)
AUTOCAST = {"bfloat16": torch.bfloat16}
# Why float16 parameters are not trained: AdamW keeps its moments in the parameters' dtype, and in float16 its eps
# (1e-8) rounds to 0 and a squared gradient below about 2e-4 underflows, so the step divides by zero
FLOAT16_ADAMW = ("float16 parameters: torch.optim.AdamW keeps its moments in float16, where eps (1e-8) rounds to 0 "
                 "and squared gradients below about 2e-4 underflow, so the step divides by zero (inf/NaN parameters); "
                 "use bfloat16 or float32")
EVAL_SEED = 2**31 - 1  # the accuracy's batch: one set for every seed and backend


@dataclass(frozen=True)
class ModelSizes:
    """The model: n_layer blocks of width d_model (expand 2, so d_inner = 2·d_model), the SSD's sizes, the glue."""

    n_layer: int = 2
    d_model: int = 128
    d_state: int = 32
    headdim: int = 16
    ngroups: int = 1
    chunk_size: int = 32
    glue: str = "torch"


@dataclass(frozen=True)
class OptimSettings:
    """AdamW and the run's length: `steps` steps of `batch` sequences; gradients clipped to norm `grad_clip` (None:
    not clipped); the accuracy measured on `eval_batch` sequences after the last step."""

    steps: int = 300
    batch: int = 32
    lr: float = 3e-3
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float | None = 1.0
    eval_batch: int = 256

    def __post_init__(self):
        for arg in ("steps", "batch", "eval_batch"):
            check.positive_int(arg, getattr(self, arg))
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))


@dataclass(frozen=True)
class TrainConfig:
    """One run's task, model, optimizer and parameter dtype (a name in DTYPES); `autocast` (a name in AUTOCAST, or
    None): mixed precision, the forward under torch.autocast in that dtype over float32 parameters."""

    task: RecallTask = field(default_factory=RecallTask)
    model: ModelSizes = field(default_factory=ModelSizes)
    optim: OptimSettings = field(default_factory=OptimSettings)
    dtype: str = "float32"
    autocast: str | None = None

    def __post_init__(self):
        if self.dtype == "float16":
            raise ValueError(f"dtype: a training run cannot take {FLOAT16_ADAMW}")
        if self.dtype not in DTYPES:
            check.fail("dtype", f"one of {sorted(DTYPES)}", repr(self.dtype))
        if self.autocast is not None and self.autocast not in AUTOCAST:
            check.fail("autocast", f"null or one of {sorted(AUTOCAST)}", repr(self.autocast))
        if self.autocast is not None and self.dtype != "float32":
            check.fail("dtype", f"float32 with autocast={self.autocast!r} (the master weights AdamW updates)",
                       repr(self.dtype))
        if self.task.seqlen > 1024:
            check.fail("task", "at most 1024 tokens per sequence (2·(n_pairs + n_queries))", self.task.seqlen)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        """From nested plain dicts (a config file's); an unknown key raises TypeError naming it."""
        optim = dict(d.get("optim", {}))
        if "betas" in optim:
            optim["betas"] = tuple(optim["betas"])
        return cls(task=RecallTask(**d.get("task", {})), model=ModelSizes(**d.get("model", {})),
                   optim=OptimSettings(**optim), dtype=d.get("dtype", "float32"), autocast=d.get("autocast"))

    def precision(self, device) -> contextlib.AbstractContextManager:
        """The forward's context: torch.autocast on `device` in the `autocast` dtype, or nothing."""
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(torch.device(device).type, dtype=AUTOCAST[self.autocast])


@dataclass(frozen=True)
class Curve:
    """One run: the loss after each step's forward (step 1 … steps), the final recall accuracy, what ran."""

    backend: str
    seed: int
    losses: tuple[float, ...]
    accuracy: float
    describe: dict
    seconds: float


def lm_config(config: TrainConfig) -> Mamba2LMConfig:
    m = config.model
    layer = Mamba2Config(d_model=m.d_model, d_state=m.d_state, headdim=m.headdim, ngroups=m.ngroups,
                         chunk_size=m.chunk_size)
    return Mamba2LMConfig(vocab_size=config.task.vocab_size, n_layer=m.n_layer, layer=layer)


def build_model(config: TrainConfig, backend, seed: int, device, switches=None) -> Mamba2LM:
    """The model with its parameters drawn on the CPU from `seed` (the same on every backend), moved to `device`."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Mamba2LM(lm_config(config), backend, switches, device="cpu", dtype=config.torch_dtype,
                         glue=config.model.glue)
    return model.to(device)


def make_optimizer(model: nn.Module, optim: OptimSettings) -> torch.optim.AdamW:
    return torch.optim.AdamW(model.parameters(), lr=optim.lr, betas=optim.betas, eps=optim.eps,
                             weight_decay=optim.weight_decay)


def recall_loss(model: nn.Module, batch: RecallBatch) -> torch.Tensor:
    """The mean cross-entropy (fp32) over the batch's recall targets; `model` maps ids to logits (a Mamba2LM or
    its DistributedDataParallel wrapper)."""
    logits = model(batch.input_ids)
    work = torch.float64 if logits.dtype == torch.float64 else torch.float32
    return F.cross_entropy(logits.flatten(0, 1).to(work), batch.targets.flatten(), ignore_index=IGNORE)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: RecallBatch,
               grad_clip: float | None, precision: contextlib.AbstractContextManager | None = None) -> float:
    """One step: gradients set afresh, the loss's backward, clipping to `grad_clip`, the optimizer's step; -> the
    loss before the step. `precision`: the forward's context (`TrainConfig.precision`); the backward runs outside
    it, as torch.autocast asks."""
    optimizer.zero_grad(set_to_none=True)
    with precision or contextlib.nullcontext():
        loss = recall_loss(model, batch)
    loss.backward()
    if grad_clip is not None:
        nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return loss.item()


def recall_accuracy(model: Mamba2LM, batch: RecallBatch,
                    precision: contextlib.AbstractContextManager | None = None) -> float:
    """The share of recall targets whose most likely token (over the task's vocabulary) is the right value, the
    forward in `precision`'s context as in training."""
    with torch.no_grad(), precision or contextlib.nullcontext():
        logits = model(batch.input_ids)[..., :model.config.vocab_size]
    asked = batch.targets != IGNORE
    return (logits.argmax(-1)[asked] == batch.targets[asked]).float().mean().item()


def data_generator(seed: int) -> torch.Generator:
    """The training batches' generator of a seed (apart from the parameters' draw)."""
    return torch.Generator().manual_seed(1_000_003 * (seed + 1))


def train(config: TrainConfig, backend: str, seed: int, device, switches=None,
          on_step: Callable[[int, float], None] | None = None) -> Curve:
    """Trains a fresh model for config.optim.steps steps; `on_step(step, loss)` after each. -> its Curve."""
    device = torch.device(device)
    model = build_model(config, backend, seed, device, switches)
    optimizer = make_optimizer(model, config.optim)
    gen = data_generator(seed)
    losses = []
    start = time.perf_counter()
    for step in range(1, config.optim.steps + 1):
        batch = recall_batch(config.task, config.optim.batch, gen).to(device)
        losses.append(train_step(model, optimizer, batch, config.optim.grad_clip, config.precision(device)))
        if on_step is not None:
            on_step(step, losses[-1])
    seconds = time.perf_counter() - start
    held_out = recall_batch(config.task, config.optim.eval_batch, torch.Generator().manual_seed(EVAL_SEED))
    accuracy = recall_accuracy(model, held_out.to(device), config.precision(device))
    return Curve(backend, seed, tuple(losses), accuracy, model.describe(), seconds)


def as_dict(config: TrainConfig) -> dict:
    return dataclasses.asdict(config)
