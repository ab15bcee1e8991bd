"""Workloads as declarations the pipeline iterates over (harness/workloads/): a workload declared in this file
only, two stages and every direction, runs through plan → gate → time → record; the Mamba-2 layer is a workload
(gated against models/mamba2_reference.py in float64, stored as rows with its own columns, read by the analysis);
`python -m experiments.bench` stores gated rows of the SSD's backward and of the layer; what a workload refuses is
refused at start-up, naming it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from experiments import bench
from harness import config as conf
from harness import gate, measure_time, plan, record, store, workloads
from harness.correctness import FlatTruth, GateFailure
from harness.workloads import DIRECTIONS, Backward, Workload
from harness.workloads.mamba2_layer import layer_config
from impls.problem import Problem, Shape
from impls.reference.backend import ReferenceBackend
from impls.stages import Stage
from impls.tolerance import tolerance

REPO = Path(__file__).resolve().parents[2]
TINY = Problem(Shape(1, 32, 2, 8, 1, 8, 16), dtype="float32")


# --- a workload of this file only ----------------------------------------------------------------------------------
def _toy_inputs(point, backend) -> dict:
    s, gen = point.problem.shape, torch.Generator().manual_seed(point.seed)
    return {"x": torch.randn(s.batch, s.seqlen, s.nheads * s.headdim, generator=gen).to(point.problem.torch_dtype)}


def _scale(backend, kw, got):
    return (2.0 * kw["x"],)


def _square(backend, kw, got):
    return (got["h"] * got["h"],)


def _whole(backend, kw, got):
    return ((2.0 * kw["x"]).square(),)


def _toy_reference(plan_, requested):
    x = plan_.inputs["x"].double()
    tol = tolerance(plan_.dtype)
    return FlatTruth("float64", {"h": 2.0 * x, "y": (2.0 * x).square()},
                     dict.fromkeys(plan_.workload.stage_names, tol), plan_.precision, plan_.workload,
                     plan_.point.problem.shape.chunk_size)


def _toy_incoming(inputs, seed):
    gen = torch.Generator().manual_seed(seed)
    return {"y": torch.rand(inputs["x"].shape, generator=gen, dtype=torch.float64) + 0.5}


TOY = Workload(
    name="toy", stages=(Stage("scale", ("h",), _scale), Stage("square", ("y",), _square)),
    forward=Stage("forward", ("y",), _whole), directions=DIRECTIONS, inputs=_toy_inputs, arguments=dict,
    reference=_toy_reference, outputs={"y": lambda q, n: ((1, q, None), ("batch", "chunk", ""))},
    backward=Backward(leaves=lambda kw: {"x": kw["x"].detach().requires_grad_()},
                      call=lambda backend, kw, leaves: {"y": _whole(backend, leaves, {})[0]},
                      incoming=_toy_incoming,
                      reference=lambda inputs, g: {"dx": 8.0 * inputs["x"].double() * g["y"]}))


@pytest.fixture
def toy():
    workloads.register(TOY)
    yield TOY
    workloads.unregister(TOY.name)


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_a_workload_declared_here_runs_through_every_step(toy, direction, tmp_path):
    quick = plan.BenchSettings(stages=toy.stage_names, cpu_warmup=0, cpu_reps=1)
    point = plan.point("reference", TINY, seed=1, bench=quick, workload="toy", direction=direction)
    built = plan.build(point)
    report = gate.run(built)
    rows = record.rows(point, built, report, measure_time.run(built, report), error=None)
    df = store.load(record.write(rows, point, record.Output(results_dir=tmp_path)))
    assert set(df["workload"]) == {"toy"} and set(df["direction"]) == {direction} and set(df["status"]) == {"ok"}
    gated = set(df.query("metric == 'ok' and value == 1")["stage"])
    timed = set(df.query("metric == 'median_ms'")["stage"])
    assert gated == {"scale", "square", "forward", "point"} | ({"grad:dx"} if direction != "forward" else set())
    assert timed == {"forward": {"scale", "square", "forward"}, "backward": {"backward"},
                     "forward_backward": {"backward", "forward_backward"}}[direction]
    assert df["d_model"].isna().all() and df["cost_model"].isna().all()


def test_a_wrong_stage_of_a_declared_workload_fails_its_gate(toy):
    wrong = Workload(**{**TOY.__dict__, "name": "toy_wrong",
                        "stages": (TOY.stages[0], Stage("square", ("y",), lambda b, kw, got: (got["h"] * 1.01,)))})
    workloads.register(wrong)
    try:
        point = plan.point("reference", TINY, workload="toy_wrong",
                           bench=plan.BenchSettings(stages=wrong.stage_names, cpu_warmup=0, cpu_reps=1))
        built = plan.build(point)
        report = gate.run(built)
    finally:
        workloads.unregister("toy_wrong")
    assert [f.split(" ")[0] for f in report.failures] == ["square"]
    with pytest.raises(GateFailure, match="square"):
        measure_time.run(built, report)


def test_the_timed_backward_receives_its_gradients_already_in_the_outputs_dtypes(monkeypatch):
    """The incoming gradients are drawn in float64; converted inside the timed call, their conversion (0.6 ms at S1
    on an H100) was timed with every backend's backward. backward_callables converts them once, before."""
    from impls.inputs import make_inputs

    seen = []
    real = measure_time.incoming

    def spy(out, grads_in):
        seen.extend((name, g.dtype, out[name].dtype) for name, g in grads_in.items() if out.get(name) is not None)
        return real(out, grads_in)

    monkeypatch.setattr(measure_time, "incoming", spy)
    calls = measure_time.backward_callables(ReferenceBackend(), make_inputs(TINY, seed=0))
    for direction in ("backward", "forward_backward"):
        seen.clear()
        calls[direction]()
        assert seen and all(got == wanted for _, got, wanted in seen), (direction, seen)


