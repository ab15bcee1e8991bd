"""`python -m experiments.bench [overrides]` — one point (or, with -m or an experiment overlay, a sweep).

Each job: start-up checks (experiments.config.validate) -> skip (unless force) if a point with its config hash
and code key (commit, diff, versions, tuning records: experiments.provenance.code_key) is stored as ok, or as
failed with retry_failed=false -> inputs (impls.inputs.make_inputs, seeded) -> reference -> tuning resolved
in one plain pass, then the correctness gate; together they measure each stage's first call (compile / autotune)
-> timing per stage and of the whole forward (through the public entry) -> ceilings -> derived metrics -> rows
(Parquet, atomically) -> W&B. Any failure after the start-up checks is recorded as a failed
point and the sweep goes on. With no arguments at all it runs the default sweep: experiment=headline with CUDA,
experiment=cpu without (announced on one line).
"""

from __future__ import annotations

import os
import sys

import torch

# Without CUDA the Triton kernels (mamba_ssm's) run in the interpreter; the flag must be set before any
# @triton.jit is applied, i.e. before a backend module is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import dataclasses  # noqa: E402
import datetime as _dt  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import traceback  # noqa: E402
import uuid  # noqa: E402
from pathlib import Path  # noqa: E402

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from hydra.types import RunMode  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from experiments import (  # noqa: E402
    api_overhead,
    correctness,
    cost_model,
    provenance,
    secrets,
    store,
    timing,
    wandb_log,
)
from experiments import config as conf  # noqa: E402
from impls.inputs import DEVICE_DRAW_ELEMENTS, DISTRIBUTION, make_inputs  # noqa: E402
from impls.problem import DTYPES  # noqa: E402
from impls.registry import get_backend, require  # noqa: E402

conf.register_schemas()
conf.register_resolvers()

UNITS = {"median_ms": "ms", "p20_ms": "ms", "p80_ms": "ms", "graph_median_ms": "ms", "compile_s": "s",
         "rel_err": "1", "tol": "1", "ok": "1", "flops": "flop", "bytes": "byte", "bytes_fused": "byte",
         "tflops": "TFLOP/s", "gbps": "GB/s", "frac_floor": "1", "frac_floor_fused": "1",
         "matmul_tflops": "TFLOP/s", "copy_gbps": "GB/s", "block_err": "1", "mamba_ssm_rel_err": "1",
         "mamba_ssm_rule": "1"}


def resolve_device(requested: str) -> torch.device:
    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise conf.ConfigError("device=cuda but torch.cuda.is_available() is False")
    return torch.device("cuda", torch.cuda.current_device())


def draw_device(problem, device: torch.device) -> str:
    """Where the inputs' random numbers are drawn: on the GPU for problems too big to draw on the CPU quickly."""
    s = problem.shape
    big = s.batch * s.seqlen * s.nheads * s.headdim > DEVICE_DRAW_ELEMENTS
    return device.type if big and device.type == "cuda" else "cpu"


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


def base_row(cfg: DictConfig, problem, semantic, chash, device, hc, sweep_id, job_num, prov: dict) -> dict:
    s = problem.shape
    row = {
        "schema_version": store.SCHEMA_VERSION, "run_id": uuid.uuid4().hex, "sweep_id": sweep_id,
        "sweep_name": cfg.sweep_name, "job_num": job_num,
        "timestamp": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "config_hash": chash, "backend": conf.backend_name(cfg),
        "switches": json.dumps(semantic["switches"], sort_keys=True, default=str),
        "ablation": cfg.backend.ablation, "tuning": "none", "describe": None,
        "shape_name": cfg.shape.name, **dataclasses.asdict(s),
        "problem_name": cfg.problem.name,
        "problem": json.dumps(dataclasses.asdict(problem), sort_keys=True, default=str),
        "dtype": problem.dtype, "seed": int(cfg.seed), "distribution": DISTRIBUTION,
        "inputs_drawn_on": draw_device(problem, device),
        "device": str(device), "device_name": semantic["device"], "statistic": cfg.bench.statistic,
        "cost_model": cost_model.MODEL_VERSION,
        "hydra_choices": json.dumps({k: v for k, v in hc.runtime.choices.items()}, sort_keys=True, default=str),
        "config": OmegaConf.to_yaml(cfg, resolve=True),
    }
    row.update(prov)
    row["code_key"] = provenance.code_key(prov, conf.backend_name(cfg), semantic["device"])
    return row


