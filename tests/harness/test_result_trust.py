"""Results that can be trusted: a point is re-measured when the code changed and retried when it failed; the
tolerance follows the matmul precision the backend reports; tuning is resolved before the gate poisons its
allocations; timing knobs are honoured or refused; no secret from the environment reaches a written file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from harness import config, correctness, record, secrets, store, timing
from impls.inputs import make_inputs
from impls.problem import Problem, Shape
from impls.reference.backend import ReferenceBackend
from impls.tolerance import TF32_REL_TOL

REPO = Path(__file__).resolve().parents[2]
POINT = ["backend=reference", "shape=tiny", "shape.batch=1", "shape.seqlen=32", "shape.chunk_size=16",
         "dtype=float32", "bench.cpu_warmup=0", "bench.cpu_reps=1"]
PLANTED = {"SSD_TEST_API_KEY": "planted-key-6f1d2c", "MY_TOKEN": "planted-token-94ab", "A_SECRET": "planted-secret-77",
           "DB_PASSWORD": "planted-password-31"}


def run(tmp_path, *args, **env_extra):
    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_MODE", "SSD_GIT_COMMIT", "SSD_GIT_DIRTY")}
    env.update(PYTHONPATH=str(REPO), SSD_TUNING_DIR=str(tmp_path / "tuning"), **env_extra)
    return subprocess.run(
        [sys.executable, "-m", "experiments.bench", "-m", *args, f"results_dir={tmp_path}/results",
         f"logger.dir={tmp_path}", f"hydra.sweep.dir={tmp_path}/multirun"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


# --- nothing stale ------------------------------------------------------------------------------------------
def test_the_commit_is_a_label_not_the_code(tmp_path):
    """The same tree sent under another commit is the same code: its stored point is skipped (code_key hashes the
    content; tests/harness/test_provenance.py shows an edited tree measured again under the same commit)."""
    runs = [run(tmp_path, *POINT, "logger=local", SSD_GIT_COMMIT=commit, SSD_GIT_DIRTY="0")
            for commit in ("1111111", "2222222")]
    assert all(r.returncode == 0 for r in runs), runs[-1].stderr[-3000:]
    assert [r.stdout.count("already stored") for r in runs] == [0, 1]
    df = store.load(tmp_path / "results")
    assert df["run_id"].nunique() == 1 and list(df["git_commit"].unique()) == ["1111111"]


def test_failed_points_are_retried_unless_told_not_to(tmp_path):
    args = ["backend=cutile", "shape=tiny", "logger=local", "bench.time=false"]  # no GPU here: fails at once
    first, retried, kept = run(tmp_path, *args), run(tmp_path, *args), run(tmp_path, *args, "retry_failed=false")
    assert first.returncode == retried.returncode == kept.returncode == 0, kept.stderr[-3000:]
    assert "already stored" not in retried.stdout and "already stored" in kept.stdout
    assert store.load(tmp_path / "results")["run_id"].nunique() == 2


def test_code_key_follows_the_tuning_records(tmp_path, monkeypatch):
    from harness import provenance

    monkeypatch.setenv("SSD_TUNING_DIR", str(tmp_path))
    row = {"git_commit": "abc", "git_dirty": False, "v_torch": "2.13"}
    before = provenance.code_key(row, "triton", "NVIDIA H200")
    (tmp_path / "NVIDIA_H200").mkdir()
    (tmp_path / "NVIDIA_H200" / "triton_compute_out.json").write_text("{}")
    after = provenance.code_key(row, "triton", "NVIDIA H200")
    assert before != after and provenance.code_key(row, "cutile", "NVIDIA H200") == before
    assert provenance.code_key({**row, "v_torch": "2.14"}, "triton", "NVIDIA H200") != after


def test_code_key_hashes_the_records_the_backend_reads_on_this_device(tmp_path, monkeypatch):
    """Off the GPU our Triton reads its records under "triton-interpreter", not the harness's CPU name: a record
    added there changes the key of a CPU point (it would run the record's config)."""
    from harness import plan

    monkeypatch.setenv("SSD_TUNING_DIR", str(tmp_path))
    problem = Problem(Shape(1, 32, 2, 8, 1, 8, 16), "float32")

    def key():
        return plan.point("triton", problem, device="cpu").identity.code_key

    from impls import tuning

    before = key()
    folder = tmp_path / tuning.gpu_slug("triton-interpreter")
    folder.mkdir()
    (folder / "triton_compute_out.json").write_text("{}")
    assert key() != before and "tuning:none" in before


def test_an_untracked_source_file_makes_the_tree_dirty_and_enters_the_key(tmp_path, monkeypatch):
    from harness import provenance

    def tree_hash():
        provenance._tree_hash.cache_clear()
        return provenance.source_tree_hash()

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    (tmp_path / "impls").mkdir()
    (tmp_path / "impls" / "a.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a")
    monkeypatch.setattr(provenance, "REPO", tmp_path)
    for name in ("SSD_GIT_COMMIT", "SSD_GIT_DIRTY"):
        monkeypatch.delenv(name, raising=False)
    assert provenance.git_state.__wrapped__()["git_dirty"] is False
    clean = tree_hash()
    (tmp_path / "impls" / "b.py").write_text("y = 1\n")  # new, not added
    assert provenance.git_state.__wrapped__()["git_dirty"] is True
    first = tree_hash()
    (tmp_path / "impls" / "b.py").write_text("y = 2\n")
    assert len({clean, first, tree_hash()}) == 3
    provenance._tree_hash.cache_clear()


# --- no secret leaks ----------------------------------------------------------------------------------------
def test_no_secret_reaches_a_written_file(tmp_path):
    done = run(tmp_path, *POINT, "logger=wandb", "logger.mode=offline", **PLANTED)
    assert done.returncode == 0, done.stderr[-3000:]
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.suffix == ".parquet" for p in written) and any("wandb" in p.parts for p in written)
    leaks = [(str(p.relative_to(tmp_path)), name) for p in written for name, value in PLANTED.items()
             if value.encode() in p.read_bytes()]
    leaks += [("stdout/stderr", name) for name, value in PLANTED.items() if value in done.stdout + done.stderr]
    assert not leaks


