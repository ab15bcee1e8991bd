"""Our Mamba-2 LM (models/mamba2_lm.py, SSD on the mamba_ssm and triton backends) against upstream's
MambaLMHeadModel (use_mem_eff_path=False) from the same weights on the GPU, in bf16: logits at a small size and at
the mamba2_130m preset's width with two layers, and one training step's gradients at the small size. The bound:
models/upstream.py `bf16_logits_bound`; both bf16 runs are also held to it against our model in fp32."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import impls
from impls.tolerance import rel_err
from models.mamba2 import Mamba2Config
from models.mamba2_lm import Mamba2LM, Mamba2LMConfig, next_token_loss, preset
from models.upstream import bf16_logits_bound, parameter_pairs, upstream_from

SMALL = Mamba2LMConfig(vocab_size=1000, n_layer=2, layer=Mamba2Config(d_model=256, d_state=64, headdim=64, ngroups=2,
                                                                        chunk_size=256))
CONFIGS = {"small": (SMALL, (2, 1000)), "130m-width-2-layers": (dataclasses.replace(preset("mamba2_130m"), n_layer=2),
                                                                 (2, 1024))}
BACKENDS = ["mamba_ssm", "triton"]


def models_or_skip(config: Mamba2LMConfig, backend: str):
    """Our model in fp32 and in bf16 (the same weights) and upstream's in bf16 from them."""
    try:
        torch.manual_seed(0)
        fp32 = Mamba2LM(config, backend, device="cuda", dtype=torch.float32)
        bf16 = Mamba2LM(config, backend, device="cuda", dtype=torch.bfloat16)
    except impls.BackendUnavailable as exc:
        pytest.skip(str(exc))
    bf16.load_state_dict(fp32.state_dict())  # A_log, dt_bias, D stay fp32 in both
    return fp32, bf16, upstream_from(bf16)


def _ids(config, shape, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, config.vocab_size, shape, generator=gen).cuda()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("size", list(CONFIGS))
def test_bf16_logits_match_upstream(size, backend):
    config, shape = CONFIGS[size]
    fp32, ours, upstream = models_or_skip(config, backend)
    ids = _ids(config, shape)
    with torch.no_grad():
        want, got, theirs = fp32(ids), ours(ids), upstream(ids).logits
    bound = bf16_logits_bound(config.n_layer)
    errors = {"ours-upstream": rel_err(got, theirs), "ours-fp32": rel_err(got, want),
              "upstream-fp32": rel_err(theirs, want)}
    print(size, backend, errors, "bound", bound)
    assert max(errors.values()) < bound, (errors, bound)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_training_steps_gradients_match_upstream(backend):
    _, ours, upstream = models_or_skip(SMALL, backend)
    ids = _ids(SMALL, (2, 1000), seed=2)
    ours.loss(ids).backward()
    next_token_loss(upstream(ids).logits, ids).backward()
    theirs = dict(upstream.named_parameters())
    errors = {p.ours: rel_err(dict(ours.named_parameters())[p.ours].grad, theirs[p.upstream].grad)
              for p in parameter_pairs(ours, upstream)}
    bound = 2 * bf16_logits_bound(SMALL.n_layer)  # a backward pass rounds about as often again
    print(backend, {k: f"{v:.2e}" for k, v in errors.items()}, "bound", bound)
    assert max(errors.values()) < bound, (errors, bound)
