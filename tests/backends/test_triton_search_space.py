"""The Triton tile search is as big as cuTile's: per stage, the configurations a Triton search times (the declared
products of impls/triton/space.py SEARCH_SPACE, summed over the Triton kernels of a cuTile stage) equal the ones
cuTile's search times (impls/cutile/tune.py configs, default switches), on each headline shape; after clamping to
the shape Triton never times more."""

from __future__ import annotations

import math

import pytest

from impls.cutile import tune as cutile_tune
from impls.cutile.switches import CutileSwitches
from impls.triton import space
from impls.triton.fallbacks import FALLBACK

SHAPES = {  # conf/shape/S1..S4.yaml: nheads, ngroups, headdim, dstate, chunk
    "S1": (80, 1, 64, 128, 256), "S2": (80, 1, 64, 128, 256), "S3": (64, 8, 64, 128, 256), "S4": (32, 1, 64, 64, 128),
}


def _triton_counts(count) -> dict[str, int]:
    out: dict[str, int] = {}
    for kernel, stage in space.CUTILE_STAGE.items():
        out[stage] = out.get(stage, 0) + count(kernel)
    return out


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_triton_times_as_many_configs_per_stage_as_cutile(shape):
    nheads, ngroups, headdim, dstate, chunk = SHAPES[shape]
    cutile = {stage: len(cutile_tune.configs(stage, CutileSwitches(), nheads // ngroups))
              for stage in cutile_tune.SPACE}
    declared = _triton_counts(lambda k: math.prod(len(v) for v in space.SEARCH_SPACE[k].values()))
    assert declared == cutile
    dims = {"nheads": nheads, "chunk": chunk, "headdim": headdim, "dstate": dstate}
    clamped = _triton_counts(lambda k: len(space.search_space(k, {}, dims)))
    assert all(clamped[s] <= cutile[s] for s in cutile), (clamped, cutile)


def test_searched_fallback_values_are_in_the_space():
    """Rule 2 of the module: the Triton-only knobs the search does not vary sit at the sm_90 fallback's value (the
    occupancy of the fallback, 0, is the one field rule 1 replaces with cuTile's values)."""
    for kernel, declared in space.SEARCH_SPACE.items():
        fallback = FALLBACK["sm90"][kernel]
        for field in ("num_warps", "num_stages", "block_positions"):
            if field in declared:
                assert fallback[field] in declared[field], (kernel, field)
