"""A Mamba-2 language model on the project's layer (models/mamba2.py), its SSD on any registered backend.

    input_ids (batch, seqlen) -> embedding -> n_layer × [residual += Mamba2(RMSNorm(residual))] -> RMSNorm
                              -> LM head (the embedding's weight, tied) -> logits (batch, seqlen, padded vocab)

The residual stream is kept in fp32 (float64 in a float64 model) and each block reads it normalised in the model's
dtype, as Mamba-2's pre-norm blocks with `residual_in_fp32` do. Weights are random (nothing is downloaded): the
embedding and the projections from N(0, initializer_range²), each out_proj scaled by 1/sqrt(n_layer) (the
pre-norm residual rescaling of GPT-2 that Mamba-2 uses), the layer's own parameters as the layer initialises them.
The float64 ground truth of the whole model: `lm_float64` (every block through models/mamba2_reference.py).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from impls import validate as check
from impls.registry import Backend
from models.mamba2 import LAYER_DTYPES, Mamba2, Mamba2Config


@dataclass(frozen=True)
class Mamba2LMConfig:
    """The model's sizes: `layer` the block's (its d_model is the model's), the vocabulary padded up to a multiple
    of `pad_vocab_size_multiple` (the logits' width)."""

    vocab_size: int
    n_layer: int
    layer: Mamba2Config
    pad_vocab_size_multiple: int = 16
    norm_eps: float = 1e-5
    initializer_range: float = 0.02

    def __post_init__(self):
        for arg in ("vocab_size", "n_layer", "pad_vocab_size_multiple"):
            check.positive_int(arg, getattr(self, arg))
        if not isinstance(self.layer, Mamba2Config):
            check.fail("layer", "a Mamba2Config", type(self.layer).__name__)
        for arg in ("norm_eps", "initializer_range"):
            value = getattr(self, arg)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not (0 < value < math.inf):
                check.fail(arg, "a finite number > 0", repr(value))

    @property
    def d_model(self) -> int:
        return self.layer.d_model

    @property
    def padded_vocab_size(self) -> int:
        m = self.pad_vocab_size_multiple
        return -(-self.vocab_size // m) * m


# The released Mamba-2 language models' sizes (state-spaces/mamba's configs on the Hugging Face hub,
# state-spaces/mamba2-<size>/config.json): d_model, n_layer; headdim 64, d_state 128, ngroups 1, chunk 256, expand 2,
# vocabulary 50277 (GPT-NeoX's tokenizer) padded to a multiple of 16.
PRESETS: dict[str, tuple[int, int]] = {
    "mamba2_130m": (768, 24),
    "mamba2_370m": (1024, 48),
    "mamba2_780m": (1536, 48),
    "mamba2_1p3b": (2048, 48),
    "mamba2_2p7b": (2560, 64),
}


def preset(name: str, **layer_overrides) -> Mamba2LMConfig:
    """The config of a released size by name (PRESETS), the layer's fields overridable (e.g. chunk_size=128)."""
    if name not in PRESETS:
        check.fail("name", f"one of {sorted(PRESETS)}", repr(name))
    d_model, n_layer = PRESETS[name]
    return Mamba2LMConfig(vocab_size=50277, n_layer=n_layer, layer=Mamba2Config(d_model=d_model, **layer_overrides))


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps) · weight over the last dimension, in fp32 (float64 for float64), in `out_dtype`."""

    def __init__(self, size: int, eps: float, *, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        work = torch.float64 if x.dtype == torch.float64 else torch.float32
        v = x.to(work)
        return (v * torch.rsqrt(v.square().mean(-1, keepdim=True) + self.eps) * self.weight.to(work)).to(out_dtype)


class Block(nn.Module):
    """One pre-norm residual block: residual + mixer(norm(residual))."""

    def __init__(self, config: Mamba2LMConfig, backend, switches, *, device=None, dtype=None, glue: str = "torch"):
        super().__init__()
        self.norm = RMSNorm(config.d_model, config.norm_eps, device=device, dtype=dtype)
        self.mixer = Mamba2(config.layer, backend, switches, device=device, dtype=dtype, glue=glue)

    def forward(self, residual: torch.Tensor, dtype: torch.dtype, **packed) -> torch.Tensor:
        return residual + self.mixer(self.norm(residual, dtype), **packed).to(residual.dtype)


class Mamba2LM(nn.Module):
    """The language model (module docstring). `backend` (a registered name or a built `impls.Backend`, `switches`
    with a name) runs every layer's SSD; parameters in `dtype` (the layers' SSD parameters as the layer keeps them);
    `glue` how every layer runs its conv and norm (models/glue.py: "torch", "triton" or "compile")."""

    def __init__(self, config: Mamba2LMConfig, backend: str | Backend = "reference", switches=None, *, device=None,
                 dtype: torch.dtype | None = None, glue: str = "torch"):
        super().__init__()
        if not isinstance(config, Mamba2LMConfig):
            check.fail("config", "a Mamba2LMConfig", type(config).__name__)
        if dtype is not None and dtype not in LAYER_DTYPES:
            check.fail("dtype", f"None or one of {[str(d) for d in LAYER_DTYPES]}", repr(dtype))
        self.config = config
        kw = {"device": device, "dtype": dtype}
        self.embedding = nn.Embedding(config.padded_vocab_size, config.d_model, **kw)
        self.layers = nn.ModuleList(Block(config, backend, switches, glue=glue, **kw) for _ in range(config.n_layer))
        self.norm_f = RMSNorm(config.d_model, config.norm_eps, **kw)
        self.lm_head = nn.Linear(config.d_model, config.padded_vocab_size, bias=False, **kw)
        self.lm_head.weight = self.embedding.weight  # tied
        self._initialise()

    def _initialise(self) -> None:
        std = self.config.initializer_range
        with torch.no_grad():
            self.embedding.weight.normal_(0.0, std)
            for block in self.layers:
                block.mixer.in_proj.weight.normal_(0.0, std)
                block.mixer.out_proj.weight.normal_(0.0, std / math.sqrt(self.config.n_layer))

    @property
    def dtype(self) -> torch.dtype:
        return self.embedding.weight.dtype

    def forward(self, input_ids: torch.Tensor, *, seq_idx=None, cu_seqlens=None) -> torch.Tensor:
        """input_ids (batch, seqlen) of token ids in [0, vocab_size) -> logits (batch, seqlen, padded_vocab_size)
        in the model's dtype. seq_idx / cu_seqlens: packed sequences, as the layer takes them."""
        self._check_ids(input_ids)
        hidden = self.embedding(input_ids)
        residual = hidden.to(torch.float64 if self.dtype == torch.float64 else torch.float32)
        for block in self.layers:
            residual = block(residual, self.dtype, seq_idx=seq_idx, cu_seqlens=cu_seqlens)
        return self.lm_head(self.norm_f(residual, self.dtype))

    def loss(self, input_ids: torch.Tensor, **packed) -> torch.Tensor:
        """The mean next-token cross-entropy of `input_ids` (each position predicts the next one of its own sequence:
        with packed sequences, seq_idx or cu_seqlens, the last token of one does not predict the first of the next),
        in fp32."""
        logits = self(input_ids, **packed)
        return next_token_loss(logits, input_ids, **packed)

    def _check_ids(self, input_ids) -> None:
        check.tensor("input_ids", input_ids, shape=(None, None), dtypes=(torch.int64, torch.int32),
                     device=self.embedding.weight.device, device_of="the model's parameters")
        if input_ids.shape[0] < 1 or input_ids.shape[1] < 1:
            check.fail("input_ids", "batch >= 1 and seqlen >= 1", tuple(input_ids.shape))
        low, high = int(input_ids.min()), int(input_ids.max())
        if low < 0 or high >= self.config.vocab_size:
            check.fail("input_ids", f"token ids in [0, {self.config.vocab_size})", f"ids in [{low}, {high}]")

    def describe(self) -> dict:
        """The config, the parameters' dtype and count, and what the first layer's SSD and glue ran (every layer runs
        the same)."""
        return {"module": "models.mamba2_lm.Mamba2LM", "config": dataclasses.asdict(self.config),
                "param_dtype": str(self.dtype).replace("torch.", ""),
                "parameters": sum(p.numel() for p in self.parameters()),
                "ssd": self.layers[0].mixer.backend.describe(), "glue": self.layers[0].mixer.glue.describe()}


def next_token_loss(logits: torch.Tensor, input_ids: torch.Tensor, *, seq_idx: torch.Tensor | None = None,
                    cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
    """Mean cross-entropy of logits at positions 0 … L−2 against the ids at 1 … L−1, in fp32 (float64 for float64).
    With packed sequences (seq_idx (batch, L), or cu_seqlens over a batch of one) a position whose next token starts
    another sequence has no target and is left out of the mean. A sequence of one token has no target (the mean would
    be 0/0): it raises, naming input_ids; so does a packing in which no position has a target."""
    if input_ids.shape[-1] < 2:
        check.fail("input_ids", "seqlen >= 2 for a next-token loss", tuple(input_ids.shape))
    work = torch.float64 if logits.dtype == torch.float64 else torch.float32
    # the ids may be int32 (the model takes them): cross_entropy's targets must be int64
    targets = input_ids[:, 1:].long()
    same = _same_sequence(input_ids, seq_idx, cu_seqlens)
    if same is not None:
        if not bool(same.any()):
            check.fail("input_ids", "a packed sequence of >= 2 tokens for a next-token loss", "none")
        targets = targets.masked_fill(~same, -100)  # cross_entropy's ignore_index
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).to(work), targets.flatten())


