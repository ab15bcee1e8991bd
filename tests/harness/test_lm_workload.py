"""Workload mamba2_lm (harness/workloads/mamba2_lm.py): the language model's prefill and training step through the
pipeline, gated against lm_float64; planted faults fail the gate; bad options are refused naming the option."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from experiments import bench
from harness import plan, store, workloads
from harness.workloads import Backward, Step, Workload
from harness.workloads import mamba2_lm as lm_workload
from impls.problem import Problem, Shape
from impls.stages import Stage
from models.mamba2_lm import Mamba2LM

REPO = next(p for p in Path(__file__).resolve().parents if (p / "conf" / "config.yaml").is_file())
TINY = Shape(2, 96, 4, 16, 2, 16, 32)  # conf/shape/tiny.yaml
FP32 = Problem(TINY, dtype="float32")
QUICK = plan.BenchSettings(stages=("forward",), cpu_warmup=0, cpu_reps=1)


def _measure(direction: str, problem: Problem = FP32, **options):
    return bench.measure(plan.point("reference", problem, workload="mamba2_lm", direction=direction, bench=QUICK,
                                    workload_options=options or None))


@pytest.mark.parametrize("direction", ["forward", "train_step"])
def test_both_directions_store_gated_rows_with_tokens_per_second(direction, tmp_path):
    rows = _measure(direction, Problem(TINY, dtype="bfloat16"))
    assert rows.status == "ok", rows.error
    store.write_rows(list(rows.rows), tmp_path, "lm")
    df = store.load(tmp_path)
    assert (df.query("metric == 'ok'")["value"] == 1).all() and set(df["reference"]) == {"float64"}
    assert set(df["workload"]) == {"mamba2_lm"} and set(df["direction"]) == {direction}
    point = df.iloc[0]
    assert (point["d_model"], point["n_layer"], point["vocab_size"], point["glue"], point["expand"]) == (
        32, 2, 512, "torch", 2)
    timed = df.set_index(["stage", "metric"])["value"]
    assert timed[(direction, "tokens_per_s")] * timed[(direction, "median_ms")] * 1e-3 == pytest.approx(2 * 96)
    assert (direction, "peak_mem_bytes") in timed.index  # measured on the GPU; NaN with its reason on the CPU
    if direction == "train_step":
        gated = set(df.query("metric == 'bound_ratio'")["stage"])
        assert {"forward", "train_step", "grad:dembedding.weight", "grad:dlayers.1.mixer.A_log",
                "grad:dnorm_f.weight"} <= gated


def _scaled_logits(monkeypatch):
    forward = Mamba2LM.forward
    monkeypatch.setattr(Mamba2LM, "forward", lambda self, ids, **kw: forward(self, ids, **kw) * 1.001)


def _scaled_loss(monkeypatch):
    loss = Mamba2LM.loss
    monkeypatch.setattr(Mamba2LM, "loss", lambda self, ids, **kw: loss(self, ids, **kw) * 1.001)


def _one_update_skipped(monkeypatch):
    """A train step that leaves layers.0.norm.weight as it was."""
    step = lm_workload.adamw_step

    def skipping(model, ids, optimizer, *precision):
        kept = model.layers[0].norm.weight.detach().clone()
        step(model, ids, optimizer, *precision)
        with torch.no_grad():
            model.layers[0].norm.weight.copy_(kept)

    monkeypatch.setattr(lm_workload, "adamw_step", skipping)


@pytest.mark.parametrize("plant, direction, failed", [
    pytest.param(_scaled_logits, "forward", {"forward"}, id="logits-scaled"),
    pytest.param(_scaled_loss, "train_step", {"grad:dembedding.weight", "grad:dlayers.1.mixer.in_proj.weight"},
                 id="loss-scaled"),
    pytest.param(_one_update_skipped, "train_step", {"train_step"}, id="one-parameter-not-updated"),
])
def test_a_planted_fault_fails_the_gate_and_nothing_is_timed(plant, direction, failed, monkeypatch):
    plant(monkeypatch)
    rows = _measure(direction)
    df = rows.frame()
    assert rows.status == "failed" and "GateFailure" in rows.error
    bad = set(df.query("metric == 'ok' and value == 0")["stage"]) - {"point"}
    assert failed <= bad
    if plant is _one_update_skipped:
        assert bad == {"train_step"}, bad  # the gradients are right: only the step is wrong
    assert not df["metric"].str.endswith("_ms").any()


def _zeroed_decay_gradient(monkeypatch):
    """Every layer's SSD given A = -exp(A_log) with its gradient zeroed (present, all zeros: not missing)."""
    from models.mamba2 import Mamba2

    kwargs = Mamba2.ssd_kwargs

    def zeroed(self, *args, **kw):
        out = kwargs(self, *args, **kw)
        return {**out, "A": out["A"].detach() + 0 * out["A"]}

    monkeypatch.setattr(Mamba2, "ssd_kwargs", zeroed)


