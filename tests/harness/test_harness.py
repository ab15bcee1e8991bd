"""A real multirun on CPU: rows with provenance, W&B offline runs, a failed point recorded, a re-run skipped;
the correctness gate catches unwritten outputs; per-job GPU assignment."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from experiments import multigpu
from harness import correctness, store
from impls.inputs import make_inputs
from impls.problem import Problem, Shape
from impls.reference.backend import ReferenceBackend
from impls.tolerance import rel_err

REPO = Path(__file__).resolve().parents[2]
PROVENANCE = ["run_id", "sweep_id", "config_hash", "backend", "switches", "describe", "tuning", "problem", "dtype",
              "seed", "distribution", "device", "device_name", "timer", "statistic", "warmup", "reps", "cost_model",
              "logger", "hydra_choices", "config", "python", "cuda", "v_torch", "v_triton", "v_cuda_tile",
              "v_tileiras", "v_mamba_ssm", "git_commit", "git_dirty"]
GPU_ONLY = ["gpu_name", "gpu_uuid", "gpu_cc", "gpu_clock_sm_mhz", "driver"]


def bench(tmp_path, *args):
    env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, "-m", "experiments.bench", "-m", *args, f"results_dir={tmp_path}/results",
         f"logger.dir={tmp_path}", f"hydra.sweep.dir={tmp_path}/multirun", "bench.cpu_warmup=0", "bench.cpu_reps=1"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """reference and mamba_ssm (interpreter) at the tiny shape in float32, and cutile (needs a GPU: must fail)."""
    tmp = tmp_path_factory.mktemp("sweep")
    args = ["backend=reference,mamba_ssm,cutile", "shape=tiny", "dtype=float32", "logger=wandb", "sweep_name=t"]
    first = bench(tmp, *args)
    assert first.returncode == 0, first.stderr[-3000:]
    files = store.parquet_files(tmp / "results")
    second = bench(tmp, *args)
    return tmp, first, second, files


def test_rows_have_provenance(sweep):
    tmp, first, _, files = sweep
    df = store.load(tmp / "results")
    assert list(df.columns) == list(store.COLUMNS)
    assert set(df["backend"]) == {"reference", "mamba_ssm", "cutile"} and len(files) == 3
    ok = df[df["status"] == "ok"]
    assert set(ok["backend"]) == {"reference", "mamba_ssm"}
    assert ok[PROVENANCE].notna().all().all(), ok[PROVENANCE].isna().sum()[lambda s: s > 0]
    assert ok[GPU_ONLY].isna().all().all()  # CPU run: recorded as null, not invented
    assert set(ok["timer"]) == {"cpu-wall"} and set(ok["reference"]) == {"float64"}
    assert ok["code_key"].notna().all()
    # a plain bench run outside the scripts is a run group of its own, its sweep, in one round
    assert (ok["run_group"] == ok["sweep_id"]).all() and (ok["round"] == 1).all()
    precision = ok.drop_duplicates(["backend", "stage"]).set_index(["backend", "stage"])["precision"]
    assert precision[("mamba_ssm", "compute_out")] == "float32"  # the interpreter's dots are exact fp32
    assert precision[("reference", "chunk_cumsum")] == "none"
    for _backend, rows in ok.groupby("backend"):
        metrics = set(zip(rows["stage"], rows["metric"]))
        for stage in ("chunk_cumsum", "fwd_pass_state", "compute_out", "forward"):
            assert {(stage, m) for m in ("median_ms", "p20_ms", "p80_ms", "rel_err", "compile_s", "gbps")} <= metrics
        assert rows[rows["metric"] == "rel_err"]["value"].max() < 1e-4
    assert json.loads(ok[ok["backend"] == "mamba_ssm"]["describe"].iloc[0])["backend"] == "mamba_ssm"


def test_the_terminal_shows_the_bar_and_the_summary(sweep):
    """A sweep's default terminal output is its progress bar, its failed points and the summary table: none of W&B's
    banners and run summaries, none of Hydra's launch lines (verbose=true shows them)."""
    _, first, _, _ = sweep
    lines = [line for line in (first.stdout + first.stderr).splitlines() if line.strip()]
    bar = [line for line in lines if line.startswith("sweep t:")]  # each redraw of the bar reads as a line here
    rest = [line for line in lines if not line.startswith("sweep t:")]
    assert bar and not [line for line in rest if line.startswith("wandb:") or "[HYDRA]" in line], rest
    # cutile's FAILED line, the summary's title, its header and its three points
    assert len(rest) == 6 and "[bench] sweep t: 3 points, 1 failed" in first.stdout, rest