def test_redact_replaces_secret_values_at_any_depth(monkeypatch):
    monkeypatch.setenv("SOME_API_KEY", "hunter2-hunter2")
    monkeypatch.setenv("HARMLESS", "hunter2-hunter2-visible")
    got = secrets.redact({"a": ["url?k=hunter2-hunter2", 3], "b": "plain"})
    assert got == {"a": ["url?k=<redacted>", 3], "b": "plain"}


# --- tolerance from what ran --------------------------------------------------------------------------------
class Tf32Reference(ReferenceBackend):
    """The reference, claiming tf32 matmuls (as cuTile and Triton do on the GPU)."""

    def tf32_matmuls(self, stage, device):
        return True


def test_gate_takes_each_stages_bound_from_the_reported_precision():
    """tf32 matmuls are bounded by the tf32-rounded computation's error (~2^-11), fp32 ones by fp32's (~1e-7);
    chunk_cumsum has no matmul and the same bound either way."""
    inputs = make_inputs(Problem(Shape(1, 32, 2, 8, 1, 8, 16), dtype="float32"), seed=0)
    ref = correctness.reference_forward(inputs, "float64")
    report = correctness.check(Tf32Reference(), inputs, ref, torch.float32)
    plain = correctness.check(ReferenceBackend(), inputs, ref, torch.float32)
    assert report["chunk_cumsum"]["precision"] == "none"
    assert report["chunk_cumsum"]["tol"] == plain["chunk_cumsum"]["tol"]
    assert {report[s]["precision"] for s in ("fwd_pass_state", "compute_out", "forward")} == {"tf32"}
    assert plain["compute_out"]["precision"] == "float32" and "at tf32" in report["compute_out"]["bound"]
    assert 1e-4 < report["compute_out"]["tol"] < TF32_REL_TOL and plain["compute_out"]["tol"] < 1e-5, (report, plain)


@pytest.mark.parametrize("backend, switches, stage, device, expected", [
    pytest.param("triton", {}, "compute_out", "cuda", "tf32", id="triton-gpu-tf32"),
    pytest.param("triton", {"cb_precision": "fp32"}, "compute_out", "cuda", "float32", id="triton-gpu-fp32"),
    pytest.param("triton", {}, "compute_out", "cpu", "float32", id="triton-interpreter-exact"),
    pytest.param("mamba_ssm", {}, "forward", "cuda", "tf32", id="mamba_ssm-gpu"),
    pytest.param("mamba_ssm", {}, "chunk_cumsum", "cuda", "none", id="mamba_ssm-no-matmul"),
    pytest.param("cutile", {"cb_precision": "fp32"}, "fwd_pass_state", "cuda", "float32", id="cutile-fp32"),
    pytest.param("cutile", {}, "fwd_pass_state", "cuda", "tf32", id="cutile-tf32"),
])
def test_backends_report_their_matmul_precision(backend, switches, stage, device, expected):
    from impls.registry import backend_class

    cls = backend_class(backend)
    assert cls(**switches).precision(stage, torch.float32, device) == expected
    assert cls(**switches).precision(stage, torch.bfloat16, device) in ("bfloat16", "none")