def test_a_zeroed_decay_gradient_fails_the_bfloat16_gate(monkeypatch):
    """dA_log is orders below the model's gradient, so the share bound accepts any error of its size: in bf16 a zero
    dA_log erred 3.5e-4 of the tolerance's 0.02 and passed, the AdamW step's parameters too. It must still be
    nearer its float64 value than a zero gradient is."""
    _zeroed_decay_gradient(monkeypatch)
    rows = _measure("train_step", Problem(TINY, dtype="bfloat16"))
    assert rows.status == "failed"
    failed = set(rows.frame().query("metric == 'ok' and value == 0")["stage"]) - {"point"}
    assert {"grad:dlayers.0.mixer.A_log", "grad:dlayers.1.mixer.A_log"} <= failed, failed


@pytest.mark.quick
@pytest.mark.parametrize("scale, ok", [pytest.param(1.01, True, id="1pc-off"), pytest.param(0.0, False, id="zero"),
                                       pytest.param(-1.0, False, id="negated")])
def test_a_gradient_below_its_share_must_beat_a_zero_gradient(scale, ok):
    """share 1e4 × the gradient's norm: the share bound alone (0.02) passes all three."""
    expected = torch.linspace(-1.0, 2.0, 12, dtype=torch.float64)
    share = 1e4 * torch.linalg.vector_norm(expected).item()
    judged = lm_workload.share_judge((scale * expected).float(), expected, share, 0.02)
    assert judged.ok == ok, judged


@pytest.mark.quick
@pytest.mark.parametrize("scale, ok", [pytest.param(1.03, True, id="3pc-off"), pytest.param(0.5, False, id="halved"),
                                       pytest.param(1.3, False, id="30pc-off")])
def test_a_gradient_below_its_share_is_held_to_what_its_precision_achieves(scale, ok):
    """The same-precision computation erring 1 %: 4 x that (4 %) is allowed, a halved or 30 %-off gradient is not,
    though the share bound alone (0.02 of a share 1e4 x its norm) passes all three and each beats a zero gradient."""
    expected = torch.linspace(-1.0, 2.0, 12, dtype=torch.float64)
    share = 1e4 * torch.linalg.vector_norm(expected).item()
    same = expected * 1.01
    assert lm_workload.share_judge((scale * expected).float(), expected, share, 0.02).ok
    judged = lm_workload.share_judge((scale * expected).float(), expected, share, 0.02, same)
    assert judged.ok == ok, judged


