"""A sweep submitted to a real SLURM (slurmctld + slurmd on 127.0.0.1) through Hydra's submitit launcher.

The cluster is tests/slurm/cluster.py's: started once for this module, torn down even when a test fails. The
sweep is `python -m experiments.bench -m hydra/launcher=slurm_cpu ...` with three points: the reference and
upstream mamba_ssm (Triton interpreter) at the tiny shape, and cutile on device=cpu, which cannot run there and
must come back as a recorded failed point while the others complete. A second, one-point sweep goes through the
GPU config (hydra/launcher=slurm, --gres=gpu:1) onto the node's stand-in GPU. Needs the Debian packages
slurm-wlm and munge (skipped, saying so, when their programs are absent) and the `slurm` extra
(hydra-submitit-launcher). Runtime about 55 s on 2 CPU cores.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from tests.slurm.cluster import NODE, PARTITION, LocalSlurm, missing_binaries

REPO = Path(__file__).resolve().parents[2]
MISSING = missing_binaries()
pytestmark = pytest.mark.skipif(
    bool(MISSING), reason=f"SLURM/munge programs absent ({', '.join(MISSING)}): apt-get install slurm-wlm munge")

SWEEP = "slurm_ci"
POINTS = {  # backend -> expected status
    "reference": "ok",
    "mamba_ssm": "ok",
    "cutile": "failed",  # device=cpu: cutile's check_device refuses (and without CUDA it is unavailable at all)
}
SWEEP_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def cluster():
    if importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is None:
        pytest.fail("hydra-submitit-launcher is not installed: pip install -e '.[slurm]'")
    root = Path(tempfile.mkdtemp(prefix="ssd-slurm-"))  # short: munge's socket path must fit in sun_path
    try:
        with LocalSlurm(root / "cluster") as running:  # a start-up failure raises with the daemons' logs
            yield running
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_sbatch_job_runs_on_the_local_node(cluster):
    """The cluster alone: a batch job with one srun step completes on our node, under an id scontrol knows."""
    out = cluster.root.parent / "hello.out"
    job = cluster.run(["sbatch", "--parsable", f"--output={out}", "--wrap",
                       "echo job=$SLURM_JOB_ID; srun printenv SLURMD_NODENAME"]).stdout.strip()
    cluster.wait_jobs_done(60)
    info = cluster.show_job(job)
    assert (info["JobState"], info["ExitCode"], info["NodeList"]) == ("COMPLETED", "0:0", NODE), cluster.logs()
    assert out.read_text().split() == [f"job={job}", NODE]


@pytest.fixture(scope="module")
def sweep(cluster):
    """Runs the sweep once; returns (completed process, results dir, sweep dir)."""
    root = cluster.root.parent
    results, sweep_dir = root / "results", root / "multirun"
    # Nothing of the test's own environment may make the jobs work: the interpreter flag must come from the
    # launcher config (slurm_cpu's setup line), SLURM_CONF is the only way to this cluster.
    env = {k: v for k, v in cluster.env.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-m", "experiments.bench", "-m", "hydra/launcher=slurm_cpu",
           f"backend={','.join(POINTS)}", "shape=tiny", "dtype=float32", "device=cpu", "bench=check_only",
           "logger=local", f"results_dir={results}", f"sweep_name={SWEEP}", f"hydra.sweep.dir={sweep_dir}"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=SWEEP_TIMEOUT_S)
    # The launcher returns once every job has written its result; the job processes may still be exiting.
    cluster.wait_jobs_done(120)
    return proc, results, sweep_dir


def job_records(sweep_dir: Path) -> dict[int, dict]:
    """Hydra job number -> {'job_id': hydra.job.id (the submitit/SLURM id), 'marker': point.json}."""
    records = {}
    for hydra_yaml in sweep_dir.glob("*/.hydra/hydra.yaml"):
        job = yaml.safe_load(hydra_yaml.read_text())["hydra"]["job"]
        marker = json.loads((hydra_yaml.parent.parent / "point.json").read_text())
        records[int(job["num"])] = {"job_id": str(job["id"]), "marker": marker}
    return records


def test_sweep_completes_and_reports(sweep, cluster):
    proc, _, _ = sweep
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}\n{cluster.logs()}"
    failed = sum(s != "ok" for s in POINTS.values())
    assert f"[bench] sweep {SWEEP}: {len(POINTS)} points, {failed} failed" in proc.stdout, proc.stdout[-4000:]


def test_every_point_ran_as_a_job_of_this_controller(sweep, cluster):
    _, _, sweep_dir = sweep
    records = job_records(sweep_dir)
    assert sorted(records) == list(range(len(POINTS))), records
    array_ids = set()
    for record in records.values():
        # hydra.job.id is submitit's "<array job id>_<task>"; scontrol fails on an id this controller never issued
        info = cluster.show_job(record["job_id"])
        assert f"{info['ArrayJobId']}_{info['ArrayTaskId']}" == record["job_id"]
        assert (info["JobState"], info["Partition"], info["NodeList"]) == ("COMPLETED", PARTITION, NODE), info
        assert info["JobName"] == "bench"
        array_ids.add(info["ArrayJobId"])
    assert len(array_ids) == 1, f"one sbatch array per sweep, got {array_ids}"
    # The check can fail: an id past the last one issued is unknown to the controller.
    unknown = max(int(cluster.show_job(r["job_id"])["JobId"]) for r in records.values()) + 1000
    with pytest.raises(subprocess.CalledProcessError):
        cluster.show_job(str(unknown))


def test_jobs_ran_the_launcher_config(sweep):
    """slurm_cpu: no GPU request, one CPU, and the interpreter flag exported in the batch script."""
    _, _, sweep_dir = sweep
    scripts = list((sweep_dir / ".submitit").glob(".submission_file_*.sh"))
    assert len(scripts) == 1, scripts
    text = scripts[0].read_text()
    assert "export TRITON_INTERPRET=1" in text
    assert "#SBATCH --cpus-per-task=1" in text
    assert "--gres" not in text and "--gpus" not in text and "--mem" not in text


def test_rows_arrived_with_provenance(sweep, cluster):
    import pandas as pd

    from harness import store

    _, results, sweep_dir = sweep
    rows = store.load(results / SWEEP)
    records = job_records(sweep_dir)
    assert set(rows["backend"]) == set(POINTS)
    for backend, expected in POINTS.items():
        point = rows[rows["backend"] == backend]
        assert point["config_hash"].nunique() == 1 and point["run_id"].nunique() == 1, backend
        assert set(point["status"]) == {expected}, (backend, point[["status", "error"]].drop_duplicates())
        ok_row = point[(point["stage"] == "point") & (point["metric"] == "ok")]["value"]
        assert list(ok_row) == [1.0 if expected == "ok" else 0.0]
        if expected == "ok":
            errs = point[point["metric"] == "rel_err"]
            assert len(errs) >= 4 and errs["value"].notna().all() and (errs["value"] < 1e-4).all(), backend
        else:
            assert point["error"].str.contains("BackendUnavailable").all(), point["error"].iloc[0]
        for column in ("host", "python", "v_torch", "v_hydra", "git_commit", "sweep_id", "timestamp"):
            assert point[column].notna().all(), (backend, column)
        # the row's job number leads to the job's Hydra record, which names the same config
        num = int(point["job_num"].iloc[0])
        assert records[num]["marker"]["config_hash"] == point["config_hash"].iloc[0]
    assert rows.groupby("backend")["sweep_id"].nunique().max() == 1 and rows["sweep_id"].nunique() == 1

    # The SLURM job id in each row, issued by this controller, and the one the Hydra record names.
    assert "slurm_job_id" in rows.columns, (
        "rows lack the provenance column slurm_job_id (SLURM_JOB_ID of the job that measured the point): "
        "harness/provenance.py must record it")
    for backend in POINTS:
        point = rows[rows["backend"] == backend]
        ids = point["slurm_job_id"].dropna().unique()
        assert len(ids) == 1 and pd.notna(ids[0]) and len(point["slurm_job_id"].dropna()) == len(point), backend
        info = cluster.show_job(ids[0])
        assert info["JobId"] == str(ids[0])
        num = int(point["job_num"].iloc[0])
        assert f"{info['ArrayJobId']}_{info['ArrayTaskId']}" == records[num]["job_id"], backend
    assert rows.groupby("backend")["slurm_job_id"].first().nunique() == len(POINTS)


def test_gpu_launcher_config_is_scheduled(cluster):
    """hydra/launcher=slurm (the GPU config) as a real cluster reads it: one gres/gpu per job, the time limit.
    The node's GPU is a stand-in bound to /dev/null, so the point itself runs on the CPU."""
    root = cluster.root.parent
    results, sweep_dir = root / "results_gpu", root / "multirun_gpu"
    cmd = [sys.executable, "-m", "experiments.bench", "-m", "hydra/launcher=slurm",
           f"hydra.launcher.partition={PARTITION}", "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=1",
           "backend=reference", "shape=tiny", "dtype=float32", "device=cpu", "bench=check_only", "logger=local",
           f"results_dir={results}", "sweep_name=slurm_gpu", f"hydra.sweep.dir={sweep_dir}"]
    proc = subprocess.run(cmd, cwd=REPO, env=cluster.env, capture_output=True, text=True, timeout=SWEEP_TIMEOUT_S)
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}\n{cluster.logs()}"
    cluster.wait_jobs_done(60)
    text = next((sweep_dir / ".submitit").glob(".submission_file_*.sh")).read_text()
    for flag in ("--gres=gpu:1", "--time=60", f"--partition={PARTITION}", "--mem=1GB"):
        assert f"#SBATCH {flag}\n" in text, flag
    info = cluster.show_job(job_records(sweep_dir)[0]["job_id"])
    assert info["JobState"] == "COMPLETED" and info.get("TresPerNode", "").endswith("gpu:1"), info
    from harness import store

    rows = store.load(results / "slurm_gpu")
    assert set(rows["status"]) == {"ok"} and set(rows["backend"]) == {"reference"}
