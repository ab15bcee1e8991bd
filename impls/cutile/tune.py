"""Tile sizes and occupancy of the cuTile stages: explicit switches, else a tuning record, else a fixed fallback.

Modes come from impls/tuning.py. "search" uses `cuda.tile.tune.exhaustive_search` (present in cuda-tile 1.7:
`cuda/tile/tune/_tune.py`) over the declared SPACE of each stage, timing the real launch on the given inputs.
"""

from __future__ import annotations

import itertools

import torch

from impls import tuning
from impls.cutile.switches import CutileSwitches, per_head_refusal

# Fixed configs per architecture (compute capability major). 0 = the compiler's choice of occupancy.
# sm_90: the winners of the first search at S1 (tuning/NVIDIA_H200, docs/perf-notes.md version 1): occupancy 2
# was worth 1.57x on compute_out and 1.27x on fwd_pass_state over the compiler's choice; sm_100 is unmeasured.
FALLBACK = {
    9: {"chunk_cumsum": {"block_heads": 8, "occupancy": 4},
        "fwd_pass_state": {"block_headdim": 64, "block_dstate": 128, "occupancy": 2},
        "compute_out": {"block_rows": 64, "block_headdim": 64, "heads_per_tile": 1, "occupancy": 2},
        # fused (fuse_state_out): 64-column blocks spill at 168 registers, 32 fit two CTAs per SM (AOT facts)
        "fused": {"block_rows": 64, "block_headdim": 32, "occupancy": 2}},
    10: {"chunk_cumsum": {"block_heads": 8, "occupancy": 0},
         "fwd_pass_state": {"block_headdim": 64, "block_dstate": 128, "occupancy": 0},
         "compute_out": {"block_rows": 128, "block_headdim": 64, "heads_per_tile": 1, "occupancy": 0},
         "fused": {"block_rows": 64, "block_headdim": 32, "occupancy": 0}},
}
# heads_per_tile 2 is searched with the per-head lowering (switch head_mma, default per_head: HGMMA on sm_90); the
# batched rank-3 MMA lowers to HMMA.16816 with spills and measured 1.19x slower than one head per tile at S1
# (docs/perf-notes.md, versions 1 and 5). `search_space` drops the head blocks a problem or the switches cannot take.
SPACE = {
    "chunk_cumsum": {"block_heads": [4, 8, 16], "occupancy": [4, 8]},
    "fwd_pass_state": {"block_headdim": [64], "block_dstate": [64, 128], "occupancy": [2, 3, 4]},
    "compute_out": {"block_rows": [64, 128], "block_headdim": [64], "heads_per_tile": [1, 2], "occupancy": [2, 3, 4],
                    "shared_cb": [False, True]},
    "fused": {"block_rows": [64], "block_headdim": [32, 64], "occupancy": [2]},
}
# the size switches each stage reads (a superset of its search space)
STAGE_KEYS = {
    "chunk_cumsum": ("block_heads", "occupancy"),
    "fwd_pass_state": ("block_headdim", "block_dstate", "occupancy"),
    "compute_out": ("block_rows", "block_headdim", "heads_per_tile", "occupancy"),
    "fused": ("block_rows", "block_headdim", "occupancy"),
}


def fallback(stage: str, device) -> dict:
    major = torch.cuda.get_device_capability(device)[0] if torch.cuda.is_available() else 9
    return dict(FALLBACK.get(major, FALLBACK[9])[stage])


def search_space(stage: str, sw=None, heads_per_group: int | None = None) -> dict[str, list]:
    """SPACE[stage] less the values this problem and these switches cannot take (never an explicit switch: that
    one raises when the launch is built): head blocks that do not divide the heads of a group, and head blocks
    whose lowering is not built (`switches.per_head_refusal`)."""
    space = {k: list(v) for k, v in SPACE[stage].items()}
    if "heads_per_tile" in space:
        def takes(hb: int) -> bool:
            if heads_per_group is not None and heads_per_group % hb:
                return False
            return sw is None or per_head_refusal(sw, hb) is None
        space["heads_per_tile"] = [hb for hb in space["heads_per_tile"] if takes(hb)]
    return space