def test_rows_record_the_block_wise_gate(sweep):
    """Each stage's worst block (block_err) beside its whole-tensor rel_err; the gate column says where the worst
    block is and that the mamba-ssm x2 rule was skipped on the CPU, and why."""
    tmp, _, _, _ = sweep
    ok = store.load(tmp / "results").query("status == 'ok'")
    for _backend, rows in ok.groupby("backend"):
        metrics = set(zip(rows["stage"], rows["metric"]))
        assert {(stage, "block_err") for stage in correctness.STAGE_OUTPUTS} <= metrics
        assert {("forward", "mamba_ssm_rule"), ("forward", "mamba_ssm_rel_err")} <= metrics
        assert rows[rows["metric"] == "mamba_ssm_rule"]["value"].eq(0).all()
        assert rows[rows["metric"] == "block_err"]["value"].max() < 1e-4
        gate = rows["gate"].iloc[0]
        assert "worst block" in gate and "y: batch" in gate and "rule skipped: not on a GPU" in gate


def test_failed_point_recorded_and_sweep_finishes(sweep):
    tmp, first, _, _ = sweep
    df = store.load(tmp / "results")
    failed = df[df["backend"] == "cutile"]
    assert set(failed["status"]) == {"failed"} and set(failed["stage"]) >= {"point"}
    assert failed["error"].iloc[0]
    assert "3 points, 1 failed" in first.stdout  # the summary table of on_multirun_end


def test_wandb_offline_runs_hold_config_and_table(sweep):
    tmp, _, _, _ = sweep
    df = store.load(tmp / "results")
    runs = sorted((tmp / "wandb").glob("offline-run-*"))
    assert len(runs) == 4  # three points, and the failed one retried by the second sweep
    assert set(df["logger"]) == {"wandb"} and df["wandb_run"].notna().all()
    for run in runs:
        (record,) = run.glob("run-*.wandb")  # offline runs keep the config in their record log
        assert b"results_dir" in record.read_bytes() and b"sweep_name" in record.read_bytes()
        tables = list((run / "files" / "media" / "table").glob("*.table.json"))
        assert len(tables) == 1
        data = json.loads(tables[0].read_text())
        run_id = data["data"][0][data["columns"].index("run_id")]
        assert len(data["data"]) == int((df["run_id"] == run_id).sum())


def test_rerun_skips_stored_points_and_retries_failed_ones(sweep):
    tmp, _, second, files = sweep
    assert second.returncode == 0, second.stderr[-2000:]
    assert second.stdout.count("already stored") == 2  # reference and mamba_ssm, by the same code
    again = [f for f in store.parquet_files(tmp / "results") if f not in files]
    assert set(store.load(again[0])["backend"]) == {"cutile"} and len(again) == 1  # the failed point, retried


def test_gate_catches_an_output_the_kernel_never_writes():
    class Lazy(ReferenceBackend):
        def compute_out(self, C, B, x, dt, dA_cumsum, states, D, z, seq_idx):
            y = super().compute_out(C, B, x, dt, dA_cumsum, states, D, z, seq_idx)
            out = torch.empty_like(y)
            out[:, :-1] = y[:, :-1]  # forgets the last position
            return out

    problem = Problem(Shape(1, 64, 2, 8, 1, 8, 32), dtype="float32")
    inputs = make_inputs(problem, seed=1)
    ref = correctness.reference_forward(inputs, "float64")
    report = correctness.check(Lazy(), inputs, ref, torch.float32)
    assert report["chunk_cumsum"]["ok"] and report["fwd_pass_state"]["ok"]
    assert not report["compute_out"]["ok"] and report["compute_out"]["rel_err"] == float("inf")
    assert correctness.check(ReferenceBackend(), inputs, ref, torch.float32)["forward"]["ok"]


@pytest.mark.parametrize("job,shards,expected", [
    pytest.param(0, 4, 0, id="job0"), pytest.param(5, 4, 1, id="job5"), pytest.param(7, 2, 1, id="job7-2gpus"),
])
def test_per_job_gpu_assignment(job, shards, expected):
    assert multigpu.gpu_for_job(job, list(range(shards))) == expected
    assert [multigpu.owns_job(job, s, shards) for s in range(shards)].count(True) == 1
    assert multigpu.owns_job(job, expected, shards)


