"""Results on disk: long-format rows, one per (point, stage, metric), in Parquet; the schema is COLUMNS below
and experiments/README.md explains it.

Each job writes its own file, atomically (a temporary file in the same directory, then os.replace), so a
crashed or concurrent job never leaves a half-written file and never clobbers another's.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from impls.declaration import version_columns

SCHEMA_VERSION = 9
# Columns added after version 1, with the version that added them: files written before read them as null.
# Version 4 leaves `tf32` null (it was a config flag, not what ran): `precision` says what each stage ran.
ADDED_IN = {"slurm_job_id": 2, "inputs_drawn_on": 3, "v_vllm": 4, "precision": 4, "code_key": 4, "note": 4, "gate": 4,
            "run_group": 5, "round": 5, "workload": 5, "direction": 5, "tile_protocol": 5,
            "d_model": 6, "expand": 6, "d_conv": 6, "n_layer": 7, "vocab_size": 7, "glue": 7,
            "compile": 8, "autocast": 9}

# The v_<key> columns: those of schema version 4 (every committed file has them, so they stay) and then any other
# package a backend declares (impls/<name>/__init__.py PACKAGES, impls/declaration.py), read as null from files
# written before it was declared.
SCHEMA_4_VERSIONS = {"torch": "torch", "triton": "triton", "cuda_tile": "cuda-tile",
                     "tileiras": "nvidia-cuda-tileiras", "mamba_ssm": "mamba-ssm", "wandb": "wandb",
                     "hydra": "hydra-core", "fla": "fla-core", "tilegym": "tilegym", "vllm": "vllm"}
VERSION_COLUMNS = {**SCHEMA_4_VERSIONS, **version_columns(SCHEMA_4_VERSIONS)}
LATER_VERSIONS = [f"v_{key}" for key in VERSION_COLUMNS if key not in SCHEMA_4_VERSIONS]
VERSION_NOTES = {"vllm": "vLLM's version as the METADATA beside its SSD kernel files says (impls/vllm/loader.py)",
                 "tileiras": "the tileiras wheel's version, else the `tileiras --version` on PATH"}

# name -> (pandas dtype, meaning). Every row has every column; missing values are null.
COLUMNS: dict[str, tuple[str, str]] = {
    "schema_version": ("Int64", "version of this schema"),
    "run_id": ("string", "one id per job (point) execution"),
    "sweep_id": ("string", "one id per multirun (or single run); the W&B group"),
    "run_group": ("string", "one id per run: a scripts/rounds.sh, before_after.sh or gpu_session.sh invocation "
                            "(SSD_RUN_GROUP), else the sweep_id; a table reads one (analysis.load.one_run)"),
    "round": ("Int64", "the 1-based round of scripts/rounds.sh (SSD_ROUND; before_after.sh: the side's round), 1 for "
                       "a single run"),
    "sweep_name": ("string", "experiment overlay name (sweep_name in the config)"),
    "job_num": ("Int64", "Hydra job number within the sweep"),
    "timestamp": ("string", "UTC ISO time the point started"),
    "config_hash": ("string", "hash of the semantic config + device (harness.plan.semantic)"),
    "code_key": ("string", "what code measured the point, from content (not git): hashes of the source tree, the "
                           "v_* versions, the backend's tuning records for the GPU and its peer files, and the "
                           "driver's major (harness.provenance.code_key); a stored point is skipped only when "
                           "config_hash and code_key both match"),
    "status": ("string", "ok | failed (correctness gate, unavailable backend, exception)"),
    "workload": ("string", "what was measured (harness/workloads/): ssd (the SSD of impls/; null before version "
                           "5: ssd) | mamba2_layer (the Mamba-2 block of models/mamba2.py, its SSD on the backend) | "
                           "mamba2_lm (the language model of models/mamba2_lm.py)"),
    "direction": ("string", "forward | backward | forward_backward | train_step (null before version 5: forward): "
                            "train_step is a forward, backward and AdamW step (workload mamba2_lm); the backward "
                            "is torch.autograd.grad of impls.ssd after a forward under autograd, timed alone"),
    "error": ("string", "why the point failed (null when ok)"),
    "stage": ("string", "the workload's stages (ssd: chunk_cumsum | fwd_pass_state | compute_out; mamba2_layer: "
                        "in_proj_conv | ssd | norm_out_proj) | forward | backward | forward_backward | train_step | "
                        "grad:d<input> (the gradient gate's, per gradient) | ceiling | point"),
    "metric": ("string", "see README: median_ms, p20_ms, p80_ms, graph_median_ms, compile_s, rel_err, "
                         "block_err, bound_ratio, mamba_ssm_rel_err, mamba_ssm_rule, tol, "
                         "flops, bytes, bytes_fused, tflops, gbps, frac_floor, frac_floor_fused, (the backward's, "
                         "states recomputed:) flops_recompute, bytes_recompute, bytes_fused_recompute, "
                         "frac_floor_recompute, frac_floor_fused_recompute, matmul_tflops, "
                         "copy_gbps, peak_mem_bytes, deterministic, tokens_per_s, ok"),
    "value": ("float64", "the metric's value"),
    "note": ("string", "why the value is missing or what qualifies it (e.g. a CUDA-graph capture's failure)"),
    "unit": ("string", "ms, s, 1, flop, byte, TFLOP/s, GB/s, token/s"),
    "backend": ("string", "backend name"),
    "switches": ("string", "JSON: the backend's full resolved switches"),
    "ablation": ("string", "ablation applied on top of the switches"),
    "describe": ("string", "JSON: backend.describe() after the run (what actually ran)"),
    "tuning": ("string", "tuning source the backend reports (search/record/fallback), or 'none'"),
    "tile_protocol": ("string", "where the stage's tiles came from against the baseline switch set's "
                                "(impls/tuning.py TILE_PROTOCOLS): retuned | retuned-narrower | same-sass | pinned | "
                                "fallback | switches per tuned stage, several joined by '+' (forward, point); untuned "
                                "| peer-autotune for backends that tune nothing of ours; unknown without describe(); "
                                "n/a at stage ceiling; null in files before version 5"),
    "shape_name": ("string", "shape preset name"),
    "batch": ("Int64", ""), "seqlen": ("Int64", ""), "nheads": ("Int64", ""), "headdim": ("Int64", ""),
    "ngroups": ("Int64", ""), "dstate": ("Int64", ""), "chunk_size": ("Int64", ""),
    "d_model": ("Int64", "the layer's model width, nheads·headdim / expand (workload mamba2_layer; null otherwise and "
                         "before version 6)"),
    "expand": ("Int64", "the layer's d_inner / d_model (workload mamba2_layer's option)"),
    "d_conv": ("Int64", "the layer's causal conv width (workload mamba2_layer's option; mamba2_lm's too)"),
    "n_layer": ("Int64", "the language model's number of blocks (workload mamba2_lm; null otherwise and before "
                         "version 7)"),
    "vocab_size": ("Int64", "the language model's vocabulary before padding (workload mamba2_lm)"),
    "glue": ("string", "how the model's conv and gated norm ran (models/glue.py: torch | triton | compile; workload "
                       "mamba2_lm)"),
    "compile": ("string", "the torch.compile mode the language model's call ran under (workload mamba2_lm option "
                          "compile: default | max-autotune-no-cudagraphs); null: eager, and before version 8"),
    "autocast": ("boolean", "the language model in mixed precision: float32 parameters, its forward under "
                            "torch.autocast in the row's dtype (workload mamba2_lm option autocast); null before "
                            "version 9 and for other workloads"),
    "problem_name": ("string", "problem preset name"),
    "problem": ("string", "JSON: impls.problem.Problem fields"),
    "dtype": ("string", "input dtype"),
    "tf32": ("boolean", "up to version 3: the config's dtype.tf32 flag (not what ran); null from version 4, where "
                        "`precision` holds what each stage ran"),
    "precision": ("string", "the stage's matmul precision as the backend reports it (Backend.precision): tf32, "
                            "the input dtype, or none for a stage without matmuls; the tolerance follows it"),
    "seed": ("Int64", "seed of impls.inputs.make_inputs"),
    "distribution": ("string", "impls.inputs.DISTRIBUTION"),
    "inputs_drawn_on": ("string", "cpu | cuda: the random generator's device (cuda above "
                                  "impls.inputs.DEVICE_DRAW_ELEMENTS elements of x; another stream, same law)"),
    "device": ("string", "cpu or cuda:N"),
    "device_name": ("string", "GPU name or cpu:<arch>"),
    "reference": ("string", "float64 | fp32-chunked | sampled: what the gate compared against"),
    "gate": ("string", "how the gate judged: whole-tensor and block-wise rel_err <= tol, the worst block per stage, "
                       "and the mamba-ssm x2 rule applied or skipped and why (null without the gate)"),
    "timer": ("string", "do_bench | cpu-wall | none"),
    "statistic": ("string", "median"),
    "warmup": ("float64", "do_bench warm-up budget (ms) or CPU warm-up calls"),
    "reps": ("float64", "do_bench repetition budget (ms) or CPU repetitions"),
    "flush_l2": ("boolean", "L2 flushed before each repetition"),
    "cost_model": ("string", "harness.cost_model.MODEL_VERSION; on backward and forward_backward points "
                             "'<MODEL_VERSION>+<BACKWARD_MODEL_VERSION>' (from ssd-bwd-cost-v1)"),
    "logger": ("string", "wandb | local: where the point was logged besides Parquet"),
    "wandb_run": ("string", "W&B run path/id (null when local)"),
    "hydra_choices": ("string", "JSON: Hydra's runtime choices (group -> option)"),
    "config": ("string", "YAML: the full resolved config"),
    "python": ("string", ""), "host": ("string", ""),
    "slurm_job_id": ("string", "SLURM_JOB_ID of the job that measured the point (null outside SLURM)"),
    "cuda": ("string", "torch.version.cuda or 'absent'"),
    **{f"v_{key}": ("string", VERSION_NOTES.get(key, f"{dist} version ('absent' when not installed)"))
       for key, dist in VERSION_COLUMNS.items()},
    "gpu_name": ("string", ""), "gpu_uuid": ("string", ""), "gpu_cc": ("string", "compute capability"),
    "gpu_clock_sm_mhz": ("float64", "SM clock when the point ran"), "gpu_clock_mem_mhz": ("float64", ""),
    "gpu_clock_max_sm_mhz": ("float64", ""), "gpu_clock_max_mem_mhz": ("float64", ""),
    "driver": ("string", "NVIDIA driver version"),
    "git_commit": ("string", "a label, not part of code_key"),
    "git_dirty": ("boolean", "tracked files modified, or untracked source files present"),
}


def conform(df: pd.DataFrame) -> pd.DataFrame:
    """A frame read from any schema version, with exactly COLUMNS: columns added since (ADDED_IN, and the v_*
    columns of packages declared since: LATER_VERSIONS) are null where an older file lacks them; any other missing
    column is an error."""
    missing = [c for c in COLUMNS if c not in df.columns and c not in ADDED_IN and c not in LATER_VERSIONS]
    if missing:
        raise ValueError(f"results lack schema columns {missing}; expected harness.store.COLUMNS "
                         f"(schema version {SCHEMA_VERSION})")
    df = df.reindex(columns=list(COLUMNS))
    for name in (*ADDED_IN, *LATER_VERSIONS):
        df[name] = df[name].astype(COLUMNS[name][0])
    return df


def frame(rows: list[dict]) -> pd.DataFrame:
    """Rows -> a DataFrame with exactly COLUMNS, typed."""
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    for name, (dtype, _) in COLUMNS.items():
        df[name] = df[name].astype(dtype)
    return df


def write_atomic(df: pd.DataFrame, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        df.to_parquet(tmp, index=False)
        with open(tmp, "rb") as fh:  # on disk before it gets its name: a crash leaves the old file or the new one
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:  # a write that raised (a value Parquet cannot hold, a full disk) leaves no partial file
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_rows(rows: list[dict], results_dir: Path, name: str) -> Path:
    return write_atomic(frame(rows), Path(results_dir) / f"{name}.parquet")


# Parquet files of another table that may sit beside results (instruments/profile.py's Nsight Compute rows,
# experiments/train_curves.py's loss curves, instruments/step_profile.py's SSD shares of a step):
# never read as result rows
OTHER_TABLES = (".ncu.parquet", ".curves.parquet", ".step_profile.parquet")


def parquet_files(root: Path) -> list[Path]:
    root = Path(root)
    if root.is_file():
        return [root]
    return sorted(p for p in root.rglob("*.parquet")
                  if not p.name.startswith(".") and not p.name.endswith(OTHER_TABLES))


def load(root: Path) -> pd.DataFrame:
    files = parquet_files(root)
    if not files:
        return frame([])
    return pd.concat([conform(pd.read_parquet(f)) for f in files], ignore_index=True)


def _stored_keys(root: Path):
    """(file, (config_hash, code_key, status)) of every point stored under root; files from before code_key have
    none (so they never match a new run's code)."""
    for f in parquet_files(root):
        if "code_key" not in pq.read_schema(f).names:
            continue
        keys = pd.read_parquet(f, columns=["config_hash", "code_key", "status"]).dropna().drop_duplicates()
        for key in keys.itertuples(index=False):
            yield f, tuple(key)


def stored_points(root: Path) -> set[tuple[str, str, str]]:
    """(config_hash, code_key, status) of every point stored under root."""
    return {key for _, key in _stored_keys(root)}


def already_measured(root: Path, config_hash: str, code_key: str, retry_failed: bool = True) -> bool:
    """Whether a point with this config hash was stored by this code (code_key); a failed one counts only when
    retry_failed is off."""
    return measured_file(root, config_hash, code_key, retry_failed) is not None


def measured_file(root: Path, config_hash: str, code_key: str, retry_failed: bool = True) -> Path | None:
    """The file under root that holds this point as stored by this code (the newest such file; an ok one first, a
    failed one only when retry_failed is off), or None: where a skipped point's rows are."""
    found: dict[str, list[Path]] = {}
    for f, (h, k, status) in _stored_keys(root):
        if h == config_hash and k == code_key:
            found.setdefault(status, []).append(f)
    usable = found.get("ok") or ([f for files in found.values() for f in files] if not retry_failed else [])
    return max(usable, key=lambda f: f.stat().st_mtime) if usable else None
