"""The search space of the Triton backend, as impls/tuning.py searches it: per stage, the launch fields' values
(SEARCH_SPACE, its size per stage SPACE_SIZE) and the code switches a search may vary besides (SWITCH_SEARCH_SPACE).

The cuTile backend declares its own in impls/cutile/tune.py (`SPACE`); its stages differ (fwd_pass_state is
chunk_state and state_passing in one kernel), so compare SPACE_SIZE stage by stage with the comment beside it.
"""

from __future__ import annotations

import itertools
import math

from impls.triton.clamp import clamp
from impls.triton.stages import FUSED

# The declared search spaces (cartesian products; duplicates after clamping are tried once), sized so that a
# Triton search times as many configurations per stage as cuTile's (impls/cutile/tune.py SPACE, with the default
# switches on the headline shapes S1-S4: chunk_cumsum 6, fwd_pass_state 18, compute_out 48, fused 2;
# tests/backends/test_triton_search_space.py checks it). The rule, in order:
#   1. an axis cuTile searches takes cuTile's values where Triton has the same knob (block_heads, block_headdim,
#      block_dstate, block_rows, heads_per_tile, occupancy -- Triton's as the maxnreg register cap);
#   2. the launch knobs only Triton has (num_warps, num_stages, block_positions) stay at the sm_90 fallback's value;
#   3. the slots of a cuTile axis Triton has no knob for go to one Triton-only knob with as many values, the
#      fallback's value first: chunk_cumsum's occupancy (2 values; no register cap on that kernel) -> num_warps
#      (4, 2); compute_out's shared_cb (2; Triton's cb_mode is a code switch with a tuning key of its own) ->
#      num_stages (2, 3);
#   4. fwd_pass_state is one cuTile kernel and two Triton kernels: its 18 are shared, chunk_state 12 (cuTile's
#      headdim and dstate blocks, its occupancy axis (2, 3, 4) trimmed to its ends (2, 4)), state_passing
#      (elementwise) the other 6 (block_state, the fallback's 1024 first).
# Clamping can merge configurations (S4: dstate 64 makes block_dstate 128 the same kernel as 64, so chunk_state
# times 8 there, cuTile 18 of which 6 with a 128-wide dstate block over 64 states).
SEARCH_SPACE: dict[str, dict[str, tuple[int, ...]]] = {
    "chunk_cumsum": {"block_heads": (4, 8, 16), "num_warps": (4, 2)},
    "chunk_state": {"block_headdim": (64, 32), "block_dstate": (128, 64, 32), "block_positions": (64,),
                    "num_warps": (4,), "num_stages": (3,), "occupancy": (2, 4)},
    "state_passing": {"block_state": (1024, 128, 256, 512, 2048, 4096), "num_warps": (4,)},
    "compute_out": {"block_rows": (64, 128), "block_positions": (64,), "block_headdim": (64, 32),
                    "num_warps": (4,), "num_stages": (2, 3), "occupancy": (2, 3, 4), "heads_per_tile": (1, 2)},
    FUSED: {"block_rows": (64,), "block_positions": (64,), "block_headdim": (32, 64),
            "num_warps": (4,), "num_stages": (2,), "occupancy": (2,)},
}
# the cuTile stage each Triton kernel's search counts towards (rule 4)
CUTILE_STAGE = {"chunk_cumsum": "chunk_cumsum", "chunk_state": "fwd_pass_state", "state_passing": "fwd_pass_state",
                "compute_out": "compute_out", FUSED: "fused"}

# Configurations per stage before pinning and clamping (the product of SEARCH_SPACE's value counts; a test checks
# it; tests/backends/test_triton_search_space.py checks the sums per cuTile stage against cuTile's search).
SPACE_SIZE: dict[str, int] = {"chunk_cumsum": 6, "chunk_state": 12, "state_passing": 6, "compute_out": 48, FUSED: 2}

# Code switches a search may vary besides the launch fields, per kernel they change (values to try, the default
# first). Each value is a different kernel (and tuning key), so a search over them times each value's best launch
# configuration; fuse_state_out replaces chunk_state + state_passing + compute_out by the FUSED kernel.
SWITCH_SEARCH_SPACE: dict[str, dict[str, tuple]] = {
    "chunk_state": {"tma": (False, True), "operand_swap": (True, False)},
    "compute_out": {"tma": (False, True), "operand_swap": (True, False), "decay_factor": (False, True),
                    "cb_mode": ("inline", "shared")},
    FUSED: {"tma": (False, True), "operand_swap": (True, False), "fused_program": ("row_tile", "chunk"),
            "cb_mode": ("inline", "shared")},
    "forward": {"fuse_state_out": (False, True)},
}


def search_space(stage: str, fixed: dict[str, int], dims: dict[str, int]) -> list[dict[str, int]]:
    """Every configuration of the declared space with the pinned fields fixed, clamped, without duplicates."""
    space = {k: ((fixed[k],) if k in fixed else v) for k, v in SEARCH_SPACE[stage].items()}
    seen, configs = set(), []
    for values in itertools.product(*space.values()):
        config = clamp(stage, dict(zip(space, values)), dims)
        key = tuple(sorted(config.items()))
        if key not in seen:
            seen.add(key)
            configs.append(config)
    return configs


def space_size(stage: str) -> int:
    """How many configurations SEARCH_SPACE declares for `stage` (before pinning and clamping)."""
    return math.prod(len(values) for values in SEARCH_SPACE[stage].values())