def test_shard_commands_pin_one_gpu_each():
    cmds = multigpu.shard_commands([2, 3], ["experiment=headline"], "sw")
    assert [env["CUDA_VISIBLE_DEVICES"] for env, _ in cmds] == ["2", "3"]
    assert all(env["SSD_SWEEP_ID"] == "sw" for env, _ in cmds)
    assert cmds[1][1][-2:] == ["launch.num_shards=2", "launch.shard=1"]
    with pytest.raises(ValueError):
        multigpu.owns_job(0, 2, 2)


def test_sharded_sweep_runs_only_its_jobs(tmp_path):
    out = bench(tmp_path, "backend=reference", "seed=1,2,3,4", "shape=tiny", "logger=local",
                "launch.num_shards=2", "launch.shard=1", "bench.time=false")
    assert out.returncode == 0, out.stderr[-2000:]
    df = store.load(tmp_path / "results")
    assert sorted(df.drop_duplicates("run_id")["job_num"]) == [1, 3]


@pytest.mark.slow
def test_no_arguments_runs_the_cpu_preset(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""}
    env.pop("WANDB_MODE", None)
    out = subprocess.run([sys.executable, "-m", "experiments.bench"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "experiment=cpu" in out.stdout and "3 points, 0 failed" in out.stdout
    df = pd.concat(pd.read_parquet(f) for f in (tmp_path / "results" / "scratch").rglob("*.parquet"))
    assert set(df["backend"]) == {"reference", "mamba_ssm", "triton"}
    assert len(list((tmp_path / "wandb").glob("offline-run-*"))) == 3


def test_forward_parts_are_timed_apart():
    """A backend's forward_parts (a peer's adapter steps and kernels) become stages "part:<name>"."""
    import torch

    from harness import measure_time
    from impls.inputs import make_inputs
    from impls.problem import Problem, Shape
    from impls.reference.backend import ReferenceBackend

    calls = []

    class WithParts(ReferenceBackend):
        def forward_parts(self, *args, **kwargs):
            return {"adapter_prepare": lambda: calls.append("prepare"), "peer": lambda: calls.append("peer")}

    inputs = make_inputs(Problem(Shape(1, 40, 2, 16, 1, 16, 16)), seed=0, dtype=torch.float32)
    callables = measure_time.stage_callables(WithParts(), inputs)
    assert {"part:adapter_prepare", "part:peer", "forward", "compute_out"} <= set(callables)
    callables["part:peer"]()
    assert calls == ["peer"]


@pytest.mark.parametrize("describe,expect", [
    ({"backend": "fla", "stages": ["forward"]}, "none"),  # FLA lists its stages: seen failing every H200 point
    ({"stages": {"compute_out": {"source": "record", "config": {}}}}, '{"compute_out": "record"}'),
    ({"tuning": "fallback"}, "fallback"),
], ids=["stage-list", "per-stage-sources", "one-source"])
def test_tuning_sources(describe, expect):
    from harness.record import tuning_sources

    assert tuning_sources(describe) == expect


def test_a_stage_falling_back_for_want_of_a_record_is_announced():
    """On a card without records a run says so: the card, the backend, the stage, what ran and how to search first;
    a fallback asked for (tuning=fallback) and a stage on its record say nothing."""
    from experiments.bench import fallback_lines

    card = "NVIDIA H100 80GB HBM3"
    describe = {"stages": {"compute_out": {"source": "fallback", "reason": "no record", "config": {"block_rows": 64}},
                           "chunk_cumsum": {"source": "record", "config": {"block_heads": 4}},
                           "fwd_pass_state": {"source": "fallback", "reason": "tuning=fallback", "config": {}}}}
    [line] = fallback_lines(card, "cutile", describe, card)
    assert f"{card}: no usable tuning record for cutile compute_out (no record;" in line
    assert "NVIDIA_H100_80GB_HBM3/cutile_compute_out.json" in line and 'config {"block_rows": 64}' in line
    assert "experiment=autotune backend=cutile" in line
    tilegym = {"tuning_sources": {"compute_out": {"source": "fallback", "reason": "no record", "config": {}}}}
    assert len(fallback_lines(card, "tilegym", tilegym, card)) == 1
    assert fallback_lines(card, "fla", {"stages": ["forward"]}, card) == []


TRITON_DESCRIBE = {"stages": {"chunk_cumsum": {"tile_protocol": "same-sass"},
                              "chunk_state": {"tile_protocol": "retuned"}, "state_passing": {"tile_protocol": "pinned"},
                              "compute_out": {"tile_protocol": "retuned"}}}


@pytest.mark.parametrize("describe,stage,expect", [
    (TRITON_DESCRIBE, "chunk_cumsum", "same-sass"),
    (TRITON_DESCRIBE, "fwd_pass_state", "retuned+pinned"),  # stage 2 is two kernels: both, in TILE_PROTOCOLS order
    (TRITON_DESCRIBE, "forward", "retuned+same-sass+pinned"),
    (TRITON_DESCRIBE, "ceiling", "n/a"),
    ({"tuning_sources": {"compute_out": {"tile_protocol": "retuned"}}}, "compute_out", "retuned"),  # TileGym
    ({"tile_protocol": "peer-autotune", "stages": ["forward"]}, "forward", "peer-autotune"),
    (None, "compute_out", "unknown"),  # nothing timed
    ({"stages": {"compute_out": {"source": "record"}}}, "compute_out", "unknown"),  # a backend that does not say
], ids=["one-kernel", "stage-2-kernels", "forward", "ceiling", "tuning_sources", "peer", "no-describe", "silent"])
def test_tile_protocol_per_row(describe, stage, expect):
    from harness.record import tile_protocol

    assert tile_protocol(describe, stage) == expect


def test_describe_says_where_an_untuned_or_peer_backend_s_tiles_come_from():
    from impls.fla.backend import FlaBackend
    from impls.reference.backend import ReferenceBackend

    assert ReferenceBackend().describe()["tile_protocol"] == "untuned"
    assert FlaBackend.TILE_PROTOCOL == "peer-autotune"


# --- the sampled reference: the gate of problems whose full reference does not fit --------------------------
SAMPLED_CASES = {
    "headline": Problem(Shape(2, 200, 4, 8, 2, 8, 32), dtype="float32"),
    "z-init-Dchannel": Problem(Shape(1, 256, 4, 8, 1, 8, 32), dtype="float32", has_z=True,
                               has_initial_states=True, D_per_channel=True),
}


@pytest.mark.parametrize("case", list(SAMPLED_CASES), ids=list(SAMPLED_CASES))
def test_sampled_reference_matches_the_full_reference(case):
    from impls.reference.sampled import sampled_reference

    inputs = make_inputs(SAMPLED_CASES[case], seed=3)
    full = correctness.reference_forward(inputs, "float64")
    ref = sampled_reference(**inputs.forward_kwargs(), chunks=(0, 2, 6), group=3)
    assert ref.chunks == (0, 2, 6) and ref.states.shape[1] == 3
    for name in ("dt", "dA_cumsum", "states", "final_states", "y"):
        assert rel_err(ref.pick(name, getattr(full, name)), getattr(ref, name)) < 1e-5, name


def test_sampled_gate_passes_a_right_backend_and_catches_a_wrong_chunk():
    class OffByOneChunk(ReferenceBackend):  # corrupts y in chunk 3 only (sampled: 0, 1, 3, 5, 6 of 7)
        def compute_out(self, C, B, x, dt, dA_cumsum, states, D, z, seq_idx):
            y = super().compute_out(C, B, x, dt, dA_cumsum, states, D, z, seq_idx)
            y[:, 96:128] *= 1.01
            return y

    inputs = make_inputs(SAMPLED_CASES["headline"], seed=4)
    ref = correctness.reference_forward(inputs, "sampled")
    good = correctness.check(ReferenceBackend(), inputs, ref, torch.float32)
    assert all(r["ok"] for r in good.values()), good
    bad = correctness.check(OffByOneChunk(), inputs, ref, torch.float32)
    assert bad["fwd_pass_state"]["ok"] and not bad["compute_out"]["ok"]


def test_sampled_chunks_include_the_int32_crossings():
    from impls.reference.sampled import sampled_chunks

    chunks = sampled_chunks(1, 1 << 20, 80, 64, 128, 256)
    assert {0, 1, 1637, 1638, 3276, 3277, 4094, 4095} <= set(chunks)  # x/y at token 419431, states at chunk 3277
    assert sampled_chunks(1, 1024, 4, 8, 8, 256) == (0, 1, 2, 3)  # no crossing in a small problem


def test_sampled_reference_refuses_packed_sequences():
    from impls.reference.sampled import sampled_reference

    inputs = make_inputs(Problem(Shape(1, 128, 2, 8, 1, 8, 32), dtype="float32", nseqs=2), seed=5)
    with pytest.raises(ValueError, match="seq_idx"):
        sampled_reference(**inputs.forward_kwargs())
    with pytest.raises(ValueError, match="bench.reference"):
        correctness.reference_kind(inputs, torch.device("cpu"), "float32")


def test_inputs_are_drawn_on_the_cpu_unless_the_problem_is_huge():
    from harness.plan import draw_device

    problem = Problem(Shape(2, 512, 4, 16, 1, 16, 256), dtype="float32")
    assert torch.equal(make_inputs(problem, seed=0).x, make_inputs(problem, seed=0, draw_device="cpu").x)
    million = Problem(Shape(1, 1 << 20, 80, 64, 1, 128, 256))
    assert draw_device(problem, torch.device("cuda", 0)) == "cpu"
    assert draw_device(million, torch.device("cuda", 0)) == "cuda"
    assert draw_device(million, torch.device("cpu")) == "cpu"


def test_points_after_a_lost_cuda_context_are_refused(monkeypatch):
    """An illegal memory access poisons the process: later points say so instead of blaming their backend."""
    from experiments import bench

    assert bench.context_lost(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert not bench.context_lost(RuntimeError("out of memory"))
    from harness import plan

    monkeypatch.setattr(bench, "_CUDA_CONTEXT_LOST", ["mamba_ssm long_1m: AcceleratorError"])
    rows = bench.measure(plan.point("reference", Problem(Shape(1, 32, 2, 8, 1, 8, 16), dtype="float32")))
    assert rows.status == "failed" and "mamba_ssm long_1m" in rows.error
    assert [(r["stage"], r["metric"]) for r in rows.rows] == [("point", "ok")]  # nothing of the point ran


@pytest.mark.parametrize("shape", [Shape(1, 512, 4, 32, 1, 64, 128), Shape(2, 256, 2, 64, 2, 128, 64)],
                         ids=["p32-n64-c128", "batch2-p64-n128-c64"])
def test_the_gradient_gates_graph_estimate_matches_what_autograd_keeps(shape):
    """correctness.gradient_reference_bytes (half of it: what the float64 graph of one batch row keeps) within 15 % of
    the saved tensors' bytes autograd holds for that row."""
    from harness import gradient_gate
    from harness.calls import forward_arguments
    from impls.autograd import ssd

    inputs = make_inputs(Problem(shape, dtype="bfloat16"), seed=0)
    row = make_inputs(Problem(dataclasses.replace(shape, batch=1), dtype="bfloat16"), seed=0)
    kw = forward_arguments(row.to(dtype=torch.float64))
    kw["state_dtype"] = torch.float64
    kept = {}

    def pack(t):
        kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    leaves = gradient_gate.leaves_of(kw)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        ssd(**{**kw, **leaves}, backend="reference")
    estimate = correctness.gradient_reference_bytes(inputs) / 2
    assert 0.85 < sum(kept.values()) / estimate < 1.15, (sum(kept.values()), estimate)


def test_the_gradient_gate_streams_its_truth_where_the_float64_graph_does_not_fit(monkeypatch):
    """S2's float64 graph (one row of 65,536 tokens) does not fit an H100's 80 GB: the streamed truth; S1's rows do."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (80 * 2**30, 80 * 2**30))
    cuda = torch.device("cuda", 0)
    s1 = make_inputs(Problem(Shape(8, 4096, 80, 64, 1, 128, 256), dtype="bfloat16"), seed=0, device="meta")
    s2 = make_inputs(Problem(Shape(1, 65536, 80, 64, 1, 128, 256), dtype="bfloat16"), seed=0, device="meta")
    assert correctness.gradient_reference_kind(s1, cuda, "auto") == "float64"
    assert correctness.gradient_reference_kind(s2, cuda, "auto") == "sampled"
    assert correctness.gradient_reference_kind(s2, cuda, "float64") == "float64"  # asked for: as asked
