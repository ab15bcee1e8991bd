"""The tiles and occupancy of the cuTile backward's kernels, through the one tuning protocol (impls/tuning.py): per
kernel a small search space for the GPU, a fixed fallback per architecture, and the record key (shape, dtype, the
switches that change the kernels' code, the call's flags); the search times each kernel alone with cuTile's own timer
(`impls.cutile.tune.kernel_timer`) and confirms its best as whole launches."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch

from impls import tuning
from impls.chunked_backward import written_elements
from impls.problem import Shape

STATE_PASS, CHUNK, DCB, DB, CUMSUM = "bwd_state_pass", "bwd_chunk", "bwd_dcb", "bwd_db", "bwd_cumsum"
STAGES = (STATE_PASS, CHUNK, DCB, DB, CUMSUM)

# Fixed configs per architecture (compute capability major); occupancy 0 = the compiler's choice, worker_warps 0 its
# one math warpgroup, 8 two sharing every MMA of the tile (`common.kernel_call`). The sm_90 tiles are those that compile
# for sm_90 at S1's sizes in bf16 without local-memory spills, read off the SASS without a GPU
# (`python -m instruments.cutile.aot_backward [--everything]`; tests/backends/test_cutile_backward.py): with one
# warpgroup the chunk kernel's 64 × 64 tiles spilled ~600 local loads and stores (64 × 32: 6 for the headline's inputs,
# ~100 with every optional input) and the dcb kernel's 64-wide tiles ~350 (32-wide: ~170); with two, 64 × 64 chunk tiles
# and 32-wide dcb tiles spill none. The state pass and db spill none with one. Untimed: the GPU search decides. The
# chunk kernel's space, after two S1 searches on an H100: 32-source tiles left it (4-60x slower than 64 in both);
# 128-source tiles (half the programs, each state's gradient and the entering state read once per half chunk) compile
# for sm_90 with two warpgroups at 128 × 32 without spills, at 128 × 64 with 74 / 70; occupancy 3 (one warpgroup
# compiles to 168 registers with 92-206 local loads and stores: occupancy 2 doubled the speed of the compiler's
# choice, a third program per SM may hide more latency than its spills cost).
FALLBACK = {
    9: {STATE_PASS: {"block_headdim": 64, "block_dstate": 64, "occupancy": 0, "worker_warps": 0},
        CHUNK: {"block_sources": 64, "block_rows": 64, "occupancy": 0, "worker_warps": 8},
        DCB: {"block": 32, "occupancy": 0, "worker_warps": 8},
        DB: {"block": 64, "occupancy": 0, "worker_warps": 0},
        CUMSUM: {"block_heads": 8, "occupancy": 0}},
}
FALLBACK[10] = FALLBACK[9]  # sm_100: unmeasured
# fp32 inputs (tf32 MMAs) at the chunk kernel's 64 × 64 tiles with two warpgroups: tileiras fails (exit status 5)
# with every optional input; 32 rows compile (6 local loads and stores)
FP32_FALLBACK = {CHUNK: {"block_rows": 32}}
SPACE: dict[str, dict[str, list]] = {
    STATE_PASS: {"block_headdim": [64, 32], "block_dstate": [64, 32, 128], "occupancy": [0, 2],
                 "worker_warps": [0, 8]},
    CHUNK: {"block_sources": [64, 128], "block_rows": [64, 32], "occupancy": [0, 2, 3], "worker_warps": [8, 0]},
    DCB: {"block": [32, 64, 16], "occupancy": [0, 2], "worker_warps": [8, 0]},
    DB: {"block": [64, 32], "occupancy": [0, 2], "worker_warps": [0, 8]},
    CUMSUM: {"block_heads": [8, 4, 16], "occupancy": [0, 4]},
}
CODE_SWITCHES = ("exp2", "tma", "latency_hints", "cb_precision", "opt_level")  # what the kernels read of the switches
# switches that change one kernel's code only, in that kernel's key when away from their default (so that records
# found without them keep their keys, and the other kernels keep their records)
GROUP_SWITCHES = ("bwd_group_split", "bwd_atomics")  # the per-group kernels' programs and stores
KERNEL_SWITCHES = {STATE_PASS: ("bwd_state_split", "bwd_exp2_ftz", "bwd_entry_term"),
                   CHUNK: ("bwd_cb", "bwd_decay_factor", "bwd_exp2_ftz", "bwd_entry_term"),
                   DCB: (*GROUP_SWITCHES, "bwd_dcb_sources", "bwd_exp2_ftz", "bwd_entry_term"),
                   DB: (*GROUP_SWITCHES, "bwd_exp2_ftz"),
                   CUMSUM: ("bwd_exp2_ftz", "bwd_entry_term")}
STACK = ("cuda-tile", "tileiras", "driver")  # what a cuTile record is bound to


def fallback(stage: str, major: int, dtype: str) -> dict:
    """The fixed config of `stage` on a GPU of compute capability `major` (sm_90's elsewhere) for `dtype` inputs."""
    config = dict(FALLBACK.get(major, FALLBACK[9])[stage])
    if dtype == "float32":
        config.update(FP32_FALLBACK.get(stage, {}))
    return config


def device_major(device) -> int:
    """The compute capability major of `device` (9 without a GPU: the sm_90 fallback, as compiled ahead of time)."""
    return torch.cuda.get_device_capability(device)[0] if torch.cuda.is_available() else 9


def configs(stage: str) -> list[dict]:
    space = SPACE[stage]
    return [dict(zip(space, values)) for values in itertools.product(*space.values())]


def record_key(switches, shape_label: str, dtype: str, flags: dict, stage: str) -> str:
    """`stage`'s record key: shape, dtype, CODE_SWITCHES, the stage's own KERNEL_SWITCHES away from their default,
    the call's flags."""
    return tuning.switches_key(shape_label, dtype, switches, CODE_SWITCHES, KERNEL_SWITCHES.get(stage, ()), flags)


def resolve(backend, stage: str, shape: Shape, dtype: str, flags: dict, device,
            make_call: Callable[[dict], Any], launch: Callable[[dict], Any]) -> dict:
    """The config `stage` runs with on this call: resolved once per record key on `backend` (its mode: switch
    `tuning`), recorded in describe()'s stages. `make_call(config)` builds the kernel's launch (the search's timer),
    `launch(config)` runs it (the confirmation)."""
    from impls.cutile import tune as forward_tune

    key = record_key(backend.switches, shape.label(), dtype, flags, stage)
    resolution = backend._resolved.get((stage, key))
    if resolution is None:
        gpu = torch.cuda.get_device_name(device) if torch.cuda.is_available() else "cpu"
        resolution = tuning.resolve(tuning.Tunable(
            backend="cutile", stage=stage, key=key, gpu=gpu, mode=backend.switches.tuning,
            fallback=fallback(stage, device_major(device), dtype), space=SPACE[stage], configs=configs(stage),
            run=launch, timer=forward_tune.kernel_timer(make_call), stack=STACK,
            output=lambda cfg: written_elements(stage, launch(cfg), shape.seqlen, padding_read=False)))
        backend._resolved[(stage, key)] = resolution
    backend._sources[stage] = resolution.as_dict()
    return dict(resolution.config)
