"""The Mamba-2 language model (models/mamba2_lm.py): against its float64 ground truth, its gradients, a training
step, the released sizes, and what it refuses."""

from __future__ import annotations

import pytest
import torch

from impls.tolerance import rel_err
from models.mamba2 import Mamba2Config
from models.mamba2_lm import PRESETS, Mamba2LM, Mamba2LMConfig, lm_float64, next_token_loss, preset

TINY = Mamba2LMConfig(vocab_size=50, n_layer=2, layer=Mamba2Config(d_model=32, d_state=8, headdim=16, ngroups=2,
                                                                     chunk_size=16))


def _ids(batch=2, seqlen=40, seed=0):
    return torch.randint(0, TINY.vocab_size, (batch, seqlen), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-10), (torch.float32, 1e-4)], ids=["float64", "float32"])
def test_logits_match_the_float64_model(dtype, tol):
    torch.manual_seed(0)
    model = Mamba2LM(TINY, dtype=dtype)
    ids = _ids()
    with torch.no_grad():
        got, expected = model(ids), lm_float64(model, ids)
    assert got.shape == (2, 40, TINY.padded_vocab_size) and got.dtype == dtype
    assert rel_err(got, expected) < tol


def test_gradients_match_the_float64_models_autograd():
    torch.manual_seed(1)
    model = Mamba2LM(TINY, dtype=torch.float64)
    ids = _ids(seed=1)
    params = [p for p in model.parameters() if p.requires_grad]
    got = torch.autograd.grad(model.loss(ids), params)
    expected = torch.autograd.grad(next_token_loss(lm_float64(model, ids), ids), params)
    errors = [rel_err(g, e) for g, e in zip(got, expected)]
    assert len(errors) == len(list(model.parameters())) and max(errors) < 1e-9, errors


def test_a_training_step_lowers_the_loss_on_its_batch():
    torch.manual_seed(2)
    model = Mamba2LM(TINY, dtype=torch.float32)
    ids = _ids(seed=2)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(5):
        loss = model.loss(ids)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.05, losses


def test_int32_ids_give_the_int64_ids_logits_and_loss():
    """The model takes int32 ids (as its check says); its loss too (cross_entropy itself wants int64 targets)."""
    torch.manual_seed(3)
    model = Mamba2LM(TINY, dtype=torch.float32)
    ids = _ids(seed=3)
    with torch.no_grad():
        logits = model(ids)
        assert torch.equal(model(ids.int()), logits)
    assert next_token_loss(logits, ids.int()).item() == next_token_loss(logits, ids).item()


def test_the_lm_head_is_the_embedding():
    model = Mamba2LM(TINY)
    assert model.lm_head.weight is model.embedding.weight


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_released_sizes_have_their_parameter_counts(name):
    c = preset(name)
    d, inner, n = c.d_model, c.layer.d_inner, c.layer.d_state
    per_layer = (d * (2 * inner + 2 * n + c.layer.nheads)  # in_proj: z, x, B, C, dt
                 + c.layer.conv_dim * (c.layer.d_conv + 1) + 3 * c.layer.nheads + inner + inner * d + d)
    total = c.padded_vocab_size * d + c.n_layer * per_layer + d
    model = Mamba2LM(c, device="meta")  # the device argument, not a device context: after torch.compile has run in
    # the process a context's function mode sends every initialising op through Python, ~40 s for the 2.7b size
    assert sum(p.numel() for p in model.parameters()) == total
    assert c.padded_vocab_size == 50288


@pytest.mark.parametrize("ids, words", [
    pytest.param(torch.tensor([[0, 50]]), "token ids in [0, 50)", id="id-past-the-vocabulary"),
    pytest.param(torch.tensor([[0.0, 1.0]]), "input_ids", id="float-ids"),
    pytest.param(torch.zeros(1, 0, dtype=torch.long), "seqlen >= 1", id="empty"),
])
def test_bad_input_ids_are_refused_naming_the_argument(ids, words):
    with pytest.raises(ValueError, match="input_ids") as err:
        Mamba2LM(TINY)(ids)
    assert words in str(err.value)


def test_a_one_token_loss_is_refused_naming_input_ids():
    """The next-token loss of one token has no target: a mean over nothing (NaN), not a number to train on."""
    with pytest.raises(ValueError, match=r"^input_ids: expected seqlen >= 2 for a next-token loss"):
        Mamba2LM(TINY).loss(_ids(seqlen=1))
    with torch.no_grad():
        assert Mamba2LM(TINY)(_ids(seqlen=1)).shape == (2, 1, TINY.padded_vocab_size)  # its prefill still runs


@pytest.mark.parametrize("kwargs, arg", [
    pytest.param({"vocab_size": 0}, "vocab_size", id="no-vocabulary"),
    pytest.param({"n_layer": 1.5}, "n_layer", id="fractional-layers"),
    pytest.param({"layer": {"d_model": 32}}, "layer", id="layer-not-a-config"),
])
def test_bad_configs_are_refused_naming_the_field(kwargs, arg):
    fields = {"vocab_size": 50, "n_layer": 1, "layer": TINY.layer, **kwargs}
    with pytest.raises(ValueError, match=arg):
        Mamba2LMConfig(**fields)


@pytest.mark.parametrize("packing", ["cu_seqlens", "seq_idx"])
def test_a_packed_loss_predicts_each_token_from_its_own_sequence_only(packing):
    """Three sequences (17, 1 and 22 tokens) packed in one row: the loss is the mean over the 16 + 0 + 21 targets
    inside the sequences, as computed sequence by sequence (the last token of one never predicts the first of the
    next); a packing in which no sequence has two tokens has no target and raises."""
    torch.manual_seed(4)
    model = Mamba2LM(TINY, dtype=torch.float64)
    lengths = [17, 1, 22]
    ids = _ids(batch=1, seqlen=sum(lengths), seed=4)
    cu = torch.tensor([0, 17, 18, 40], dtype=torch.int32)
    seq = torch.repeat_interleave(torch.arange(3), torch.tensor(lengths)).unsqueeze(0).to(torch.int32)
    packed = {"cu_seqlens": cu} if packing == "cu_seqlens" else {"seq_idx": seq}
    logits = model(ids, **packed)
    parts = [(logits[:, a:b - 1], ids[:, a + 1:b]) for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()) if b - a > 1]
    total = sum(torch.nn.functional.cross_entropy(lg.flatten(0, 1), t.flatten(), reduction="sum") for lg, t in parts)
    expected = total / sum(t.numel() for _, t in parts)
    assert torch.allclose(next_token_loss(logits, ids, **packed), expected, rtol=1e-12)
    assert not torch.allclose(next_token_loss(logits, ids), expected, rtol=1e-6)  # unpacked, the boundaries leak
    single = {"cu_seqlens": torch.tensor([0, 1, 2], dtype=torch.int32)}
    with pytest.raises(ValueError, match="^input_ids: expected a packed sequence of >= 2 tokens"):
        next_token_loss(logits[:, :2], ids[:, :2], **single)
