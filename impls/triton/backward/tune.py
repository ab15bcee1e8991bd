"""The launch configurations of the backward's kernels, through the one tuning protocol (impls/tuning.py): per
kernel its launch fields, a small search space for the GPU, a fixed fallback per architecture (the interpreter's
16-wide tiles walk several tiles and inner steps at tiny shapes), and the record key (shape, dtype, the switches
that change the kernels' code, the call's flags)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from impls import tuning
from impls.chunked_backward import written_elements
from impls.problem import Shape
from impls.triton import target
from impls.triton.clamp import pow2_at_least_16, triton_next_pow2
from impls.triton.tune import STACK, Resolved

STATE_PASS, CHUNK, DCB, DB, CUMSUM = "bwd_state_pass", "bwd_chunk", "bwd_dcb", "bwd_db", "bwd_cumsum"
STAGES = (STATE_PASS, CHUNK, DCB, DB, CUMSUM)

# The GPU's search space per kernel (cartesian products; duplicates after clamping are tried once); each field's
# first value is the GPU fallback. The fallbacks are what compiles for sm_90 at S1's blocks in bf16 (chunk 256,
# headdim 64, dstate 128) with the fewest spills, read off ptxas without a GPU: at 4 warps every MMA kernel took 255
# registers and spilled (hundreds of local loads and stores each); at 8 warps, with 32-row tiles in the chunk kernel
# and 32-wide dstate tiles in the state pass, 0-22 local loads per kernel. Untimed: the GPU search decides. After two S1
# searches on an H100 the chunk kernel's space lost its 32-source tiles (1.3-1.6x slower than 64 at every other
# field) and took 128-source tiles (half the programs; 20 local loads at 128 × 32 with 8 warps) and its row loop
# staged 3 deep (the dcb kernel's head loop gained most at 3).
SEARCH_SPACE: dict[str, dict[str, tuple[int, ...]]] = {
    STATE_PASS: {"block_headdim": (64, 32), "block_dstate": (32, 64), "block_positions": (64, 32),
                 "num_warps": (8, 4), "num_stages": (2, 3)},
    CHUNK: {"block_sources": (64, 128), "block_rows": (32, 64), "num_warps": (8, 4), "num_stages": (1, 2, 3)},
    DCB: {"block_rows": (64, 32, 16), "block_sources": (64, 32), "num_warps": (8, 4), "num_stages": (1, 2, 3)},
    DB: {"block_sources": (64, 32), "block_rows": (64, 32), "num_warps": (8, 4), "num_stages": (1, 2)},
    CUMSUM: {"block_heads": (8, 4, 16), "num_warps": (4, 2)},
}
_GPU_FALLBACK = {STAGE: {k: v[0] for k, v in space.items()} for STAGE, space in SEARCH_SPACE.items()}
FALLBACK: dict[str, dict[str, dict[str, int]]] = {
    "sm90": _GPU_FALLBACK,
    "sm100": _GPU_FALLBACK,
    "other": _GPU_FALLBACK,
    "interpreter": {
        STATE_PASS: {"block_headdim": 16, "block_dstate": 16, "block_positions": 16, "num_warps": 1, "num_stages": 1},
        CHUNK: {"block_sources": 16, "block_rows": 16, "num_warps": 1, "num_stages": 1},
        DCB: {"block_rows": 16, "block_sources": 16, "num_warps": 1, "num_stages": 1},
        DB: {"block_sources": 16, "block_rows": 16, "num_warps": 1, "num_stages": 1},
        CUMSUM: {"block_heads": 2, "num_warps": 1},
    },
}
CODE_SWITCHES = ("exp2", "cb_precision")  # the switches that change the backward kernels' code
# switches that change one kernel's code only, in that kernel's key when away from their default (so that records
# found without them keep their keys, and the other kernels keep their records)
GROUP_SWITCHES = ("bwd_group_split", "bwd_atomics")  # the per-group kernels' programs and stores
KERNEL_SWITCHES = {STATE_PASS: ("bwd_state_split", "bwd_entry_term"),
                   CHUNK: ("bwd_cb", "bwd_decay_factor", "bwd_entry_term"),
                   DCB: (*GROUP_SWITCHES, "bwd_dcb_sources", "bwd_entry_term"),
                   DB: GROUP_SWITCHES, CUMSUM: ("bwd_entry_term",)}


def clamp(config: dict[str, int], shape: Shape) -> dict[str, int]:
    """Block sizes no larger than the (power-of-two, >= 16 for dots) extent they tile."""
    limits = {"block_rows": shape.chunk_size, "block_sources": shape.chunk_size,
              "block_positions": shape.chunk_size, "block_headdim": pow2_at_least_16(shape.headdim),
              "block_dstate": pow2_at_least_16(shape.dstate), "block_heads": triton_next_pow2(shape.nheads)}
    return {k: min(v, limits[k]) if k in limits else v for k, v in config.items()}


def space(stage: str, shape: Shape) -> list[dict[str, int]]:
    """The declared space of `stage`, clamped to `shape`, without duplicates."""
    import itertools

    fields = SEARCH_SPACE[stage]
    seen, configs = set(), []
    for values in itertools.product(*fields.values()):
        config = clamp(dict(zip(fields, values)), shape)
        key = tuple(sorted(config.items()))
        if key not in seen:
            seen.add(key)
            configs.append(config)
    return configs


def space_size(stage: str) -> int:
    return math.prod(len(v) for v in SEARCH_SPACE[stage].values())


def record_key(switches, shape: Shape, dtype: str, flags: dict, stage: str) -> str:
    """`stage`'s record key: shape, dtype, CODE_SWITCHES, the stage's own KERNEL_SWITCHES away from their default,
    the call's flags."""
    return tuning.switches_key(shape.label(), dtype, switches, CODE_SWITCHES, KERNEL_SWITCHES.get(stage, ()), flags)


def resolve(backend, stage: str, shape: Shape, dtype: str, flags: dict, device,
            launch: Callable[[dict], Any]) -> dict[str, int]:
    """The configuration `stage` runs with on this call: resolved once per record key on `backend` (its mode:
    switch `tuning`), recorded in `backend.last_tuning` (describe() reports it)."""
    key = record_key(backend.switches, shape, dtype, flags, stage)
    resolved = backend._resolved.get((stage, key))
    if resolved is None:
        arch = target.arch(device)
        interp = arch == "interpreter"
        fallback = clamp(FALLBACK[arch][stage], shape)
        t = tuning.Tunable(
            backend="triton", stage=stage, key=key, gpu=target.device_name(device), mode=backend.switches.tuning,
            fallback=fallback, space={k: list(v) for k, v in SEARCH_SPACE[stage].items()},
            configs=[fallback] if interp else space(stage, shape), run=launch, stack=STACK,
            stage_timer=tuning.wall_ms if interp else None,
            output=lambda cfg: written_elements(stage, launch(cfg), shape.seqlen, padding_read=True))
        resolution = tuning.resolve(t)
        resolved = Resolved(clamp(resolution.config, shape), resolution)
        backend._resolved[(stage, key)] = resolved
    backend.last_tuning[stage] = resolved.as_dict()
    return dict(resolved.config)
