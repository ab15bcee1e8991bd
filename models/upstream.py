"""Upstream's `MambaLMHeadModel` (mamba-ssm) built with the same config as a `Mamba2LM` and loaded with its weights.

Upstream runs with `use_mem_eff_path=False` (its SSD through `mamba_chunk_scan_combined`, the conv through
`nn.Conv1d` when causal-conv1d is missing): the fused training path needs causal-conv1d's CUDA extension, which the
GPU bundle lacks. What differs between the two models, and how it is matched (`UPSTREAM_DIFFERENCES`); a
difference that cannot be matched raises, naming it.
"""

from __future__ import annotations

import importlib
import math
import types
from dataclasses import dataclass

import torch
from torch import nn

from models.mamba2_lm import Mamba2LM

# Upstream's fixed values: MambaLMHeadModel passes no norm epsilon (MixerModel's default), and its Mamba2 mixer builds
# the gated RMSNorm with eps=1e-5.
UPSTREAM_NORM_EPS = 1e-5
UPSTREAM_GATED_NORM_EPS = 1e-5

UPSTREAM_DIFFERENCES = (
    "vocabulary padding: upstream's default multiple is 8, ours 16 -> passed as ours",
    "norm eps: upstream's block and final RMSNorm always 1e-5 (MambaConfig has no field) -> ours must be 1e-5",
    "gated RMSNorm eps: upstream's mixer fixes it at 1e-5 -> ours (layer.norm_eps) must be 1e-5",
    "A_log and dt_bias: upstream keeps them in the model's dtype, ours in fp32 -> upstream's replaced by fp32 "
    "parameters (bf16 would round dt_bias and A_log)",
    "residual: upstream's fp32 residual (residual_in_fp32) is ours; its unfused add+norm (fused_add_norm=False) casts "
    "the residual to the model's dtype before the norm, ours normalises in fp32 -> fused_add_norm=True (upstream's "
    "default; a Triton kernel that adds and normalises in fp32)",
    "float64: upstream's residual_in_fp32 rounds the residual to fp32 -> a float64 model raises",
    "D per channel: ours D_per_channel, upstream's D_has_hdim -> passed",
    "no MLP (d_intermediate=0), no attention layers, tied embeddings, rms_norm -> passed",
    "packed sequences: upstream's conv without causal-conv1d refuses seq_idx -> not compared",
    "initialisation (initializer_range, out_proj scaling) differs -> irrelevant, our weights are loaded",
)


@dataclass(frozen=True)
class ParameterPair:
    """One of our parameters and the upstream parameter it loads into."""

    ours: str
    upstream: str


def mamba_config(model: Mamba2LM):
    """Upstream's MambaConfig with our model's sizes and options (UPSTREAM_DIFFERENCES); raises naming a field that
    upstream cannot take."""
    upstream_modules()
    from mamba_ssm.models.config_mamba import MambaConfig

    _check_matchable(model)
    c, layer = model.config, model.config.layer
    ssm_cfg = {"layer": "Mamba2", "d_state": layer.d_state, "d_conv": layer.d_conv, "expand": layer.expand,
               "headdim": layer.headdim, "ngroups": layer.ngroups, "chunk_size": layer.chunk_size,
               "dt_min": layer.dt_min, "dt_max": layer.dt_max, "dt_init_floor": layer.dt_init_floor,
               "A_init_range": layer.A_init_range, "dt_limit": layer.dt_limit, "D_has_hdim": layer.D_per_channel,
               "rmsnorm": True, "norm_before_gate": layer.norm_before_gate, "bias": layer.bias,
               "conv_bias": layer.conv_bias, "use_mem_eff_path": False}
    return MambaConfig(d_model=c.d_model, d_intermediate=0, n_layer=c.n_layer, vocab_size=c.vocab_size,
                       ssm_cfg=ssm_cfg, rms_norm=True, residual_in_fp32=True, fused_add_norm=True,
                       pad_vocab_size_multiple=c.pad_vocab_size_multiple, tie_embeddings=True)


def _check_matchable(model: Mamba2LM) -> None:
    if not isinstance(model, Mamba2LM):
        raise TypeError(f"model: expected a Mamba2LM, got {type(model).__name__}")
    if model.dtype == torch.float64:
        raise ValueError("dtype: upstream's residual_in_fp32 rounds the residual to fp32; build the model in fp32, "
                         "fp16 or bf16")
    if model.config.norm_eps != UPSTREAM_NORM_EPS:
        raise ValueError(f"norm_eps: upstream's block and final norms use {UPSTREAM_NORM_EPS}, "
                         f"got {model.config.norm_eps}")
    if model.config.layer.norm_eps != UPSTREAM_GATED_NORM_EPS:
        raise ValueError(f"layer.norm_eps: upstream's gated RMSNorm uses {UPSTREAM_GATED_NORM_EPS}, "
                         f"got {model.config.layer.norm_eps}")