# --- searches timed as plain calls --------------------------------------------------------------------------
def test_tuning_is_resolved_before_the_gate_poisons_allocations():
    """A tuned backend's first call (where its search runs) sees plain allocations; the gate's call after it the
    poisoned ones; the first-call times come from the plain pass."""
    plain_empty = torch.empty
    seen = []

    class Tuned(ReferenceBackend):
        TUNED = True

        def compute_out(self, C, B, x, dt, dA_cumsum, states, D, z, seq_idx):
            seen.append("plain" if torch.empty is plain_empty else "poisoned")
            return super().compute_out(C, B, x, dt, dA_cumsum, states, D, z, seq_idx)

    inputs = make_inputs(Problem(Shape(1, 32, 2, 8, 1, 8, 16), dtype="float32"), seed=0)
    first_call = {}
    report = correctness.check(Tuned(), inputs, correctness.reference_forward(inputs, "float64"), torch.float32,
                               first_call=first_call)
    assert all(r["ok"] for r in report.values())
    assert seen == ["plain", "plain", "poisoned", "poisoned"]  # stage and forward, in each pass
    assert set(first_call) == {"chunk_cumsum", "fwd_pass_state", "compute_out", "forward"}
    seen.clear()

    class Untuned(Tuned):
        TUNED = False

    correctness.check(Untuned(), inputs, correctness.reference_forward(inputs, "float64"), torch.float32)
    assert seen == ["poisoned", "poisoned"]  # an untuned backend: the gate's pass only


# --- knobs honoured or refused ------------------------------------------------------------------------------
def bench_cfg(**changes):
    return OmegaConf.merge(OmegaConf.structured(config.BenchConfig), changes)


@pytest.mark.parametrize("changes, device, match", [
    pytest.param({"quantiles": [0.5]}, "cpu", "quantiles", id="median-as-quantile"),
    pytest.param({"quantiles": [0.333]}, "cpu", "quantiles", id="fractional-percent"),
    pytest.param({"flush_l2": False}, "cuda", "flush_l2", id="no-flush-on-gpu"),
    pytest.param({"host_calls": 0}, "cpu", "host_calls", id="no-host-calls"),
    pytest.param({"device_rounds": 0}, "cpu", "device_rounds", id="no-device-rounds"),
])
def test_timing_knobs_that_cannot_be_honoured_are_refused(changes, device, match):
    with pytest.raises(config.ConfigError, match=match):
        config.check_timing_knobs(bench_cfg(**changes), device)


def test_quantiles_are_honoured():
    times = timing.cpu_times(lambda: None, 0, 11, (0.1, 0.9))
    assert set(times) == {"median_ms", "p10_ms", "p90_ms"} and times["p10_ms"] <= times["median_ms"] <= times["p90_ms"]
    assert record.unit("p10_ms") == "ms"


def test_each_kernel_of_a_call_gets_its_median_quantiles_launches_and_share():
    """harness/timing.py kernel_summary over three calls' kernels (kernel_samples' form: device ms summed over
    launches, launches): a kernel missing from a call counts 0 ms there; shares add to 100."""
    calls = [{"bwd_chunk_kernel": (3.0, 1), "bwd_db_kernel": (1.0, 2)},
             {"bwd_chunk_kernel": (5.0, 1), "bwd_db_kernel": (1.2, 2), "Memset (Device)": (0.1, 1)},
             {"bwd_chunk_kernel": (4.0, 1), "bwd_db_kernel": (0.8, 2)}]
    got = timing.kernel_summary(calls, (0.2, 0.8))
    assert got["bwd_chunk_kernel"]["median_ms"] == 4.0 and got["bwd_db_kernel"]["launches"] == 2
    assert got["bwd_chunk_kernel"]["p20_ms"] == pytest.approx(3.4) and got["bwd_chunk_kernel"]["p80_ms"] == 4.6
    assert got["Memset (Device)"]["median_ms"] == 0.0
    assert sum(v["share_pct"] for v in got.values()) == pytest.approx(100.0)
    assert got["bwd_chunk_kernel"]["share_pct"] == pytest.approx(400 / 5.0)
    assert record.unit("share_pct") == "%" and record.unit("launches") == "1"
    with pytest.raises(ValueError, match="samples"):
        timing.kernel_summary([])


