"""`python -m instruments.lowering <rows file> [...]`: writes the lowering file beside each results file
(`<name>.lowering.json`, read by analysis/lowering.py): every cuTile and Triton point of the headline problem on an
sm_90 card, its MMA stages (fwd_pass_state, compute_out) compiled for sm_90 on the CPU at the configs its rows'
describe() recorded, and each kernel's registers and stack (cuobjdump -res-usage), local loads/stores (LDL/STL in the
SASS) and warp specialisation (USETMAXREG in the SASS). Compile-only: nothing runs on a GPU; seconds per kernel.
Entries already in the file are kept unless compiled again.

    python -m instruments.lowering results/<run>/language_vs_trick_cutile.parquet [--backends cutile] [--shapes S1]

A file: {"generated_by", "points": [{"backend", "shape", "dtype", "arch", "switches", "stage", "configs", "kernels":
[{"kernel", "registers", "stack_bytes", "ldl", "stl", "warp_specialized"}]}]}: one entry per point (its resolved
switches) and stage, at the configs its row's describe() recorded for the stage (`stage_configs`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from harness import store

SUFFIX = ".lowering.json"
# the entries of a row's describe() that hold a stage's configs (our Triton tunes stage 2 as two kernels)
DESCRIBE_STAGES = {"fwd_pass_state": ("fwd_pass_state", "chunk_state", "state_passing")}


@dataclass(frozen=True)
class KernelLowering:
    """One kernel's lowering, read from its sm_90 cubin."""

    kernel: str
    registers: int  # per thread
    stack_bytes: int  # per thread
    ldl: int  # local-memory loads in the SASS (static count: the spill traffic with stl)
    stl: int
    warp_specialized: bool  # USETMAXREG in the SASS: warpgroups that hand registers to one another


def path_for(results_file: str | Path) -> Path:
    """The lowering file of a results file: results/<run>/<name>.parquet -> results/<run>/<name>.lowering.json."""
    path = Path(results_file)
    return path.with_name(path.name.removesuffix(".parquet") + SUFFIX)


def entry_key(backend: str, shape: str, dtype: str, arch: str, switches: dict, stage: str, configs) -> str:
    return json.dumps({"backend": backend, "shape": shape, "dtype": dtype, "arch": arch, "switches": switches,
                       "stage": stage, "configs": list(configs)}, sort_keys=True, default=str)


def stage_configs(describe, stage: str) -> tuple:
    """The configs a row's describe() (JSON) records for `stage`: one per entry of DESCRIBE_STAGES (None where
    absent); () when describe() records no stages."""
    try:
        info = json.loads(describe) if isinstance(describe, str) else {}
    except ValueError:
        return ()
    stages = (info.get("stages") or {}) if isinstance(info, dict) else {}
    if not isinstance(stages, dict):
        return ()
    entries = [stages.get(name) for name in DESCRIBE_STAGES.get(stage, (stage,))]
    return tuple(e.get("config") if isinstance(e, dict) else None for e in entries)


ARCH, GPU_CC = "sm_90", "9.0"  # the architecture compiled for, and the rows' gpu_cc that ran on it
STAGES = ("fwd_pass_state", "compute_out")  # the MMA stages, whose lowering a tile or a switch changes
BACKENDS = ("cutile", "triton")
PROBLEM = "headline"  # D per head, no z, no initial states, no sequence index: what the compiled calls take
DIMS = ("batch", "seqlen", "nheads", "headdim", "ngroups", "dstate", "chunk_size")
# the Triton kernel names of instruments/triton/spills.py -> the row stage they belong to
TRITON_STAGE = {"chunk_state_kernel": "fwd_pass_state", "serial_state_kernel": "fwd_pass_state",
                "state_passing_kernel": "fwd_pass_state"}


def points(long: pd.DataFrame, backends=BACKENDS, shapes=None) -> pd.DataFrame:
    """One row per (point, MMA stage) to compile (its median_ms row): ok, on an sm_90 card, the headline problem."""
    sel = long["backend"].isin(backends) & long["stage"].isin(STAGES) & (long["metric"] == "median_ms")
    sel &= (long["status"] == "ok") & (long["gpu_cc"] == GPU_CC) & (long["problem_name"] == PROBLEM)
    if shapes:
        sel &= long["shape_name"].isin(shapes)
    return long[sel].drop_duplicates(["run_id", "stage"])


def facts(name: str, cubin: bytes) -> KernelLowering:
    """One kernel's lowering from its cubin."""
    from instruments.sass import cubin_facts

    got = cubin_facts(cubin)
    return KernelLowering(name, got.registers, got.stack_bytes, got.ldl, got.stl, got.warp_specialized)


def cutile_kernels(row, stage: str) -> tuple[KernelLowering, ...]:
    """cuTile's kernels of `stage` at the row's switches, sizes and recorded config (instruments/cutile/aot.py)."""
    from impls.cutile.switches import CutileSwitches
    from instruments.cutile import aot
    from instruments.cutile.spills import HEADLINE_D_MODE, kernels_of

    sw = CutileSwitches(**json.loads(row["switches"]))
    config = stage_configs(row["describe"], stage)[0]  # cuTile's stage is one tuned kernel
    dims = dict(zip(("batch", "seqlen", "nheads", "headdim", "ngroups", "dstate", "chunk"),
                    (int(row[c]) for c in DIMS)))
    out = []
    for kernel in kernels_of(stage, config, sw.state_pass, sw.fused_program):
        call = aot.build_call(kernel, getattr(torch, row["dtype"]), sw, dims=dims, config=config, optional=False,
                              d_mode=HEADLINE_D_MODE)
        out.append(facts(kernel, aot.export(call, ARCH)))
    return tuple(out)