class Point:
    """Accumulates the rows of one point."""

    def __init__(self, base: dict):
        self.base = base
        self.rows: list[dict] = []
        self.precision: dict[str, str] = {}  # stage -> the matmul precision the backend reports for it

    def add(self, stage: str, metric: str, value, note: str | None = None) -> None:
        """One row; a timing.Missing value becomes NaN with its reason in `note`."""
        if isinstance(value, timing.Missing):
            value, note = math.nan, value.reason
        value = float(value) if value is not None else math.nan
        self.rows.append({**self.base, "stage": stage, "metric": metric, "value": value, "note": note,
                          "unit": unit(metric), "precision": self.precision.get(stage)})

    def finalize(self, status: str, error: str | None) -> list[dict]:
        self.add("point", "ok", 1.0 if status == "ok" else 0.0)
        for row in self.rows:
            row["status"], row["error"] = status, error
        return [secrets.redact(row) for row in self.rows]


def unit(metric: str) -> str:
    return UNITS.get(metric) or ("ms" if metric.endswith("_ms") else "us" if metric.endswith("_us") else "")


# After a kernel's illegal memory access the process's CUDA context is unusable: every later point of the same
# process would fail with the same error and be misattributed. Such points are refused with the first culprit.
_CUDA_CONTEXT_LOST: list[str] = []


def context_lost(exc: BaseException) -> bool:
    return "illegal memory access" in str(exc) or "unspecified launch failure" in str(exc)


def measure(cfg, point: Point, problem, switches, device) -> None:
    """Everything after the start-up checks; raises on any failure (the caller records it)."""
    if _CUDA_CONTEXT_LOST:
        raise RuntimeError(f"not run: this process's CUDA context was lost by an earlier point "
                           f"({_CUDA_CONTEXT_LOST[0]}); run the point in a process of its own")
    bench = cfg.bench
    backend = get_backend(conf.backend_name(cfg), switches)
    require(backend, problem, device)
    dtype = DTYPES[problem.dtype]
    point.precision = {stage: backend.precision(stage, dtype, device) for stage in backend.STAGES}
    inputs = make_inputs(problem, device=device, seed=int(cfg.seed), draw_device=draw_device(problem, device))
    correctness.refuse_unsafe_inputs(backend, inputs)
    costs = cost_model.costs(problem)
    for stage, cost in costs.items():
        for key, value in cost.items():
            point.add(stage, key, value)

    first_call: dict[str, float] = {}
    if bench.check:
        kind = correctness.reference_kind(inputs, device, bench.reference)
        point.base["reference"] = kind
        ref = correctness.reference_forward(inputs, kind)
        report = correctness.check(backend, inputs, ref, dtype, device, first_call)
        rule = correctness.mamba_ssm_rule(backend, inputs, ref, problem, dtype, device, report,
                                          cache_key=(problem, int(cfg.seed), kind))
        point.base["gate"] = gate_description(report, rule)
        for stage, r in report.items():
            point.add(stage, "rel_err", r["rel_err"])
            point.add(stage, "block_err", r["block_err"])
            point.add(stage, "tol", r["tol"])
            point.add(stage, "ok", 1.0 if r["ok"] else 0.0)
        point.add("forward", "mamba_ssm_rel_err", rule["mamba_ssm_rel_err"])
        point.add("forward", "mamba_ssm_rule", 1.0 if rule["applied"] else 0.0)
        for stage, seconds in first_call.items():
            point.add(stage, "compile_s", seconds)
        failures = [r["error"] for r in report.values() if not r["ok"]] + ([] if rule["ok"] else [rule["error"]])
        if failures:
            raise correctness.GateFailure("; ".join(failures))
    else:
        point.base["reference"] = point.base["gate"] = None
        correctness.run_stages(backend, inputs, device, first_call)
        for stage, seconds in first_call.items():
            point.add(stage, "compile_s", seconds)

    if bench.time:
        ceilings = {}
        if device.type == "cuda" and bench.ceilings:
            ceilings = timing.ceilings(device, dtype, bench.rep_ms)
            for key, value in ceilings.items():
                point.add("ceiling", key, value)
        for stage, fn in correctness.stage_callables(backend, inputs).items():
            if stage not in bench.stages and not stage.startswith("part:"):
                continue
            if device.type == "cuda":
                times = timing.gpu_times(fn, bench.warmup_ms, bench.rep_ms, bench.cuda_graph, bench.quantiles)
            else:
                times = timing.cpu_times(fn, bench.cpu_warmup, bench.cpu_reps, bench.quantiles)
            for key, value in times.items():
                point.add(stage, key, value)
            if stage not in costs:  # parts of a forward have no cost-model entry of their own
                continue
            derived = cost_model.derived(costs[stage], times["median_ms"], ceilings.get("matmul_tflops"),
                                         ceilings.get("copy_gbps"))
            for key, value in derived.items():
                point.add(stage, key, value)
    if bench.api_overhead:
        for stage, metric, value in api_overhead.measure(backend, inputs, device, bench):
            point.add(stage, metric, value)
    describe = backend.describe()
    point.base["describe"] = json.dumps(describe, sort_keys=True, default=str)
    point.base["tuning"] = tuning_sources(describe)
    for row in point.rows:  # describe() is known only now: fill it into the rows already made
        row["describe"], row["tuning"], row["reference"] = (point.base["describe"], point.base["tuning"],
                                                            point.base.get("reference"))
        row["gate"] = point.base.get("gate")


