"""Our Mamba-2 LM against upstream's MambaLMHeadModel from the same weights (models/upstream.py): the parameter
mapping, what it refuses, and the logits on the CPU (upstream's Triton kernels in the interpreter)."""

from __future__ import annotations

import pytest
import torch

from impls.mamba_ssm.upstream import interpreter_mode, interpreting
from impls.tolerance import rel_err
from models.mamba2 import Mamba2Config
from models.mamba2_lm import Mamba2LM, Mamba2LMConfig, next_token_loss
from models.upstream import (
    check_same_weights,
    load_weights,
    mamba_config,
    parameter_pairs,
    upstream_from,
    upstream_modules,
    upstream_name,
)

# vocab 50 pads to 64 with our multiple of 16, to 56 with upstream's default 8: the padding must be passed
TINY = Mamba2LMConfig(vocab_size=50, n_layer=2, layer=Mamba2Config(d_model=32, d_state=8, headdim=16, ngroups=2,
                                                                     chunk_size=16))
PER_LAYER = ("norm.weight", "mixer.in_proj.weight", "mixer.conv1d.weight", "mixer.conv1d.bias", "mixer.dt_bias",
             "mixer.A_log", "mixer.D", "mixer.norm_weight", "mixer.out_proj.weight")


def _pair(seed=0, config=TINY):
    torch.manual_seed(seed)
    model = Mamba2LM(config, dtype=torch.float32)
    return model, upstream_from(model)


def test_the_mapping_covers_every_parameter_of_both_models_once():
    model, upstream = _pair()
    pairs = parameter_pairs(model, upstream)
    expected = {"embedding.weight", "norm_f.weight"} | {f"layers.{i}.{n}" for i in range(2) for n in PER_LAYER}
    assert {p.ours for p in pairs} == expected == set(dict(model.named_parameters()))
    assert sorted(p.upstream for p in pairs) == sorted(dict(upstream.named_parameters()))
    assert upstream.lm_head.weight is upstream.backbone.embedding.weight  # tied, as ours
    assert upstream.lm_head.weight.shape == (64, 32)
    check_same_weights(model, upstream)  # shapes, dtypes (A_log, dt_bias fp32) and values


def test_the_config_carries_every_field():
    model = Mamba2LM(TINY, dtype=torch.float32)
    c = mamba_config(model)
    assert (c.d_model, c.n_layer, c.vocab_size, c.pad_vocab_size_multiple, c.d_intermediate) == (32, 2, 50, 16, 0)
    assert c.rms_norm and c.residual_in_fp32 and c.fused_add_norm and c.tie_embeddings
    ssm = c.ssm_cfg
    assert (ssm["layer"], ssm["d_state"], ssm["headdim"], ssm["ngroups"], ssm["chunk_size"], ssm["expand"],
            ssm["d_conv"], ssm["use_mem_eff_path"]) == ("Mamba2", 8, 16, 2, 16, 2, 4, False)


def _swap_in_and_out_proj(name: str) -> str:
    return upstream_name(name.replace("in_proj", "TMP").replace("out_proj", "in_proj").replace("TMP", "out_proj"))


def _drop_norm_f(name: str) -> str:
    return upstream_name(name).replace("backbone.norm_f", "backbone.layers.0.norm")


@pytest.mark.parametrize("name_map, message", [
    (_swap_in_and_out_proj, r"layers\.0\.mixer\.in_proj\.weight: shape"),
    (_drop_norm_f, "mapped more than once"),
    (lambda n: upstream_name(n).replace("conv1d", "conv"), r"layers\.0\.mixer\.conv1d\.weight maps to"),
], ids=["swapped-projections", "two-onto-one", "unknown-name"])
def test_a_wrong_mapping_raises_naming_the_parameter(name_map, message):
    model, upstream = _pair()
    with pytest.raises(ValueError, match=message):
        load_weights(model, upstream, name_map)


def test_a_changed_weight_is_caught():
    model, upstream = _pair()
    with torch.no_grad():
        w = upstream.backbone.layers[1].mixer.out_proj.weight
        w.copy_(w.T.reshape(w.shape))  # the same values, laid out transposed
    with pytest.raises(ValueError, match=r"layers\.1\.mixer\.out_proj\.weight"):
        check_same_weights(model, upstream)


@pytest.mark.parametrize("change, arg", [
    (dict(norm_eps=1e-6), "norm_eps"),
    (dict(layer=Mamba2Config(d_model=32, d_state=8, headdim=16, chunk_size=16, norm_eps=1e-6)), "layer.norm_eps"),
], ids=["norm-eps", "gated-norm-eps"])
def test_an_unmatchable_config_raises_naming_it(change, arg):
    fields = dict(vocab_size=50, n_layer=1, layer=TINY.layer) | change
    with pytest.raises(ValueError, match=f"^{arg}:"):
        mamba_config(Mamba2LM(Mamba2LMConfig(**fields), dtype=torch.float32))


def test_a_float64_model_raises():
    with pytest.raises(ValueError, match="^dtype:"):
        mamba_config(Mamba2LM(TINY, dtype=torch.float64))


def _upstream_logits(upstream, ids):
    with torch.no_grad(), interpreter_mode(upstream_modules()):
        return upstream(ids).logits


@pytest.mark.skipif(not interpreting(), reason="upstream's Triton kernels need TRITON_INTERPRET=1 on the CPU")
def test_logits_match_upstream_in_fp32():
    model, upstream = _pair(seed=3)
    ids = torch.randint(0, TINY.vocab_size, (1, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours = model(ids)
    assert rel_err(_upstream_logits(upstream, ids), ours) < 1e-5
    with torch.no_grad():  # two same-shape tensors swapped: loads, and the logits show it
        mixer = upstream.backbone.layers[0].mixer
        mixer.A_log, mixer.dt_bias = mixer.dt_bias, mixer.A_log
    assert rel_err(_upstream_logits(upstream, ids), ours) > 1e-3


@pytest.mark.slow  # about 3 s in the interpreter: upstream's backward kernels
@pytest.mark.skipif(not interpreting(), reason="upstream's Triton kernels need TRITON_INTERPRET=1 on the CPU")
def test_gradients_match_upstream_in_fp32():
    model, upstream = _pair(seed=4)
    ids = torch.randint(0, TINY.vocab_size, (1, 20), generator=torch.Generator().manual_seed(4))
    model.loss(ids).backward()
    with interpreter_mode(upstream_modules()):
        next_token_loss(upstream(ids).logits, ids).backward()
    theirs, ours = dict(upstream.named_parameters()), dict(model.named_parameters())
    errors = {p.ours: rel_err(ours[p.ours].grad, theirs[p.upstream].grad) for p in parameter_pairs(model, upstream)}
    assert len(errors) == len(ours) and max(errors.values()) < 1e-5, errors