def triton_kernels(row) -> dict[str, tuple[KernelLowering, ...]]:
    """Our Triton's MMA stages at the row's switches and sizes, each kernel compiled at the config the row recorded
    for it (instruments/intercept.py `compile_only`: Triton's driver answers sm_90): {stage: kernels}."""
    from impls.triton.backend import TritonBackend
    from impls.triton.switches import TritonSwitches
    from instruments.intercept import compile_only

    recorded = {k: v["config"] for k, v in json.loads(row["describe"])["stages"].items()}
    out: dict[str, list] = {}
    with compile_only() as compiled:
        backend = TritonBackend(TritonSwitches(**json.loads(row["switches"])))
        backend._config = lambda stage, *args: dict(recorded[stage])  # what the row ran, not a resolution here
        _mma_stages(backend, *(int(row[c]) for c in DIMS), getattr(torch, row["dtype"]))
        for name, kernel in compiled:
            out.setdefault(TRITON_STAGE.get(name, "compute_out"), []).append(facts(name, kernel.asm["cubin"]))
    return {stage: tuple(kernels) for stage, kernels in out.items()}


def _mma_stages(backend, b: int, seqlen: int, h: int, p: int, g: int, n: int, chunk: int, dtype: torch.dtype) -> None:
    """fwd_pass_state then compute_out as the harness times them (with fuse_state_out too: each stage on its own),
    on empty CPU tensors of the headline problem's arguments (D per head, no z, initial states or sequence index)."""
    nchunks = -(-seqlen // chunk)
    x, B = torch.empty(b, seqlen, h, p, dtype=dtype), torch.empty(b, seqlen, g, n, dtype=dtype)
    dt = torch.empty(b, h, nchunks, chunk)
    states = backend.fwd_pass_state(B, x, dt, dt, None, None, None)[0]
    backend.compute_out(B, B, x, dt, dt, states, torch.empty(h), None, None)


def entry(row, stage: str, kernels: tuple[KernelLowering, ...]) -> dict:
    return {"backend": row["backend"], "shape": row["shape_name"], "dtype": row["dtype"], "arch": ARCH,
            "switches": json.loads(row["switches"]), "stage": stage,
            "configs": list(stage_configs(row["describe"], stage)), "kernels": [vars(k) for k in kernels]}


def lower(long: pd.DataFrame, backends=BACKENDS, shapes=None, log: Callable[[str], None] = print) -> list[dict]:
    """The entries of every point of `long` (store rows) to compile, each (point, stage) once; a point that does not
    compile is logged and left out (its cells read "lowering not inspected")."""
    done: dict[str, dict] = {}
    triton: dict[str, dict] = {}  # run_id -> its stages' kernels: one compile of a point's forward for both stages
    for _, row in points(long, backends, shapes).iterrows():
        key = entry_key(row["backend"], row["shape_name"], row["dtype"], ARCH, json.loads(row["switches"]),
                        row["stage"], stage_configs(row["describe"], row["stage"]))
        if key in done:
            continue
        try:
            if row["backend"] == "cutile":
                done[key] = entry(row, row["stage"], cutile_kernels(row, row["stage"]))
            else:
                if row["run_id"] not in triton:
                    triton[row["run_id"]] = triton_kernels(row)
                done[key] = entry(row, row["stage"], triton[row["run_id"]][row["stage"]])
        except Exception as exc:  # noqa: BLE001 - one point that does not compile leaves its cells not inspected
            log(f"[lowering] {row['backend']} {row['shape_name']} {row['ablation']} {row['stage']}: "
                f"{type(exc).__name__}: {str(exc)[:200]}")
            continue
        log(f"[lowering] {row['backend']} {row['shape_name']} {row['ablation']} {row['stage']}: "
            + ", ".join(f"{k['kernel']} {k['registers']} regs" for k in done[key]["kernels"]))
    return list(done.values())


def write(results_file: Path, entries: list[dict]) -> Path:
    """The lowering file beside `results_file`: its entries so far, those of `entries` replacing equal keys."""
    path = path_for(results_file)
    old = json.loads(path.read_text())["points"] if path.is_file() else []
    merged = {entry_key(**{k: e[k] for k in ("backend", "shape", "dtype", "arch", "switches", "stage", "configs")}): e
              for e in (*old, *entries)}
    path.write_text(json.dumps({"generated_by": "python -m instruments.lowering", "points": list(merged.values())},
                               indent=1, sort_keys=True) + "\n")
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m instruments.lowering", description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", type=Path, help="results Parquet files")
    p.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    p.add_argument("--shapes", nargs="+", default=None, help="shape presets (default: every one in the rows)")
    a = p.parse_args(argv)
    for results_file in a.files:
        if not results_file.is_file():
            raise FileNotFoundError(f"results file {results_file} not found")
        print(f"[lowering] {write(results_file, lower(store.load(results_file), a.backends, a.shapes))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