def _same_sequence(input_ids: torch.Tensor, seq_idx: torch.Tensor | None,
                   cu_seqlens: torch.Tensor | None) -> torch.Tensor | None:
    """(batch, L − 1): whether position t + 1 is of the same packed sequence as t; None without packing."""
    if seq_idx is not None:
        return seq_idx[:, 1:] == seq_idx[:, :-1]
    if cu_seqlens is None:
        return None
    positions = torch.arange(1, input_ids.shape[-1], device=input_ids.device)
    starts = cu_seqlens[1:-1].to(input_ids.device)
    return ~torch.isin(positions, starts).expand(input_ids.shape[0], -1)


def lm_float64(model: Mamba2LM, input_ids: torch.Tensor) -> torch.Tensor:
    """The model's logits in float64 from its own parameters, every block through the float64 layer reference
    (models/mamba2_reference.py: the SSD as the sequential recurrence); differentiable."""
    from models.mamba2_reference import mamba2_float64

    f64 = torch.float64
    residual = model.embedding.weight.to(f64)[input_ids]
    for block in model.layers:
        normed = _rms_norm64(residual, block.norm)
        residual = residual + mamba2_float64(block.mixer, normed).out
    return _rms_norm64(residual, model.norm_f) @ model.embedding.weight.to(f64).T


def _rms_norm64(x: torch.Tensor, norm: RMSNorm) -> torch.Tensor:
    return x / torch.sqrt(x.square().mean(-1, keepdim=True) + norm.eps) * norm.weight.to(torch.float64)
