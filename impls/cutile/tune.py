"""Tile sizes and occupancy of the cuTile stages: explicit switches, else a tuning record, else a fixed fallback.

Modes come from impls/tuning.py. "search" uses `cuda.tile.tune.exhaustive_search` (present in cuda-tile 1.7:
`cuda/tile/tune/_tune.py`) over the declared SPACE of each stage, timing the real launch on the given inputs.
"""

from __future__ import annotations

import itertools

import torch

from impls import tuning

# Fixed configs per architecture (compute capability major). 0 = the compiler's choice of occupancy.
FALLBACK = {
    9: {"chunk_cumsum": {"occupancy": 0},
        "fwd_pass_state": {"block_headdim": 64, "block_dstate": 128, "occupancy": 0},
        "compute_out": {"block_rows": 64, "block_headdim": 64, "occupancy": 0}},
    10: {"chunk_cumsum": {"occupancy": 0},
         "fwd_pass_state": {"block_headdim": 64, "block_dstate": 128, "occupancy": 0},
         "compute_out": {"block_rows": 128, "block_headdim": 64, "occupancy": 0}},
}
SPACE = {
    "chunk_cumsum": {"occupancy": [0, 1, 2, 4]},
    "fwd_pass_state": {"block_headdim": [32, 64, 128], "block_dstate": [64, 128], "occupancy": [0, 1, 2]},
    "compute_out": {"block_rows": [64, 128], "block_headdim": [32, 64, 128], "occupancy": [0, 1, 2]},
}
SWITCH_KEYS = {"block_rows", "block_headdim", "block_dstate", "occupancy"}


def fallback(stage: str, device) -> dict:
    major = torch.cuda.get_device_capability(device)[0] if torch.cuda.is_available() else 9
    return dict(FALLBACK.get(major, FALLBACK[9])[stage])


def configs(stage: str) -> list[dict]:
    space = SPACE[stage]
    return [dict(zip(space, values)) for values in itertools.product(*space.values())]


def explicit(stage: str, sw) -> dict:
    """The sizes the switches fix (non-zero), restricted to those the stage uses."""
    return {k: getattr(sw, k) for k in SPACE[stage] if getattr(sw, k)}


def resolve(stage: str, sw, device, key: str, make_call) -> tuple[dict, str]:
    """(config, source). Switch values override; `make_call(config) -> KernelCall` is used by search."""
    fixed = explicit(stage, sw)
    if fixed and set(fixed) >= set(SPACE[stage]):
        return fixed, "switches"
    gpu = torch.cuda.get_device_name(device) if torch.cuda.is_available() else "cpu"

    def search():
        import cuda.tile as ct
        from cuda.tile.tune import exhaustive_search

        space = [dict(cfg, **fixed) for cfg in configs(stage)]
        calls = {i: make_call(cfg) for i, cfg in enumerate(space)}
        result = exhaustive_search(list(range(len(space))), torch.cuda.current_stream(), lambda i: calls[i].grid,
                                   lambda i: calls[i].kernel, lambda i: calls[i].args, quiet=True)
        best = space[result.best.config]
        return best, {"search_space": SPACE[stage], "median_us": result.best.mean_us,
                      "versions": {"cuda.tile": ct.__version__, "torch": torch.__version__}}

    config, source = tuning.resolve(sw.tuning, "cutile", stage, gpu, key, fallback(stage, device), search)
    config.update(fixed)
    return config, source
