"""`python -m experiments.bench [overrides]` — one point (or, with -m or an experiment overlay, a sweep).

The Hydra entry of a pipeline of typed steps, each its own module and testable without Hydra:
config --plan.from_config--> Point (start-up checks, identity: config hash, code key, sweep) -> skip (unless force)
if a point with its config hash and code key is stored as ok, or as failed with retry_failed=false
(record.already_stored) --plan.build--> Plan (built backend, seeded inputs) --gate.run--> GateReport (reference,
tuning resolved in one plain pass, the gate; first calls timed) --measure_time.run--> Timings (stages, forward
through the public entry, ceilings, derived metrics, api_overhead) --record.rows--> Rows (Parquet, atomically;
W&B). Any failure after the start-up checks is recorded as a failed point and the sweep goes on (`measure`). With
no arguments at all it runs the default sweep: experiment=headline with CUDA, experiment=cpu without (announced on
one line).
"""

from __future__ import annotations

import os
import sys

import torch

# Without CUDA the Triton kernels (mamba_ssm's) run in the interpreter; the flag must be set before any
# @triton.jit is applied, i.e. before a backend module is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import json  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from hydra.types import RunMode  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from harness import config as conf  # noqa: E402
from harness import gate, measure_time, plan, record, secrets  # noqa: E402
from harness.record import Rows  # noqa: E402

conf.register_schemas()
conf.register_resolvers()


def original_cwd() -> Path:
    try:
        return Path(hydra.utils.get_original_cwd())
    except ValueError:
        return Path.cwd()


def sweep_identity(hc) -> tuple[str, int]:
    """(sweep_id, job number). Shards of one multi-GPU sweep share SSD_SWEEP_ID."""
    if os.environ.get("SSD_SWEEP_ID"):
        sweep_id = os.environ["SSD_SWEEP_ID"]
    elif hc.mode == RunMode.MULTIRUN:
        sweep_id = Path(hc.sweep.dir).name
    else:
        sweep_id = Path(hc.run.dir).name
    num = hc.job.num if hc.mode == RunMode.MULTIRUN else 0
    return sweep_id, int(num or 0)


def run_identity(sweep_id: str, environ=os.environ) -> tuple[str, int]:
    """(run_group, round): SSD_RUN_GROUP and SSD_ROUND as scripts/rounds.sh, before_after.sh and gpu_session.sh set
    them (one group per invocation), else the sweep's own id and round 1. A round that is not a positive integer
    is refused (ConfigError naming SSD_ROUND)."""
    text = environ.get("SSD_ROUND") or "1"
    if not text.isdigit() or int(text) < 1:
        raise conf.ConfigError(f"SSD_ROUND must be a positive integer (the round of scripts/rounds.sh), got {text!r}")
    return environ.get("SSD_RUN_GROUP") or sweep_id, int(text)


# After a kernel's illegal memory access the process's CUDA context is unusable: every later point of the same
# process would fail with the same error and be misattributed. Such points are refused with the first culprit.
_CUDA_CONTEXT_LOST: list[str] = []


def context_lost(exc: BaseException) -> bool:
    return "illegal memory access" in str(exc) or "unspecified launch failure" in str(exc)


def measure(point: plan.Point, logger: str = "local", wandb_run: str | None = None) -> Rows:
    """The steps of one point after the start-up checks: Plan → GateReport → Timings → Rows. Any failure is a
    result: the rows of the steps reached, status failed and why; a failed gate times nothing."""
    built = report = timings = None
    error = None
    try:
        if _CUDA_CONTEXT_LOST:
            raise RuntimeError(f"not run: this process's CUDA context was lost by an earlier point "
                               f"({_CUDA_CONTEXT_LOST[0]}); run the point in a process of its own")
        built = plan.build(point)
        report = gate.run(built)
        timings = measure_time.run(built, report)  # refuses a failed gate (GateFailure)
    except Exception as exc:  # noqa: BLE001 - a failed point is a result; the sweep goes on
        error = secrets.redact(f"{type(exc).__name__}: {exc}")
        if context_lost(exc) and not _CUDA_CONTEXT_LOST:
            _CUDA_CONTEXT_LOST.append(f"{point.backend} {point.shape_name}: {type(exc).__name__}")
        print(f"[bench] FAILED {point.backend} {point.shape_name}: {error}")
        if os.environ.get("SSD_BENCH_TRACEBACK"):
            print(secrets.redact(traceback.format_exc()))
    return record.rows(point, built, report, timings, error, logger, wandb_run)


def write_marker(hc, payload: dict) -> None:
    out = Path(hc.runtime.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "point.json").write_text(json.dumps(payload, default=str))


def run_point(cfg: DictConfig) -> dict:
    """The Hydra job: the Point of the config (start-up checks raise ConfigError), the skip rule, the steps, the
    rows stored and logged."""
    conf.validate(cfg)  # ConfigError: a start-up failure, not a result
    plan.resolve_device(cfg.device)
    hc = HydraConfig.get()
    sweep_id, job_num = sweep_identity(hc)
    run_group, round_ = run_identity(sweep_id)
    if hc.mode == RunMode.MULTIRUN and job_num % cfg.launch.num_shards != cfg.launch.shard:
        return {"status": "other-shard"}
    point = plan.from_config(cfg, sweep_id, job_num, dict(hc.runtime.choices), run_group, round_)
    output = record.Output.from_config(cfg, original_cwd())
    chash = point.identity.config_hash
    stored = record.already_stored(point, output)
    if stored is not None:
        print(f"[bench] skip {point.backend} {point.shape_name}: config {chash} already stored by this "
              f"code ({point.identity.code_key}) in {stored} (force=true re-runs it)")
        write_marker(hc, {"config_hash": chash, "status": "skipped", "file": str(stored),
                          "results_dir": str(output.results_dir)})
        return {"status": "skipped", "config_hash": chash, "file": str(stored)}
    logger, run = record.start_log(point, output)
    rows = measure(point, logger, run.path if run is not None else None)
    path = record.write(rows, point, output, run)
    write_marker(hc, {"config_hash": chash, "status": rows.status, "file": str(path),
                      "results_dir": str(output.results_dir)})
    return {"status": rows.status, "config_hash": chash, "file": str(path)}


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def hydra_entry(cfg: DictConfig) -> dict:
    return run_point(cfg)


def default_sweep_args(argv: list[str]) -> list[str]:
    """No arguments: the device's default sweep, announced on one line."""
    if len(argv) > 1:
        return argv
    if torch.cuda.is_available():
        print("[bench] no arguments: running experiment=headline (CUDA found)")
        return [*argv, "experiment=headline"]
    print("[bench] no arguments and no CUDA: running experiment=cpu (reference and mamba_ssm at shape tiny, "
          "Triton interpreter, wall-clock timing)")
    return [*argv, "experiment=cpu"]


def main() -> None:
    sys.argv = default_sweep_args(sys.argv)
    hydra_entry()


if __name__ == "__main__":
    main()