def test_a_workload_name_is_registered_once():
    with pytest.raises(ValueError, match="registered already"):
        workloads.register(Workload(**{**TOY.__dict__, "name": "ssd"}))
    with pytest.raises(ValueError, match="workload: expected one of .*mamba2_layer.*ssd"):
        workloads.get("nope")
    assert {"ssd", "mamba2_layer"} <= set(workloads.names())


# --- the Mamba-2 layer -------------------------------------------------------------------------------------------
LAYER_TINY = Problem(Shape(1, 64, 4, 16, 2, 16, 32), dtype="float32")


def test_the_layer_takes_its_sizes_from_the_shape():
    config = layer_config(Problem(Shape(1, 2048, 80, 64, 1, 128, 256)), {"expand": 2, "d_conv": 4})
    assert (config.d_model, config.nheads, config.headdim, config.d_state, config.chunk_size) == (2560, 80, 64, 128,
                                                                                                  256)
    with pytest.raises(ValueError, match="^shape: nheads·headdim"):
        layer_config(Problem(Shape(1, 64, 3, 5, 1, 16, 32)), {"expand": 2, "d_conv": 4})


def test_a_wrong_ssd_output_fails_the_layers_gate_and_nothing_is_timed(monkeypatch):
    """A planted fault: the reference backend's y plus 1 % of its time-reversed self (a scaled y would pass: the
    RMSNorm after the SSD undoes a scale)."""
    compute_out = ReferenceBackend.compute_out

    def off_by_one_percent(self, *args, **kwargs):
        y = compute_out(self, *args, **kwargs)
        return y + 0.01 * y.flip(1)

    monkeypatch.setattr(ReferenceBackend, "compute_out", off_by_one_percent)
    rows = bench.measure(plan.point("reference", LAYER_TINY, workload="mamba2_layer"))
    df = rows.frame()
    assert rows.status == "failed" and "GateFailure" in rows.error
    failed = set(df.query("metric == 'ok' and value == 0")["stage"])
    assert {"ssd", "forward"} <= failed and "in_proj_conv" not in failed
    assert not df["metric"].str.endswith("_ms").any()


def test_a_reference_that_drops_a_parameter_fails_the_point_naming_it(monkeypatch):
    """The gradient gate skips a gradient the float64 reference lacks: a reference that no longer used a parameter
    would leave the backend's gradient of it unchecked. It raises instead, naming the gradients."""
    from harness.workloads import mamba2_layer as layer_workload

    reference = layer_workload.mamba2_float64

    def without_norm_weight(layer, u, **kw):  # the same values, norm_weight read as a constant
        weight = layer.norm_weight
        del layer.norm_weight
        layer.norm_weight = weight.detach()
        try:
            return reference(layer, u, **kw)
        finally:
            del layer.norm_weight
            layer.norm_weight = weight

    monkeypatch.setattr(layer_workload, "mamba2_float64", without_norm_weight)
    rows = bench.measure(plan.point("reference", LAYER_TINY, workload="mamba2_layer", direction="backward"))
    assert rows.status == "failed", rows.error
    assert "do not depend on" in rows.error and "'dnorm_weight'" in rows.error, rows.error


def test_the_layer_runs_the_glue_its_options_name():
    """workload.options.glue builds the layer's conv and gated norm in that form (models/glue.py), and the rows say
    which: the non-SSD part's time beside its floor is measured for each form."""
    point = plan.point("reference", LAYER_TINY, workload="mamba2_layer", workload_options={"glue": "compile"})
    inputs = workloads.get("mamba2_layer").inputs(point, "reference")
    assert inputs.layer.glue.NAME == "compile"
    rows = bench.measure(plan.point("reference", LAYER_TINY, workload="mamba2_layer"))
    assert set(rows.frame()["glue"]) == {"torch"}


