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
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from harness import config as conf  # noqa: E402
from harness import gate, measure_time, plan, provenance, record, secrets  # noqa: E402
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


def fallback_lines(card: str, backend: str, describe: dict, records: str) -> list[str]:
    """One line per tuned stage that ran on its backend's fallback config because no usable record exists (the mode
    auto's choice, not a fallback asked for with tuning=fallback): the card, the backend, the stage, why, what ran,
    and how to search first. `records`: the GPU name the backend's records are filed under."""
    from impls import tuning

    stages = describe.get("stages") if isinstance(describe.get("stages"), dict) else describe.get("tuning_sources")
    lines = []
    for stage, info in (stages or {}).items():
        if not isinstance(info, dict) or info.get("source") != "fallback" or info.get("reason") == "tuning=fallback":
            continue
        config = json.dumps(info.get("config", {}), sort_keys=True)
        why = info.get("reason") or "no record"
        lines.append(f"[bench] {card}: no usable tuning record for {backend} {stage} ({why}; "
                     f"{tuning.record_path(backend, stage, records)}): ran its fallback config {config}. Search "
                     f"first: python -m experiments.bench -m experiment=autotune backend={backend} shape=<shape>")
    return lines


def announce_fallbacks(built: plan.Plan) -> None:
    """On a GPU, says which stages fall back for want of a record (on the CPU the interpreter always runs the
    fallback: nothing to say)."""
    device = built.point.device
    if device.type != "cuda":
        return
    card = provenance.device_name(device)
    for line in fallback_lines(card, built.point.backend, built.backend.describe(),
                               built.backend.tuning_device(device) or card):
        print(line)


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
        announce_fallbacks(built)
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


SHAPE_FIELDS = ("batch", "seqlen", "nheads", "headdim", "ngroups", "dstate", "chunk_size")


def shape_name(name: str, shape, overrides) -> str:
    """The name a point's rows carry: the shape's own, followed by the dimensions the command line or the sweep
    changed (`shape.seqlen=64` on `tiny`: `tiny[seqlen=64]`), so that two shapes of one sweep never share a name
    (nor one table cell). A name given with them (`shape.name=...`) is kept as given."""
    changed = {text.lstrip("+").partition("=")[0].removeprefix("shape.") for text in overrides
               if text.lstrip("+").startswith("shape.")}
    fields = [f for f in SHAPE_FIELDS if f in changed]
    if "name" in changed or not fields:
        return name
    return f"{name}[{','.join(f'{f}={shape[f]}' for f in fields)}]"


def name_the_shape(cfg: DictConfig, overrides) -> None:
    """Renames cfg.shape as `shape_name` says, after resolving the config under the shape's own name (the tiles of
    conf/lvt read conf/shape/<name>.yaml)."""
    named = shape_name(cfg.shape.name, cfg.shape, overrides)
    if named != cfg.shape.name:
        OmegaConf.resolve(cfg)
        cfg.shape.name = named


def run_point(cfg: DictConfig) -> dict:
    """The Hydra job: the Point of the config (start-up checks raise ConfigError), the skip rule, the steps, the
    rows stored and logged."""
    conf.validate(cfg)  # ConfigError: a start-up failure, not a result
    plan.resolve_device(cfg.device)
    hc = HydraConfig.get()
    name_the_shape(cfg, hc.overrides.task)
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


SWITCH_PREFIX = "backend.switches."


def plus_hint(overrides: list[str]) -> str | None:
    """What to write instead of a switch override without its `+` (a backend's switches start empty, so Hydra
    refuses `backend.switches.tma=false` as a key not in the config), or None when every switch override has it."""
    bare = [text for text in overrides if text.startswith(SWITCH_PREFIX)]
    if not bare:
        return None
    fixed = " ".join(f"+{text}" for text in bare)
    backends = [text.partition("=")[2] for text in overrides if text.startswith("backend=")]
    backend = backends[0] if backends and "," not in backends[0] else "<backend>"
    return (f"Hint: a switch the config does not set is added with a leading '+': {fixed} (the backend's "
            f"switches: python -m impls switches {backend})")


def main() -> None:
    sys.argv = default_sweep_args(sys.argv)
    try:
        hydra_entry()
    except SystemExit as exc:
        # Hydra reports a key not in the config and exits 1 before any config is set: add the `+` hint there
        hint = plus_hint(sys.argv[1:]) if exc.code not in (0, None) and not HydraConfig.initialized() else None
        if hint:
            print(hint, file=sys.stderr)
        raise


if __name__ == "__main__":
    main()
