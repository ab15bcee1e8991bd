"""Step 4 of a point's life: what the earlier steps produced → `Rows` (long format, harness/store.py COLUMNS),
secrets redacted, written atomically to the store and logged to W&B. Also the skip rule (a point stored by the
same code is not measured again) and the output settings (`Output`)."""

from __future__ import annotations

import dataclasses
import json
import math
import uuid
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig

from harness import secrets, store, timing, wandb_log
from harness import workloads as workload_registry
from harness.gate import GateReport
from harness.measure_time import Timings, timer_columns
from harness.plan import Plan, Point
from impls.inputs import DISTRIBUTION
from impls.stages import FORWARD_STAGE_NAMES
from impls.tuning import join_protocols

TIMED_ONE_STAGE = FORWARD_STAGE_NAMES  # a row of one stage reads its kernels' protocols

UNITS = {"median_ms": "ms", "p20_ms": "ms", "p80_ms": "ms", "graph_median_ms": "ms", "compile_s": "s",
         "rel_err": "1", "tol": "1", "ok": "1", "flops": "flop", "bytes": "byte", "bytes_fused": "byte",
         "tflops": "TFLOP/s", "gbps": "GB/s", "frac_floor": "1", "frac_floor_fused": "1",
         "flops_recompute": "flop", "bytes_recompute": "byte", "bytes_fused_recompute": "byte",
         "frac_floor_recompute": "1", "frac_floor_fused_recompute": "1",
         "matmul_tflops": "TFLOP/s", "copy_gbps": "GB/s", "block_err": "1", "bound_ratio": "1",
         "peak_mem_bytes": "byte", "deterministic": "1", "mamba_ssm_rel_err": "1", "mamba_ssm_rule": "1",
         "tokens_per_s": "token/s", "launches": "1", "share_pct": "%"}


def unit(metric: str) -> str:
    return UNITS.get(metric) or ("ms" if metric.endswith("_ms") else "us" if metric.endswith("_us") else "")


@dataclass(frozen=True)
class Output:
    """Where a point's rows go and when a stored one is measured again."""

    results_dir: Path
    logger: str = "local"  # logger.kind: auto | wandb | local
    project: str = "ssd-kernels"
    entity: str | None = None
    mode: str = "offline"
    wandb_dir: str = "."
    base_dir: Path = Path(".")  # where relative paths start (the directory the command was started in)
    force: bool = False
    retry_failed: bool = True
    verbose: bool = False  # W&B's own terminal lines (its banners and run summary per point) shown

    @classmethod
    def from_config(cls, cfg: DictConfig, base_dir: Path) -> Output:
        results_dir = Path(cfg.results_dir)
        return cls(results_dir=results_dir if results_dir.is_absolute() else base_dir / results_dir,
                   logger=cfg.logger.kind, project=cfg.logger.project, entity=cfg.logger.entity,
                   mode=cfg.logger.mode, wandb_dir=cfg.logger.dir, base_dir=base_dir, force=bool(cfg.force),
                   retry_failed=bool(cfg.retry_failed), verbose=bool(cfg.verbose))


@dataclass(frozen=True)
class Rows:
    status: str  # ok | failed
    error: str | None
    rows: tuple[dict, ...]  # redacted, one per (stage, metric), every COLUMNS key

    def frame(self) -> pd.DataFrame:
        return store.frame(list(self.rows))


def already_stored(point: Point, output: Output) -> Path | None:
    """The skip rule: the file holding a point with this config hash stored by this code (code_key) as ok, or at
    all with retry_failed off; None (run it) when there is none, and always with force."""
    if output.force:
        return None
    return store.measured_file(output.results_dir, point.identity.config_hash, point.identity.code_key,
                               output.retry_failed)


def workload_columns(point: Point) -> dict:
    """The columns the point's workload adds to its rows (its shape schema: the layer's d_model, expand, d_conv);
    ValueError naming one the store lacks (harness/store.py COLUMNS, ADDED_IN)."""
    workload = workload_registry.get(point.workload)
    columns = workload.shape.columns(point.problem.shape, point.workload_options)
    unknown = sorted(set(columns) - set(store.COLUMNS))
    if unknown:
        raise ValueError(f"workload {workload.name!r}: columns {unknown} are not in harness.store.COLUMNS")
    return {**columns, "cost_model": cost_model_version(workload, point.direction)}


