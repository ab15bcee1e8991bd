"""The harness as a pipeline of typed steps, without Hydra: a Point built in plain Python → Plan → GateReport →
Timings → Rows on the CPU at a tiny shape; a failed gate times nothing; the Hydra entry's config hash is what it
was before the steps were split."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from experiments import bench
from harness import gate, measure_time, plan, record, store
from harness.correctness import GateFailure
from impls.problem import Problem, Shape
from impls.reference.backend import ReferenceBackend

TINY = Problem(Shape(1, 32, 2, 8, 1, 8, 16), dtype="float32")
QUICK = plan.BenchSettings(cpu_warmup=0, cpu_reps=1)
STAGES = ("chunk_cumsum", "fwd_pass_state", "compute_out", "forward")


@pytest.fixture(scope="module")
def point():
    return plan.point("reference", TINY, seed=1, bench=QUICK, sweep_name="pipeline", shape_name="tiny32")


def test_a_plan_built_in_python_is_measured_into_rows(point, tmp_path):
    built = plan.build(point)
    assert built.backend.name == "reference" and built.inputs.x.shape == (1, 32, 2, 8)
    report = gate.run(built)
    assert report.reference == "float64" and not report.failures and "rule skipped: not on a GPU" in report.description
    timings = measure_time.run(built, report)
    rows = record.rows(point, built, report, timings, error=None)
    assert rows.status == "ok" and rows.error is None
    df = rows.frame()
    assert list(df.columns) == list(store.COLUMNS)
    metrics = set(zip(df["stage"], df["metric"]))
    for stage in STAGES:
        assert {(stage, m) for m in ("median_ms", "p20_ms", "p80_ms", "rel_err", "block_err", "tol", "ok",
                                     "compile_s", "gbps", "bytes")} <= metrics, stage
    assert ("point", "ok") in metrics and df.query("metric == 'rel_err'")["value"].max() < 1e-5
    assert {s for s, m in metrics if m == "flops"} == set(STAGES)  # a forward point: the forward's costs only
    assert set(df["cost_model"]) == {"ssd-cost-v1"}
    assert set(df["config_hash"]) == {point.identity.config_hash} and set(df["code_key"]) == {point.identity.code_key}
    assert set(df["timer"]) == {"cpu-wall"} and set(df["reference"]) == {"float64"} and set(df["tuning"]) == {"none"}
    assert set(df["sweep_name"]) == {"pipeline"} and set(df["shape_name"]) == {"tiny32"} and df["run_id"].nunique() == 1
    precision = df.drop_duplicates("stage").set_index("stage")["precision"]
    assert precision["chunk_cumsum"] == "none" and precision["compute_out"] == "float32"
    path = record.write(rows, point, record.Output(results_dir=tmp_path))
    assert len(store.load(path)) == len(df)
    assert record.already_stored(point, record.Output(results_dir=tmp_path))
    assert not record.already_stored(point, record.Output(results_dir=tmp_path, force=True))


def test_the_runner_gives_the_same_rows(point):
    rows = bench.measure(point)
    assert rows.status == "ok"
    assert {(r["stage"], r["metric"]) for r in rows.rows} >= {(s, "median_ms") for s in STAGES}


class WrongY(ReferenceBackend):
    def compute_out(self, C, B, x, dt, dA_cumsum, states, D, z, seq_idx):
        return super().compute_out(C, B, x, dt, dA_cumsum, states, D, z, seq_idx) * 1.01


def test_a_failed_gate_is_recorded_and_nothing_is_timed(point):
    built = dataclasses.replace(plan.build(point), backend=WrongY())
    report = gate.run(built)
    assert report.failures and "compute_out" in report.failures[0]
    with pytest.raises(GateFailure, match="compute_out"):
        measure_time.run(built, report)
    rows = record.rows(point, built, report, None, error="GateFailure: " + "; ".join(report.failures))
    df = rows.frame()
    assert set(df["status"]) == {"failed"} and not df["metric"].str.endswith("_ms").any()
    assert df.query("stage == 'compute_out' and metric == 'ok'")["value"].item() == 0.0
    assert df.query("stage == 'point'")["value"].item() == 0.0 and df["describe"].isna().all()


def test_switch_overrides_and_ablation_resolve_as_in_the_config():
    pt = plan.point("triton", TINY, switches={"cb_precision": "fp32"}, ablation="all_off")
    assert pt.switches.cb_precision == "fp32"
    assert not any(v for v in dataclasses.asdict(pt.switches).values() if v is True)
    assert pt.identity.config_hash != plan.point("triton", TINY).identity.config_hash


def _added_at_default(group: str, key: str, value) -> bool:
    """A key added to the config since (bench.kernel_times) at its default: left out, so those hashes stay the same."""
    return group == "bench" and key == "kernel_times" and not value


def container_semantic(cfg, switches, device_name: str) -> dict:
    """The semantic config as the Hydra entry computed it before the steps were split (from the DictConfig's
    container): the typed `plan.semantic` must give the same dict, so stored config hashes keep matching."""
    from omegaconf import OmegaConf

    container = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    resolved = dataclasses.is_dataclass(switches)
    return {
        "backend": container["backend"]["name"],
        "switches": dataclasses.asdict(switches) if resolved else container["backend"]["switches"],
        "ablation": None if resolved else container["backend"]["ablation"],
        **{group: {k: v for k, v in container[group].items() if k != "name" and not _added_at_default(group, k, v)}
           for group in ("shape", "problem", "bench")},
        "dtype": container["dtype"], "seed": container["seed"], "device": device_name,
        "workload": "ssd", "direction": container["direction"],
    }


@pytest.mark.parametrize("overrides", [
    pytest.param(["backend=reference", "shape=tiny", "dtype=float32"], id="reference-tiny"),
    pytest.param(["backend=triton", "shape=S1", "backend.ablation=all_off"], id="triton-all-off"),
    pytest.param(["backend=cutile", "shape=S3", "+backend.switches.cb_precision=fp32", "seed=3"], id="cutile-switch"),
    pytest.param(["backend=mamba_ssm", "problem=varlen", "shape=tiny", "shape.batch=1", "bench=thorough"],
                 id="mamba_ssm-varlen-thorough"),
    pytest.param(["backend=reference", "problem=with_z", "dtype=float16", "bench=check_only"], id="reference-z-check"),
])
def test_config_hash_is_unchanged(overrides):
    from hydra import compose, initialize_config_dir

    from harness import config as conf
    from tests.harness.test_configs import CONF

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    pt = plan.from_config(cfg)
    typed = plan.semantic(pt.backend, pt.switches, pt.ablation, pt.problem, pt.bench, pt.seed, pt.device_name)
    assert typed == container_semantic(cfg, pt.switches, pt.device_name)
    assert pt.identity.config_hash == conf.config_hash(typed) and pt.device == torch.device("cpu")


def test_timing_without_the_gate_is_refused():
    """Every timed point passes the float64 gate first: bench.check off with timing on is refused at start-up,
    by the config check and by BenchSettings itself."""
    from harness import config as conf

    with pytest.raises(conf.ConfigError, match="bench.check=false with bench.time=true"):
        plan.BenchSettings(check=False)
    assert plan.BenchSettings(check=False, time=False).time is False
    from hydra import compose, initialize_config_dir

    conf.register_schemas()
    conf.register_resolvers()
    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[2] / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["backend=reference", "shape=tiny", "dtype=float32", "bench.check=false"])
        with pytest.raises(conf.ConfigError, match="bench.check=false with bench.time=true"):
            conf.validate(cfg)
        conf.validate(compose("config", overrides=["backend=reference", "shape=tiny", "dtype=float32",
                                                   "bench.check=false", "bench.time=false"]))


# --- the backward directions (impls.ssd through the same steps) ----------------------------------------------
@pytest.mark.parametrize("direction", ["backward", "forward_backward"])
def test_a_backward_direction_is_gated_on_every_gradient_and_timed(direction):
    pt = plan.point("reference", TINY, seed=1, bench=QUICK, direction=direction)
    assert pt.identity.config_hash != plan.point("reference", TINY, seed=1, bench=QUICK).identity.config_hash
    rows = bench.measure(pt)
    assert rows.status == "ok", rows.error
    df = rows.frame()
    assert set(df["direction"]) == {direction} and set(df["workload"]) == {"ssd"}
    gradients = {s for s in df["stage"] if s.startswith("grad:")}
    assert gradients == {"grad:dx", "grad:ddt", "grad:dA", "grad:dB", "grad:dC", "grad:dD", "grad:ddt_bias"}
    assert (df.query("metric == 'ok' and stage.str.startswith('grad:')", engine="python")["value"] == 1).all()
    assert df.query("stage == 'backward' and metric == 'deterministic'")["value"].item() == 1.0
    timed = set(df.query("metric == 'median_ms'")["stage"])
    assert timed == ({"backward"} if direction == "backward" else {"backward", "forward_backward"})
    metrics = set(zip(df["stage"], df["metric"]))  # the cost model's entries, and its rates of each timed stage
    assert {(s, m) for s in timed for m in ("gbps", "tflops", "bytes_fused", "bytes_fused_recompute")} <= metrics
    assert {("bwd_chunk", "flops"), ("forward", "bytes"), ("forward_backward", "flops")} <= metrics
    assert set(df["cost_model"]) == {"ssd-cost-v1+ssd-bwd-cost-v1"}
    if direction == "forward_backward":  # measured on the GPU only: NaN here, with the reason
        peak = df.query("metric == 'peak_mem_bytes'")
        assert peak["value"].isna().all() and peak["note"].str.contains("GPU only").all()


class WrongDx(ReferenceBackend):
    def forward_for_backward(self, args, needs):
        run = super().forward_for_backward(args, needs)
        backward = run.backward

        def spoiled(grads):
            out = backward(grads)
            out["x"] = out["x"] * 1.01
            return out

        run.backward = spoiled
        return run


def test_a_wrong_gradient_fails_the_gate_and_nothing_is_timed():
    pt = plan.point("reference", TINY, seed=1, bench=QUICK, direction="backward")
    built = dataclasses.replace(plan.build(pt), backend=WrongDx())
    report = gate.run(built)
    assert len(report.failures) == 1 and report.failures[0].startswith("dx: "), report.failures
    with pytest.raises(GateFailure, match="dx"):
        measure_time.run(built, report)


def test_a_backward_that_differs_between_calls_is_recorded_as_such():
    calls = iter([(torch.ones(3),), (torch.ones(3) + 1e-7,)])
    assert not measure_time.bitwise_repeatable(lambda: next(calls))
    assert measure_time.bitwise_repeatable(lambda: (torch.arange(3.0), None))