def configs(stage: str, sw=None, heads_per_group: int | None = None) -> list[dict]:
    space = search_space(stage, sw, heads_per_group)
    return [dict(zip(space, values)) for values in itertools.product(*space.values())]


def explicit(stage: str, sw) -> dict:
    """The config the switches fix: the non-zero size switches the stage uses, and compute_out's shared_cb when
    cb_mode is not "tuned"."""
    fixed = {k: getattr(sw, k) for k in STAGE_KEYS[stage] if getattr(sw, k)}
    if stage == "compute_out" and sw.cb_mode != "tuned":
        fixed["shared_cb"] = sw.cb_mode == "shared"
    return fixed


# default-on code tricks that change the kernels but not which tiles suit them much: a search with one turned off
# stores under a key of its own, and a run without such a record borrows the record of the key without them (the
# ablation of one trick then runs on the same tiles as the default)
CODE_TRICKS = ("tma", "exp2", "latency_hints")
DEFAULT_HEAD_MMA = CutileSwitches().head_mma  # other lowerings search and store under keys of their own


def record_key(stage: str, sw, shape_label: str, dtype: str, code_tricks: bool = True) -> str:
    """The tuning record's key: shape, dtype, the layout/operand switches, and what else changes the winner only
    when set away from its default (so the records stored without them keep their keys): a default-on code trick
    turned off (tma, exp2, latency_hints), decay_factor on, a lowering of several heads per tile other than the
    default, and everything `explicit` fixes by hand: size switches and compute_out's C·Bᵀ arrangement (a search
    with block_rows 32 or cb_mode inline fixed must not replace the record of the full search). code_tricks=False:
    the key without the tricks turned off, whose record `resolve` borrows when the tricks' own key has none."""
    extra = {k: getattr(sw, k) for k in ("transposed_layout", "operand_swap", "cb_precision")}
    if code_tricks:
        extra.update({k: False for k in CODE_TRICKS if not getattr(sw, k)})
    if stage == "compute_out" and sw.decay_factor:
        extra["decay_factor"] = True
    if stage == "compute_out" and sw.head_mma != DEFAULT_HEAD_MMA and sw.heads_per_tile != 1:  # 1: the same kernel
        extra["head_mma"] = sw.head_mma
    extra.update(explicit(stage, sw))
    return tuning.tuning_key(shape_label, dtype, **extra)


CONFIRM_TOP = 4  # the search's best configs (by its kernel means) that are timed again as whole stages


def confirm(candidates: list[dict], run_config, timer=None) -> list[dict]:
    """Each candidate config timed as the whole stage (`run_config(config)`: every kernel of the stage and its
    allocations, as the harness times it), median of `timer` (do_bench's, return_mode="median") in µs; sorted,
    fastest first. cuda.tile.tune times one kernel launch only, which leaves out e.g. the C·Bᵀ kernel of shared_cb
    (seen at S3: searched 505 µs, 789 µs as a stage)."""
    if timer is None:
        from triton.testing import do_bench

        def timer(fn):
            return do_bench(fn, warmup=25, rep=100, return_mode="median")
    timed = []
    for cfg in candidates:
        run_config(cfg)  # compiled already by the search; one call more to settle allocations
        timed.append({"config": cfg, "stage_median_us": round(1000.0 * timer(lambda cfg=cfg: run_config(cfg)), 2)})
    return sorted(timed, key=lambda t: t["stage_median_us"])