def cost_model_version(workload, direction: str) -> str | None:
    """The `cost_model` column: the versions of the cost entries a point's rows carry (`cost_entries`): the
    forward's model alone on a forward point, "<forward's>+<backward's>" on another where the workload has both."""
    if direction == "forward" or not workload.backward_cost_model:
        return workload.cost_model
    return f"{workload.cost_model}+{workload.backward_cost_model}"


def cost_entries(workload, point: Point) -> dict[str, dict[str, float]]:
    """The workload's cost entries a point's rows carry: on a forward point only its forward's (the chain's stages
    and "forward"), on another every entry (a backward's too)."""
    costs = workload.cost(point.problem, point.workload_options)
    if point.direction == "forward":
        return {stage: cost for stage, cost in costs.items() if stage in workload.stage_names}
    return costs


def base_row(point: Point) -> dict:
    """The columns every row of `point` shares."""
    ident, problem = point.identity, point.problem
    row = {
        "schema_version": store.SCHEMA_VERSION, "run_id": uuid.uuid4().hex, "sweep_id": ident.sweep_id,
        "run_group": ident.run_group, "round": ident.round,
        "sweep_name": ident.sweep_name, "job_num": ident.job_num, "timestamp": ident.timestamp,
        "config_hash": ident.config_hash, "backend": point.backend, "switches": point.switches_json,
        "ablation": point.ablation, "tuning": "none", "describe": None,
        "workload": point.workload, "direction": point.direction,
        "shape_name": point.shape_name, **dataclasses.asdict(problem.shape),
        "problem_name": point.problem_name,
        "problem": json.dumps(dataclasses.asdict(problem), sort_keys=True, default=str),
        "dtype": problem.dtype, "seed": point.seed, "distribution": DISTRIBUTION,
        "inputs_drawn_on": point.draw_device,
        "device": str(point.device), "device_name": point.device_name, "statistic": point.bench.statistic,
        "hydra_choices": ident.hydra_choices, "config": ident.config_yaml, **workload_columns(point),
    }
    row.update(point.provenance)
    row["code_key"] = ident.code_key
    row.update(timer_columns(point.bench, point.device))
    return row


def rows(point: Point, plan: Plan | None, gate: GateReport | None, timings: Timings | None, error: str | None,
         logger: str = "local", wandb_run: str | None = None) -> Rows:
    """The rows of one point from whatever steps it reached: cost-model rows once it had a Plan, the gate's, the
    timings', and the point's own `ok` row; status failed when `error` is given."""
    status = "ok" if error is None else "failed"
    base = {**base_row(point), "logger": logger, "wandb_run": wandb_run}
    if plan is not None and plan.backend.switches != point.switches:  # the next arrangement ran (Plan's backend)
        base["switches"] = json.dumps(dataclasses.asdict(plan.backend.switches), sort_keys=True, default=str)
    if gate is not None:
        base.update(reference=gate.reference, gate=gate.description)
    if timings is not None:
        base.update(describe=json.dumps(timings.describe, sort_keys=True, default=str),
                    tuning=tuning_sources(timings.describe))
    describe = timings.describe if timings is not None else None
    precision = plan.precision if plan is not None else {}
    metrics = []
    if plan is not None:
        costs = cost_entries(workload_registry.get(point.workload), point)
        metrics += [(stage, key, value) for stage, cost in costs.items() for key, value in cost.items()]
    metrics += gate.metrics() if gate is not None else []
    metrics += list(timings.metrics) if timings is not None else []
    metrics.append(("point", "ok", 1.0 if status == "ok" else 0.0))
    out = tuple(secrets.redact({**base, **metric_columns(stage, metric, value), "precision": precision.get(stage),
                                "tile_protocol": tile_protocol(describe, stage), "status": status, "error": error})
                for stage, metric, value in metrics)
    return Rows(status=status, error=error, rows=out)


