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

# The declared search spaces (cartesian products; duplicates after clamping are tried once).
SEARCH_SPACE: dict[str, dict[str, tuple[int, ...]]] = {
    "chunk_cumsum": {"block_heads": (1, 2, 4, 8, 16), "num_warps": (1, 2, 4, 8)},
    "chunk_state": {"block_headdim": (32, 64, 128), "block_dstate": (32, 64, 128), "block_positions": (32, 64),
                    "num_warps": (4, 8), "num_stages": (1, 2, 3), "occupancy": (0, 3, 4)},
    "state_passing": {"block_state": (256, 512, 1024, 2048), "num_warps": (1, 2, 4, 8)},
    "compute_out": {"block_rows": (32, 64, 128), "block_positions": (32, 64), "block_headdim": (32, 64, 128),
                    "num_warps": (4, 8), "num_stages": (1, 2, 3), "occupancy": (0, 3, 4), "heads_per_tile": (1, 2)},
    FUSED: {"block_rows": (32, 64), "block_positions": (32, 64), "block_headdim": (32, 64),
            "num_warps": (4, 8), "num_stages": (1, 2, 3), "occupancy": (0, 3, 4)},
}

# Configurations per stage before pinning and clamping (the product of SEARCH_SPACE's value counts; a test checks
# it). cuTile's SPACE (impls/cutile/tune.py), for comparison: chunk_cumsum 6, fwd_pass_state 6, compute_out 24,
# fused 2 (before search_space drops what a problem cannot take).
SPACE_SIZE: dict[str, int] = {"chunk_cumsum": 20, "chunk_state": 324, "state_passing": 16, "compute_out": 648,
                              FUSED: 144}

# Code switches a search may vary besides the launch fields, per kernel they change (values to try, the default
# first). Each value is a different kernel (and tuning key), so a search over them times each value's best launch
# configuration; fuse_state_out replaces chunk_state + state_passing + compute_out by the FUSED kernel.
SWITCH_SEARCH_SPACE: dict[str, dict[str, tuple]] = {
    "chunk_state": {"tma": (False, True), "operand_swap": (True, False)},
    "compute_out": {"tma": (False, True), "operand_swap": (True, False), "decay_factor": (False, True),
                    "cb_mode": ("inline", "shared")},
    FUSED: {"tma": (False, True), "operand_swap": (True, False)},
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