def confirm_candidates(ranked: list[dict]) -> list[dict]:
    """The configs to time as whole stages, from the search's ranking (fastest kernel first): its CONFIRM_TOP best,
    plus the best of each C·Bᵀ arrangement (shared_cb) not among them — the kernel-only ranking leaves the C·Bᵀ
    kernel out and so favours shared_cb, and the inline winner must still be timed."""
    picked = list(ranked[:CONFIRM_TOP])
    for value in dict.fromkeys(cfg.get("shared_cb") for cfg in ranked):
        best = next(cfg for cfg in ranked if cfg.get("shared_cb") == value)
        if best not in picked:
            picked.append(best)
    return picked


def resolve(stage: str, sw, device, key: str, make_call, heads_per_group: int | None = None,
            run_config=None, base_key: str | None = None) -> tuple[dict, str]:
    """(config, source). Switch values override; `make_call(config) -> KernelCall` is used by search, over
    `search_space(stage, sw, heads_per_group)`; with `run_config(config)` (the whole stage) the search's
    CONFIRM_TOP best are timed again as stages and the fastest stage wins (`confirm`). `base_key`: the record
    borrowed in modes auto/record when `key` (code tricks turned off) has none (`record_key`)."""
    fixed = explicit(stage, sw)
    if fixed and set(fixed) >= set(SPACE[stage]):
        return fixed, "switches"
    space_now = search_space(stage, sw, heads_per_group)
    gpu = torch.cuda.get_device_name(device) if torch.cuda.is_available() else "cpu"

    def search():
        import cuda.tile as ct
        from cuda.tile.tune import exhaustive_search

        space = []  # the configs with the fixed values put in, each once
        for cfg in configs(stage, sw, heads_per_group):
            if dict(cfg, **fixed) not in space:
                space.append(dict(cfg, **fixed))
        calls = {i: make_call(cfg) for i, cfg in enumerate(space)}  # a switch the problem cannot take raises
        result = exhaustive_search(list(range(len(space))), torch.cuda.current_stream(), lambda i: calls[i].grid,
                                   lambda i: calls[i].kernel, lambda i: calls[i].args, quiet=True)
        best = space[result.best.config]
        confirmed = []
        if run_config is not None:
            ranked = [space[m.config] for m in sorted(result.successes, key=lambda m: m.mean_us)]
            confirmed = confirm(confirm_candidates(ranked), run_config)
            best = confirmed[0]["config"]
        mean_us = next(m.mean_us for m in result.successes if space[m.config] == best)
        # cuda.tile.tune reports means (with a 95 % half-interval), not medians: recorded under their own names
        return best, {"search_space": space_now, "mean_us": mean_us,
                      "confirmed": confirmed,
                      "measurements": [{"config": space[m.config], "mean_us": round(m.mean_us, 2),
                                        "error_margin_us": round(m.error_margin_us, 2)} for m in result.successes],
                      "failures": [{"config": space[c], "error": f"{t.__name__}: {msg[:200]}"}
                                   for c, t, msg in result.failures],
                      "versions": {"cuda.tile": ct.__version__, "torch": torch.__version__}}

    mode = resume_mode(sw.tuning, stage, gpu, key, space_now, run_config is not None)
    if mode in ("auto", "record") and base_key and tuning.lookup("cutile", stage, gpu, key) is None \
            and tuning.lookup("cutile", stage, gpu, base_key) is not None:
        key = base_key  # a trick turned off, no record of its own: the default code's tiles
    config, source = tuning.resolve(mode, "cutile", stage, gpu, key, fallback(stage, device), search)
    config.update(fixed)
    return config, source


def resume_mode(mode: str, stage: str, gpu: str, key: str, space: dict, confirms: bool = False) -> str:
    """`resume` searches again when the stored record was searched over another space than today's (e.g. before
    heads_per_tile joined compute_out's search), or, where the search confirms its pick as whole stages
    (`confirms`), when the record was never confirmed: such a record is valid but may miss the winner. Other
    modes, and `resume` with a current record or none, are passed on as given."""
    if mode != "resume":
        return mode
    record = tuning.lookup("cutile", stage, gpu, key)
    if record is not None and (record.get("search_space") != space or (confirms and not record.get("confirmed"))):
        return "search"
    return mode