def upstream_name(ours: str) -> str:
    """The upstream parameter our parameter `ours` loads into: the backbone's prefix, the gated norm's weight."""
    if ours.startswith("lm_head."):
        return ours
    return "backbone." + ours.replace("mixer.norm_weight", "mixer.norm.weight")


def parameter_pairs(model: Mamba2LM, upstream: nn.Module, name_map=upstream_name) -> list[ParameterPair]:
    """Every parameter of both models paired exactly once (tied ones once); raises naming a parameter left over on
    either side or mapped twice."""
    ours = dict(model.named_parameters())
    theirs = dict(upstream.named_parameters())
    pairs = [ParameterPair(name, name_map(name)) for name in ours]
    mapped = [p.upstream for p in pairs]
    twice = sorted({n for n in mapped if mapped.count(n) > 1})
    if twice:
        raise ValueError(f"mapping: upstream parameters mapped more than once: {twice}")
    missing = [p for p in pairs if p.upstream not in theirs]
    if missing:
        raise ValueError(f"mapping: {missing[0].ours} maps to {missing[0].upstream}, not an upstream parameter")
    left = sorted(set(theirs) - set(mapped))
    if left:
        raise ValueError(f"mapping: upstream parameters that none of ours loads: {left}")
    return pairs


def load_weights(model: Mamba2LM, upstream: nn.Module, name_map=upstream_name) -> list[ParameterPair]:
    """Copy our weights into `upstream` (shapes must agree; A_log and dt_bias become fp32 parameters as ours are);
    raises naming the parameter on any mismatch. -> the pairs loaded."""
    pairs = parameter_pairs(model, upstream, name_map)
    ours = dict(model.named_parameters())
    with torch.no_grad():
        for pair in pairs:
            _load_one(pair, ours[pair.ours], upstream)
    if upstream.lm_head.weight is not upstream.backbone.embedding.weight:
        raise ValueError("lm_head.weight: upstream's LM head is not tied to its embedding")
    return pairs


def _load_one(pair: ParameterPair, source: torch.Tensor, upstream: nn.Module) -> None:
    module_name, _, attr = pair.upstream.rpartition(".")
    module = upstream.get_submodule(module_name)
    target = getattr(module, attr)
    if tuple(target.shape) != tuple(source.shape):
        raise ValueError(f"{pair.ours}: shape {tuple(source.shape)}, upstream's {pair.upstream} "
                         f"{tuple(target.shape)}")
    if target.dtype != source.dtype:  # A_log, dt_bias: ours fp32, upstream's in the model's dtype
        setattr(module, attr, nn.Parameter(source.detach().clone(), requires_grad=target.requires_grad))
    else:
        target.copy_(source)


def check_same_weights(model: Mamba2LM, upstream: nn.Module, name_map=upstream_name) -> None:
    """Raise naming the first parameter whose values, shape or dtype differ between the two models."""
    theirs = dict(upstream.named_parameters())
    for name, p in model.named_parameters():
        q = theirs[name_map(name)]
        if q.dtype != p.dtype or q.shape != p.shape or not torch.equal(q, p):
            raise ValueError(f"{name}: differs from upstream's {name_map(name)}")


def upstream_modules() -> types.SimpleNamespace:
    """Upstream's Triton modules the LM runs (the SSD's, its two norms'), importable without its CUDA extension
    (impls/mamba_ssm/upstream.py); for `interpreter_mode` on the CPU."""
    from impls.mamba_ssm import upstream as ssd_upstream

    mods = vars(ssd_upstream.load())
    for name in ("layer_norm", "layernorm_gated"):
        mods[name] = importlib.import_module(f"mamba_ssm.ops.triton.{name}")
    return types.SimpleNamespace(**mods)


def upstream_from(model: Mamba2LM) -> nn.Module:
    """Upstream's MambaLMHeadModel with our model's config, on its device and in its dtype, holding its weights."""
    upstream_modules()
    from mamba_ssm.models.mixer_seq_simple import MambaLMHeadModel

    config = mamba_config(model)
    p = model.embedding.weight
    upstream = MambaLMHeadModel(config, device=p.device, dtype=p.dtype)
    load_weights(model, upstream)
    check_same_weights(model, upstream)
    if upstream.lm_head.weight.shape[0] != model.config.padded_vocab_size:  # pragma: no cover - padding rule
        raise ValueError(f"vocab_size: upstream padded to {upstream.lm_head.weight.shape[0]}, "
                         f"ours to {model.config.padded_vocab_size}")
    return upstream


def bf16_logits_bound(n_layer: int) -> float:
    """The relative RMS error allowed between two bf16 runs of the same model (tests/gpu). bf16 keeps 8 significant
    bits: each rounding errs by up to 2⁻⁸ relative. Each layer rounds to bf16 a few times (in_proj, conv, SSD output,
    gated norm, out_proj: about four roundings that reach the residual), in different places on the two sides (fused
    kernels or not), so the errors are independent and add like a random walk over the layers and the LM head:
    2⁻⁸ · 4 · sqrt(n_layer + 1), 2.7 % at two layers."""
    return 2.0 ** -8 * 4 * math.sqrt(n_layer + 1)