def metric_columns(stage: str, metric: str, value) -> dict:
    """One row's stage, metric, value, unit and note; a timing.Missing value becomes NaN with its reason in note."""
    note = None
    if isinstance(value, timing.Missing):
        value, note = math.nan, value.reason
    value = float(value) if value is not None else math.nan
    return {"stage": stage, "metric": metric, "value": value, "note": note, "unit": unit(metric)}


def tuning_sources(describe: dict) -> str:
    """Where each stage's config came from (search / record / fallback), as the backend reports it in
    describe() ("tuning", or per-stage "source" under "stages" or "tuning_sources"); "none" for untuned backends."""
    if isinstance(describe.get("tuning"), str):
        return describe["tuning"]
    # "stages" may also be a plain list of the stages a backend has (fla): only a mapping carries sources
    sources = describe.get("tuning") or {
        stage: info["source"]
        for key in ("stages", "tuning_sources")
        if isinstance(describe.get(key), dict)
        for stage, info in describe[key].items()
        if isinstance(info, dict) and "source" in info
    }
    return json.dumps(sources, sort_keys=True) if sources else "none"


# the tuned kernels a row's stage is made of, where their names differ from the stage's (our Triton tunes stage 2 as
# two kernels, chunk_state and state_passing)
STAGE_KERNELS = {"fwd_pass_state": ("fwd_pass_state", "chunk_state", "state_passing")}

def tile_protocol(describe: dict | None, stage: str) -> str:
    """The row's `tile_protocol` (impls/tuning.py TILE_PROTOCOLS): the backend's own word for every stage
    (describe()["tile_protocol"]: untuned, peer-autotune), else the protocol its tuning resolution reported for the
    stage's kernels ("stages" or "tuning_sources" entries), several joined by "+"; the forward, the point and a
    part of the forward take every stage's. "unknown" without describe() or where it says nothing for the stage;
    "n/a" for the ceilings, which run no kernel of the backend."""
    if stage == "ceiling":
        return "n/a"
    if not isinstance(describe, dict):
        return "unknown"
    if isinstance(describe.get("tile_protocol"), str):
        return describe["tile_protocol"]
    per_kernel = {name: info["tile_protocol"] for key in ("stages", "tuning_sources")
                  if isinstance(describe.get(key), dict)
                  for name, info in describe[key].items() if isinstance(info, dict) and info.get("tile_protocol")}
    if stage in TIMED_ONE_STAGE:
        found = [per_kernel[k] for k in STAGE_KERNELS.get(stage, (stage,)) if k in per_kernel]
    else:
        found = list(per_kernel.values())
    return join_protocols(found) if found else "unknown"


# --- where the rows go ------------------------------------------------------------------------------------

def start_log(point: Point, output: Output):
    """(logger, W&B run or None): one W&B run per point when logger.kind asks for it and it starts; W&B trouble
    falls back to local logging, never loses the measurement."""
    logger = wandb_log.choose(output.logger)
    if logger != "wandb":
        return logger, None
    try:
        run = wandb_log.start(project=output.project, entity=output.entity, group=point.identity.sweep_id,
                              job_type=point.backend, name=f"{point.backend}-{point.identity.config_hash}",
                              config=secrets.redact(point.identity.config),
                              directory=wandb_log.wandb_dir(output.wandb_dir, output.base_dir), mode=output.mode,
                              silent=not output.verbose)
    except Exception as exc:  # noqa: BLE001 - W&B trouble must not lose the measurement
        print(secrets.redact(f"[bench] W&B unavailable ({type(exc).__name__}: {exc}); logging locally"))
        return "local", None
    return "wandb", run


def write(result: Rows, point: Point, output: Output, run=None) -> Path:
    """The rows to results_dir/<sweep_name>/<hash>_<run>.parquet (atomically), then to the W&B run."""
    df = result.frame()
    name = f"{point.identity.config_hash}_{result.rows[0]['run_id'][:12]}.parquet"
    path = store.write_atomic(df, output.results_dir / point.identity.sweep_name / name)
    if run is not None:
        wandb_log.finish(run, df, wandb_log.summary_metrics(df))
    return path