@pytest.mark.quick
@pytest.mark.parametrize("options, named", [
    pytest.param({"n_layer": 0}, r"^workload.options.n_layer: expected null or an int >= 1", id="n_layer-zero"),
    pytest.param({"vocab_size": "big"}, r"^workload.options.vocab_size", id="vocab_size-not-int"),
    pytest.param({"size": "mamba2_9b"}, r"^workload.options.size: expected null or one of", id="size-unknown"),
    pytest.param({"size": "mamba2_130m"}, r"^shape: workload.options.size='mamba2_130m' has d_model 768",
                 id="size-not-the-shapes"),
    pytest.param({"glue": "cuda"}, r"^workload.options.glue: expected one of", id="glue-unknown"),
    pytest.param({"layers": 3}, r"workload.options: \['layers'\]", id="unknown-option"),
    pytest.param({"glue": "triton", "d_conv": 5}, r"^workload.options.d_conv: glue='triton' cannot run it: d_conv 5",
                 id="d_conv-wider-than-the-triton-glue"),
    pytest.param({"expand": 3}, r"^shape: nheads·headdim", id="expand-not-dividing"),
    pytest.param({"gate_tokens": 0}, r"^workload.options.gate_tokens: expected null or an int in \[1, seqlen=96\]",
                 id="gate_tokens-zero"),
    pytest.param({"gate_tokens": 97}, r"^workload.options.gate_tokens", id="gate_tokens-past-seqlen"),
    pytest.param({"compile": "reduce-overhead"}, r"^workload.options.compile: expected null \(eager\) or one of",
                 id="compile-mode-unknown"),
    pytest.param({"autocast": "bfloat16"}, r"^workload.options.autocast: expected true or false",
                 id="autocast-not-bool"),
    pytest.param({"autocast": True}, r"^workload.options.autocast: .*needs dtype bfloat16 or float16, got float32",
                 id="autocast-over-float32"),
])
def test_bad_options_are_refused_naming_the_option(options, named):
    with pytest.raises(ValueError, match=named):
        plan.point("reference", FP32, workload="mamba2_lm", workload_options=options)


@pytest.mark.parametrize("plant, direction, failed", [
    pytest.param(_scaled_logits, "forward", {"forward"}, id="logits-scaled"),
    pytest.param(_scaled_loss, "train_step", {"grad:dembedding.weight"}, id="loss-scaled"),
])
def test_the_prefix_gate_judges_the_first_rows_prefix_and_says_so(plant, direction, failed, monkeypatch, tmp_path):
    rows = _measure(direction, gate_tokens=40)
    assert rows.status == "ok", rows.error
    df = rows.frame()
    gated = df.query("metric == 'ok' and stage != 'point'")
    assert gated["gate"].str.contains("first row's first 40 tokens").all(), set(gated["gate"])
    plant(monkeypatch)
    rows = _measure(direction, gate_tokens=40)
    assert rows.status == "failed"
    assert failed <= set(rows.frame().query("metric == 'ok' and value == 0")["stage"])


@pytest.mark.quick
@pytest.mark.parametrize("shape, dtype, options, named", [
    pytest.param(dataclasses.replace(TINY, seqlen=1), "float32", {},
                 r"^shape.seqlen: direction train_step needs >= 2 tokens", id="seqlen-1"),
    pytest.param(TINY, "float32", {"gate_tokens": 1}, r"^workload.options.gate_tokens: direction train_step needs",
                 id="gate_tokens-1"),
    pytest.param(TINY, "float16", {}, r"^dtype: direction train_step cannot take float16 parameters: .*eps \(1e-8\)",
                 id="float16-adamw"),
    pytest.param(TINY, "float16", {"autocast": True}, r"^dtype: direction train_step under workload.options.autocast "
                 r"in float16 needs a gradient scaler", id="float16-autocast-unscaled"),
])
def test_a_training_step_that_cannot_be_right_is_refused_naming_the_setting(shape, dtype, options, named):
    """One token has no next token: the loss would be 0/0 and its gradients zero on both sides of the gate, a gate
    that cannot fail. AdamW on float16 parameters divides by zero (its eps rounds to 0 in float16). The forward
    direction (prefill) still runs at all of them."""
    with pytest.raises(ValueError, match=named):
        plan.point("reference", Problem(shape, dtype=dtype), workload="mamba2_lm", direction="train_step",
                   workload_options=options)
    plan.point("reference", Problem(shape, dtype=dtype), workload="mamba2_lm", direction="forward",
               workload_options=options)


def test_float16_adamw_is_what_the_refusal_says():
    """The reason for refusing float16: one AdamW step of the float16 model leaves non-finite parameters (the
    float32 model's step does not)."""
    ids = torch.randint(0, 512, (2, 96), generator=torch.Generator().manual_seed(0))
    finite = {}
    for dtype in (torch.float16, torch.float32):
        torch.manual_seed(0)
        model = Mamba2LM(lm_workload.lm_config(FP32, lm_workload.OPTIONS), dtype=dtype)
        lm_workload.adamw_step(model, ids, torch.optim.AdamW(model.parameters(), **lm_workload.ADAMW))
        finite[dtype] = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    assert finite == {torch.float16: False, torch.float32: True}