def test_a_backend_that_cannot_run_is_a_failed_point_with_its_reason():
    rows = bench.measure(plan.point("cutile", LAYER_TINY, workload="mamba2_layer"))
    assert rows.status == "failed" and "cutile" in rows.error
    assert set(rows.frame()["workload"]) == {"mamba2_layer"}


@pytest.mark.parametrize("change, named", [
    pytest.param({"workload_options": {"expand": 3}}, "^shape: nheads·headdim", id="expand-not-dividing"),
    pytest.param({"workload_options": {"width": 3}}, r"workload.options: \['width'\]", id="unknown-option"),
    pytest.param({"workload_options": {"glue": "cuda"}}, "workload.options.glue: expected one of", id="unknown-glue"),
    pytest.param({"workload_options": {"glue": "triton", "d_conv": 6}}, "workload.options.d_conv: glue='triton'",
                 id="a-conv-too-wide-for-the-glue"),
    pytest.param({"problem": Problem(LAYER_TINY.shape, has_z=True)}, "has_z=True", id="z-the-layer-gates-itself"),
    pytest.param({"bench": plan.BenchSettings()}, r"bench.stages: \['chunk_cumsum'", id="the-ssds-stages"),
    pytest.param({"workload": "nope"}, "workload: expected one of", id="unknown-workload"),
])
def test_what_a_workload_refuses_is_refused_before_it_runs(change, named):
    args = {"problem": LAYER_TINY, "workload": "mamba2_layer", **change}
    with pytest.raises(ValueError, match=named):
        plan.point("reference", args.pop("problem"), **args)


# --- the command line -----------------------------------------------------------------------------------------------
def test_the_command_line_stores_gated_rows_of_the_ssds_backward_and_of_the_layer(tmp_path):
    """`python -m experiments.bench backend=reference shape=tiny` with direction=backward (the SSD's backward:
    torch autograd through the chunked reference, gated against float64 autograd) and workload=mamba2_layer
    (forward and backward): every point gated and stored with its code_key, and the analysis reads the layer's."""
    from analysis.load import load_results, timed, wide

    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled"}
    out = subprocess.run(
        [sys.executable, "-m", "experiments.bench", "-m", "backend=reference", "shape=tiny",
         "workload=ssd,mamba2_layer", "direction=forward,backward", f"results_dir={tmp_path}/res",
         f"hydra.sweep.dir={tmp_path}/sweep", "logger=local", "bench.cpu_warmup=0", "bench.cpu_reps=1"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    df = store.load(tmp_path / "res")
    points = df.drop_duplicates("run_id")
    assert sorted(zip(points["workload"], points["direction"])) == [
        ("mamba2_layer", "backward"), ("mamba2_layer", "forward"), ("ssd", "backward"), ("ssd", "forward")]
    assert set(df["status"]) == {"ok"} and df["code_key"].notna().all() and set(df["reference"]) == {"float64"}
    assert (df.query("metric == 'ok'")["value"] == 1).all()
    layer = df[df["workload"] == "mamba2_layer"]
    assert set(layer["d_model"]) == {32} and set(layer["expand"]) == {2} and set(layer["d_conv"]) == {4}
    grads = set(layer.query("direction == 'backward'")["stage"])
    assert {"grad:du", "grad:din_proj.weight", "grad:dA_log", "backward"} <= grads
    assert {"grad:dx", "grad:dA", "grad:ddt_bias"} <= set(df.query("workload == 'ssd'")["stage"])
    w = wide(load_results(tmp_path / "res"))
    assert set(timed(w, workload="mamba2_layer")["stage"]) == {"in_proj_conv", "ssd", "norm_out_proj", "forward",
                                                               "backward"}
    assert set(timed(w)["stage"]) == {"chunk_cumsum", "fwd_pass_state", "compute_out", "forward"}
    assert set(timed(w)["workload"]) == {"ssd"}


def test_the_config_names_what_a_workload_refuses():
    from hydra import compose, initialize_config_dir

    conf.register_schemas()
    conf.register_resolvers()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        layer = compose("config", overrides=["workload=mamba2_layer", "shape=tiny"])
        assert list(layer.bench.stages) == list(workloads.get("mamba2_layer").stage_names)
        conf.validate(layer)
        for overrides, named in ((["workload.options.expand=3"], "expand"),
                                 (["+workload.options.width=1"], "width"),
                                 (["bench.reference=sampled"], "bench.reference"),
                                 (["problem=with_z"], "has_z")):
            with pytest.raises(conf.ConfigError, match=named):
                conf.validate(compose("config", overrides=["workload=mamba2_layer", "shape=tiny", *overrides]))