def gate_description(report: dict, rule: dict) -> str:
    """The gate column: the worst block per stage (where) and the mamba-ssm rule, applied or skipped and why."""
    blocks = "; ".join(f"{stage} worst block {r['block_err']:.3g} at {r['block_where']}" for stage, r in report.items())
    return f"whole-tensor and block-wise rel_err <= tol ({blocks}); {rule['why']}"


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


def timing_fields(cfg, device) -> dict:
    if not cfg.bench.time:
        return {"timer": "none", "warmup": None, "reps": None, "flush_l2": None}
    if device.type == "cuda":  # flush_l2=false is refused at start-up (do_bench always flushes)
        return {"timer": "do_bench", "warmup": cfg.bench.warmup_ms, "reps": cfg.bench.rep_ms,
                "flush_l2": bool(cfg.bench.flush_l2)}
    return {"timer": "cpu-wall", "warmup": cfg.bench.cpu_warmup, "reps": cfg.bench.cpu_reps, "flush_l2": False}


def write_marker(hc, payload: dict) -> None:
    out = Path(hc.runtime.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "point.json").write_text(json.dumps(payload, default=str))


def run_point(cfg: DictConfig) -> dict:
    problem, switches = conf.validate(cfg)  # ConfigError: start-up failure, not a result
    device = resolve_device(cfg.device)
    hc = HydraConfig.get()
    sweep_id, job_num = sweep_identity(hc)
    if hc.mode == RunMode.MULTIRUN and job_num % cfg.launch.num_shards != cfg.launch.shard:
        return {"status": "other-shard"}
    semantic = conf.semantic_config(cfg, switches, provenance.device_name(device))
    chash = conf.config_hash(semantic)
    results_dir = Path(cfg.results_dir)
    results_dir = results_dir if results_dir.is_absolute() else original_cwd() / results_dir
    base = base_row(cfg, problem, semantic, chash, device, hc, sweep_id, job_num, provenance.collect(device))
    if not cfg.force and store.already_measured(results_dir, chash, base["code_key"], cfg.retry_failed):
        print(f"[bench] skip {conf.backend_name(cfg)} {cfg.shape.name}: config {chash} already stored by this "
              f"code ({base['code_key']}) (force=true re-runs it)")
        write_marker(hc, {"config_hash": chash, "status": "skipped", "results_dir": str(results_dir)})
        return {"status": "skipped", "config_hash": chash}

    base.update(timing_fields(cfg, device))
    logger = wandb_log.choose(cfg.logger.kind)
    run = None
    if logger == "wandb":
        try:
            run = wandb_log.start(project=cfg.logger.project, entity=cfg.logger.entity, group=sweep_id,
                                  job_type=conf.backend_name(cfg), name=f"{conf.backend_name(cfg)}-{chash}",
                                  config=secrets.redact(OmegaConf.to_container(cfg, resolve=True,
                                                                               enum_to_str=True)),
                                  directory=wandb_log.wandb_dir(cfg.logger.dir, original_cwd()),
                                  mode=cfg.logger.mode)
        except Exception as exc:  # noqa: BLE001 - W&B trouble must not lose the measurement
            print(secrets.redact(f"[bench] W&B unavailable ({type(exc).__name__}: {exc}); logging locally"))
            logger = "local"
    base["logger"] = logger
    base["wandb_run"] = run.path if run is not None else None
    point = Point(base)
    status, error = "ok", None
    try:
        measure(cfg, point, problem, switches, device)
    except Exception as exc:  # noqa: BLE001 - a failed point is a result; the sweep goes on
        status, error = "failed", secrets.redact(f"{type(exc).__name__}: {exc}")
        if context_lost(exc) and not _CUDA_CONTEXT_LOST:
            _CUDA_CONTEXT_LOST.append(f"{conf.backend_name(cfg)} {cfg.shape.name}: {type(exc).__name__}")
        print(f"[bench] FAILED {conf.backend_name(cfg)} {cfg.shape.name}: {error}")
        if os.environ.get("SSD_BENCH_TRACEBACK"):
            print(secrets.redact(traceback.format_exc()))
    rows = point.finalize(status, error)
    df = store.frame(rows)
    path = store.write_atomic(df, results_dir / cfg.sweep_name / f"{chash}_{base['run_id'][:12]}.parquet")
    if run is not None:
        wandb_log.finish(run, df, wandb_log.summary_metrics(df))
    write_marker(hc, {"config_hash": chash, "status": status, "file": str(path), "results_dir": str(results_dir)})
    return {"status": status, "config_hash": chash, "file": str(path)}


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