def test_a_size_sets_the_depth_and_vocabulary_and_refuses_them_given_too():
    shape = Shape(1, 256, 24, 64, 1, 128, 256)  # mamba2_130m's layer: d_model 768
    config = lm_workload.lm_config(Problem(shape), {**lm_workload.OPTIONS, "size": "mamba2_130m"})
    assert (config.d_model, config.n_layer, config.vocab_size) == (768, 24, 50277)
    with pytest.raises(ValueError, match="^workload.options.n_layer: set by workload.options.size"):
        lm_workload.lm_config(Problem(shape), {**lm_workload.OPTIONS, "size": "mamba2_130m", "n_layer": 4})


def test_the_config_composes_and_refuses_a_direction_the_workload_lacks():
    from hydra import compose, initialize_config_dir

    from harness import config as conf
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = compose("config", overrides=["workload=mamba2_lm", "shape=tiny", "direction=train_step"])
        assert list(cfg.bench.stages) == ["forward"]
        conf.validate(cfg)
        with pytest.raises(conf.ConfigError, match="direction: workload 'mamba2_lm' has"):
            conf.validate(compose("config", overrides=["workload=mamba2_lm", "shape=tiny", "direction=backward"]))
        with pytest.raises(conf.ConfigError, match="direction: workload 'mamba2_layer' has"):
            conf.validate(compose("config", overrides=["workload=mamba2_layer", "shape=tiny",
                                                       "direction=train_step"]))


@pytest.mark.quick
def test_a_stepped_direction_needs_a_step_declared():
    args = dict(stages=(), forward=Stage("forward", ("y",), lambda b, kw, got: (kw["x"],)), inputs=None,
                arguments=dict, reference=None, backward=Backward(leaves=dict, call=None, incoming=None))
    with pytest.raises(ValueError, match="need a Step each in `steps`"):
        Workload(name="stepless", directions=("forward", "train_step"), **args)
    with pytest.raises(ValueError, match="need a Step each in `steps`"):
        Workload(name="undeclared", directions=("forward",), steps={"train_step": Step(dict, dict)}, **args)
    assert "train_step" not in workloads.DIRECTIONS and "train_step" in workloads.STEPPED


def test_a_compiled_model_is_gated_and_timed_compiled_and_its_rows_say_so():
    """workload.options.compile: the module's call compiled in place, so the timed prefill and the gate run the
    compiled graphs (dynamo's frame counter moves), and the rows name the mode."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    before = counters["stats"]["unique_graphs"]
    rows = _measure("forward", compile="default")
    assert rows.status == "ok", rows.error
    assert counters["stats"]["unique_graphs"] > before
    df = rows.frame()
    assert set(df["compile"]) == {"default"}
    assert (df.query("metric == 'ok'")["value"] == 1).all()


@pytest.mark.parametrize("direction", ["forward", "train_step"])
def test_mixed_precision_keeps_float32_parameters_and_runs_the_ssd_in_the_problems_dtype(direction, monkeypatch):
    """Option autocast: the parameters (and after a step, AdamW's moments) in float32, the SSD called with bfloat16
    inputs under torch.autocast, the gate at bfloat16's tolerance, the rows saying autocast; the same point without
    it trains bfloat16 parameters."""
    import impls

    seen = []
    ssd = impls.ssd

    def spying(*args, **kwargs):
        seen.append(kwargs["x"].dtype)
        return ssd(*args, **kwargs)

    monkeypatch.setattr(impls, "ssd", spying)
    bf16 = Problem(TINY, dtype="bfloat16")
    point = plan.point("reference", bf16, workload="mamba2_lm", direction=direction, bench=QUICK,
                       workload_options={"autocast": True})
    built = plan.build(point)
    assert {p.dtype for p in built.inputs.model.parameters()} == {torch.float32}
    rows = bench.measure(point)
    assert rows.status == "ok", rows.error
    df = rows.frame()
    assert set(df["autocast"]) == {True} and set(df["dtype"]) == {"bfloat16"}
    assert seen and set(seen) == {torch.bfloat16}
    assert df.query("metric == 'ok' and stage != 'point'")["gate"].notna().all()
    plain = _measure(direction, bf16)
    assert plain.status == "ok" and set(plain.frame()["autocast"]) == {False}