def test_calls_are_cut_between_their_markers_and_the_flush_is_no_calls_kernel():
    """harness/timing.py calls_between_markers: [flush, marker, call] × n, [flush, marker] -> n calls, each without
    the next call's flush; a trace that is not laid out so is refused, not misattributed."""
    fill, spin = "at::native::FillFunctor", "at::cuda::spin_kernel(long)"
    events = [(fill, 0, 50.0), (spin, 60, 1.0), ("bwd_chunk_kernel", 70, 400.0), ("bwd_db_kernel", 480, 100.0),
              ("bwd_db_kernel", 590, 120.0), (fill, 720, 50.0), (spin, 780, 1.0), ("bwd_chunk_kernel", 790, 410.0),
              (fill, 1210, 50.0), (spin, 1270, 1.0)]
    first, second = timing.calls_between_markers(events)
    assert first == {"bwd_chunk_kernel": (pytest.approx(0.4), 1), "bwd_db_kernel": (pytest.approx(0.22), 2)}
    assert second == {"bwd_chunk_kernel": (pytest.approx(0.41), 1)}
    with pytest.raises(ValueError, match="not the flush"):
        timing.calls_between_markers(events[:5] + events[6:])
    with pytest.raises(ValueError, match="markers"):
        timing.calls_between_markers(events[2:])


def test_kernel_times_off_keeps_every_points_hash():
    import dataclasses

    from harness.plan import BenchSettings, semantic

    problem = Problem(Shape(1, 32, 2, 4, 1, 4, 16))
    off, on = BenchSettings(), dataclasses.replace(BenchSettings(), kernel_times=True)
    assert "kernel_times" not in semantic("triton", None, "none", problem, off, 0, "cpu")["bench"]
    assert semantic("triton", None, "none", problem, on, 0, "cpu")["bench"]["kernel_times"] is True


def test_the_backwards_kernel_rows_carry_their_floor_where_the_model_prices_them(monkeypatch):
    """harness/measure_time.py kernel_rows: one stage per kernel (kernel:<name>), and frac_floor against the run's
    ceilings for our backward kernels only (a peer's kernel has no cost of its own)."""
    from harness import cost_model, measure_time

    problem = Problem(Shape(8, 4096, 80, 64, 1, 128, 256), dtype="bfloat16")
    costs = cost_model.costs(problem)
    calls = [{"bwd_chunk_kernel": (1.2, 1), "_chunk_scan_bwd_dx_kernel": (0.5, 1)}] * 3
    monkeypatch.setattr(timing, "kernel_samples", lambda fn, reps=10: calls)
    rows = {(stage, metric): value for stage, metric, value in
            measure_time.kernel_rows(lambda: None, (0.2, 0.8), costs, {"matmul_tflops": 700.0, "copy_gbps": 3000.0},
                                     "triton")}
    floor = cost_model.floor_seconds(costs["bwd_chunk"], "bytes", "flops", 700.0, 3000.0)
    assert rows[("kernel:bwd_chunk_kernel", "frac_floor")] == pytest.approx(floor / 1.2e-3)
    assert rows[("kernel:_chunk_scan_bwd_dx_kernel", "median_ms")] == 0.5
    assert ("kernel:_chunk_scan_bwd_dx_kernel", "frac_floor") not in rows

    def fails(fn, reps=10):
        raise RuntimeError("CUPTI is busy")

    monkeypatch.setattr(timing, "kernel_samples", fails)
    ((stage, metric, missing),) = measure_time.kernel_rows(lambda: None, (0.2, 0.8), costs, {}, "triton")
    assert stage == "kernel:*" and isinstance(missing, timing.Missing) and "CUPTI is busy" in missing.reason


def test_a_graph_that_cannot_be_captured_records_why():
    def fails():
        raise RuntimeError("capture refused")

    missing = timing.graph_median(fails, 10)
    assert isinstance(missing, timing.Missing) and "CUDA-graph" in missing.reason
    row = record.metric_columns("forward", "graph_median_ms", missing)
    assert row["value"] != row["value"] and row["note"] == missing.reason


def test_an_empty_capture_is_refused_and_other_warnings_pass_on(monkeypatch):
    """torch's warning that a captured CUDA graph is empty (raised as the capture ends) turns into an error that
    graph_median records as Missing; any other warning of the capture goes through the warning filters unchanged.
    torch.cuda's graph objects are stood in for: no GPU here."""
    import contextlib
    import warnings

    from harness import timing

    def fake_graph(message):
        @contextlib.contextmanager
        def graph(g, stream=None):
            yield
            warnings.warn(message, UserWarning, stacklevel=2)
        return graph

    monkeypatch.setattr(timing.torch.cuda, "CUDAGraph", lambda: object())
    monkeypatch.setattr(timing.torch.cuda, "graph", fake_graph("The CUDA Graph is empty. This usually means ..."))
    with pytest.raises(RuntimeError, match="no GPU work"):
        timing.capture(lambda: None, stream=None)
    monkeypatch.setattr(timing.torch.cuda, "graph", fake_graph("something else"))
    with pytest.warns(UserWarning, match="something else"):
        timing.capture(lambda: None, stream=None)
