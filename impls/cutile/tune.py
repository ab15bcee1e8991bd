"""Tile sizes and occupancy of the cuTile stages: explicit switches, else a tuning record, else a fixed fallback.

This file declares what impls/tuning.py needs (`tunable`): the space, the fallback, the record key, the
kernel-only timer (`cuda.tile.tune.exhaustive_search`, present in cuda-tile 1.7: `cuda/tile/tune/_tune.py`, on
one config at a time, so that a search resumes config by config) and the extra configs to confirm.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import torch

from impls import tuning
from impls.cutile.switches import CB_KERNEL_SWITCHES, CutileSwitches, per_head_refusal

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
# (docs/perf-notes.md, versions 1 and 5). block_headdim 32: two heads per tile at occupancy 3 compile without spills in
# the source loop there (64 spill in it; docs/perf-notes.md, version 8). fwd_pass_state's 32-wide headdim and dstate
# blocks: twice or four times the programs of its serial chunk walk (S2, one batch: 160 programs on 132 SMs at the
# 64-wide dstate block its search chose; docs/perf-notes.md, version 23). `search_space` drops the head blocks a
# problem or the switches cannot take.
SPACE = {
    "chunk_cumsum": {"block_heads": [4, 8, 16], "occupancy": [4, 8]},
    "fwd_pass_state": {"block_headdim": [64, 32], "block_dstate": [128, 64, 32], "occupancy": [2, 3, 4]},
    "compute_out": {"block_rows": [64, 128], "block_headdim": [64, 32], "heads_per_tile": [1, 2],
                    "occupancy": [2, 3, 4], "shared_cb": [False, True]},
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
    whose lowering is not built (`switches.per_head_refusal`) or that do not divide the head loop (switch head_loop)."""
    space = {k: list(v) for k, v in SPACE[stage].items()}
    if "heads_per_tile" in space:
        def takes(hb: int) -> bool:
            if heads_per_group is not None and heads_per_group % hb:
                return False
            if sw is not None and sw.head_loop % hb:  # the head loop's step must divide it
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


def pins(stage: str, sw) -> dict:
    """What the switches fix of the config (`explicit`): it wins over any record."""
    return explicit(stage, sw)


# default-on code tricks that change the kernels but not which tiles suit them much: a search with one turned off
# stores under a key of its own, and a run without such a record borrows the record of the key without them (the
# ablation of one trick then runs on the same tiles as the default)
CODE_TRICKS = ("tma", "exp2", "latency_hints")
# the launch mode and the compiler's optimisation level: away from their defaults they key and borrow like CODE_TRICKS
LAUNCH_OPTIONS = {name: getattr(CutileSwitches(), name) for name in ("pdl", "opt_level")}
DEFAULT_HEAD_MMA = CutileSwitches().head_mma  # other lowerings search and store under keys of their own
DEFAULT_STATE_PASS = CutileSwitches().state_pass  # stage 2's other arrangement searches under a key of its own
DEFAULT_FUSED_PROGRAM = CutileSwitches().fused_program  # the fused kernel's other arrangement likewise
EXP2_FTZ_STAGES = ("fwd_pass_state", "compute_out")  # the stages whose exp2 switch exp2_ftz changes
DEFAULTS = CutileSwitches()  # the declared values (what the C·Bᵀ kernel's switches are keyed away from)


def record_key(stage: str, sw, shape_label: str, dtype: str, code_tricks: bool = True) -> str:
    """The tuning record's key: shape, dtype, the layout/operand switches, and what else changes the winner only
    when set away from its default (so the records stored without them keep their keys): a default-on code trick
    turned off (tma, exp2, latency_hints), pdl on or another opt_level, or compute_out's heads_first or skip_first
    on or its head_loop set or exp_fold on (its tiles: the same registers and no more shared memory at S1's record,
    docs/perf-notes.md), stages 2 and 3 with exp2_ftz on (borrowing like those; head_loop with the record's
    heads_per_tile as the heads of one step), decay_factor on, stage 2's chunk-parallel arrangement (state_pass),
    the fused kernel's one program per chunk (fused_program), a lowering of several heads per tile other than the
    default, and everything `explicit` fixes by hand: size switches and compute_out's C·Bᵀ arrangement (a search
    with block_rows 32 or cb_mode inline fixed must not replace the record of the full search). code_tricks=False:
    the key without the tricks turned off, pdl, opt_level (and without heads_first, skip_first, head_loop,
    exp2_ftz, exp_fold), whose record impls/tuning.py borrows when the tricks' own key has none. compute_out's C·Bᵀ
    kernel switches (cb_occupancy, cb_lower_triangle) key and borrow as heads_first does, and so does decay_single
    (borrowing decay_factor's tiles)."""
    extra = {k: getattr(sw, k) for k in ("transposed_layout", "operand_swap", "cb_precision")}
    if code_tricks:
        extra.update({k: False for k in CODE_TRICKS if not getattr(sw, k)})
        extra.update({k: getattr(sw, k) for k, default in LAUNCH_OPTIONS.items() if getattr(sw, k) != default})
    if stage == "fwd_pass_state" and sw.state_pass != DEFAULT_STATE_PASS:
        extra["state_pass"] = sw.state_pass
    if stage == "fused" and sw.fused_program != DEFAULT_FUSED_PROGRAM:
        extra["fused_program"] = sw.fused_program
    if stage == "compute_out" and sw.decay_factor:
        extra["decay_factor"] = True
    if code_tricks and stage == "compute_out":  # arrangements that borrow the tiles of the key without them
        extra.update({k: True for k in ("heads_first", "skip_first", "exp_fold", "decay_single") if getattr(sw, k)})
        if sw.head_loop:
            extra["head_loop"] = sw.head_loop
    if code_tricks and stage == "compute_out":  # the C·Bᵀ kernel's own switches, borrowing like those
        extra.update({k: getattr(sw, k) for k in CB_KERNEL_SWITCHES if getattr(sw, k) != getattr(DEFAULTS, k)})
    if code_tricks and stage in EXP2_FTZ_STAGES and sw.exp2_ftz:  # borrows the tiles of the key without it
        extra["exp2_ftz"] = True
    # stage 2's sub-block main loop (state_subblock) borrows the tiles of the key without it
    if code_tricks and stage == "fwd_pass_state" and sw.state_subblock:
        extra["state_subblock"] = sw.state_subblock
    if stage == "compute_out" and sw.head_mma != DEFAULT_HEAD_MMA and sw.heads_per_tile != 1:  # 1: the same kernel
        extra["head_mma"] = sw.head_mma
    extra.update(explicit(stage, sw))
    return tuning.tuning_key(shape_label, dtype, **extra)


def candidates(ranked: list[dict]) -> list[dict]:
    """Configs to confirm as whole stages besides the ranking's best (tuning.CONFIRM_TOP): the best of each C·Bᵀ
    arrangement (shared_cb) — the kernel-only ranking left the C·Bᵀ kernel out until it timed it too
    (`kernel_timer`), and the best of either arrangement is still timed as a whole stage."""
    return [next(cfg for cfg in ranked if cfg.get("shared_cb") == value)
            for value in dict.fromkeys(cfg.get("shared_cb") for cfg in ranked)]


def kernel_timer(make_call):
    """The search's timer: one config's kernels, `make_call(cfg)` (a KernelCall, or the stage's KernelCalls in
    order: compute_out's C·Bᵀ kernel before the main kernel with shared_cb), each timed alone by
    `cuda.tile.tune.exhaustive_search`: the sum of their means, and of their 95 % half-intervals, recorded under
    their own names. Kernel time only (no launch gaps, no host), hence the confirmation as whole stages; until the
    C·Bᵀ kernel was timed here the ranking left it out (docs/perf-notes.md, version 5)."""
    def timer(cfg: dict) -> dict:
        from cuda.tile.tune import exhaustive_search

        calls = make_call(cfg)  # a switch the problem cannot take raises
        mean = margin = 0.0
        for call in calls if isinstance(calls, tuple) else (calls,):
            best = exhaustive_search([0], torch.cuda.current_stream(), lambda _, c=call: c.grid,
                                     lambda _, c=call: c.kernel, lambda _, c=call: c.args, quiet=True).best
            mean, margin = mean + best.mean_us, margin + best.error_margin_us
        return {"us": round(mean, 2), "mean_us": round(mean, 2), "error_margin_us": round(margin, 2)}
    return timer


STACK = ("cuda-tile", "tileiras", "driver")  # what a cuTile record is bound to


def tunable(stage: str, sw, device, shape_label: str, dtype: str, make_call, heads_per_group: int | None = None,
            run_config=None, output=None) -> tuning.Tunable:
    """The stage's choice as impls/tuning.py takes it. Switch values override; a search measures
    `configs(stage, sw, heads_per_group)` (the fixed values put in) with `kernel_timer(make_call)`; with
    `run_config(config)` (the whole stage) its best are confirmed as stages; `output(config)` (the whole stage's
    outputs) is asked for NaN/Inf where there is no run_config. A switch that leaves the stage's code as the
    defaults' borrows the defaults' record first (`same_sass_key`), a code trick turned off the default code's record
    (`record_key`) in auto/record. `pins` win over the record's values."""
    fixed = pins(stage, sw)
    space = []  # the configs with the fixed values put in, each once
    for cfg in configs(stage, sw, heads_per_group):
        if dict(cfg, **fixed) not in space:
            space.append(dict(cfg, **fixed))
    gpu = torch.cuda.get_device_name(device) if torch.cuda.is_available() else "cpu"
    return tuning.Tunable(
        backend="cutile", stage=stage, key=record_key(stage, sw, shape_label, dtype), gpu=gpu, mode=sw.tuning,
        fallback=fallback(stage, device), space=search_space(stage, sw, heads_per_group), configs=space,
        run=run_config, timer=kernel_timer(make_call), candidates=candidates if stage == "compute_out" else None,
        pins=fixed, pinned_all=bool(fixed) and set(fixed) >= set(SPACE[stage]),
        base_key=record_key(stage, sw, shape_label, dtype, code_tricks=False), stack=STACK, output=output,
        near_key=near_key(stage, sw, shape_label, dtype),
        same_sass_key=same_sass_key(stage, sw, shape_label, dtype, device_arch(device)),
        baseline_space=search_space(stage, dataclasses.replace(CutileSwitches(), tuning=sw.tuning), heads_per_group))


# the tricks that run on the tiles of the switch set without them (each keys its own record when set, and borrows)
BORROWING_TRICKS = {"exp2_ftz": False, "exp_fold": False, "cb_occupancy": 0, "cb_lower_triangle": False,
                    "state_subblock": 0, "decay_single": False}


def near_key(stage: str, sw, shape_label: str, dtype: str) -> str | None:
    """The record key of `sw` without its BORROWING_TRICKS (None where it has none set, or where that is the key
    itself): an arm that adds such a trick to a target's defaults (heads_first, skip_first, pdl on sm_90) borrows
    those defaults' tiles, not the declared values' that `base_key` (code_tricks=False) drops to."""
    bare = dataclasses.replace(sw, **BORROWING_TRICKS)
    if bare == sw:
        return None
    key = record_key(stage, bare, shape_label, dtype)
    return None if key == record_key(stage, sw, shape_label, dtype) else key


# The switch-effects table: per stage, dtype and code switch, whether the switch alone away from its default
# (`off`) changes the sm_90 SASS (written by `python -m instruments.cutile.switch_effects`)
SASS_EFFECTS = Path(__file__).with_name("switch_sass_effects.json")
# the value away from the default of each non-bool code switch; every other code switch is a bool whose "off" is False
OFF_VALUE = {"cb_precision": "fp32", "head_mma": "batched"}
# the value a default-off (0) int code switch is turned on to; "all off" (sass_hashes.ALL_OFF) leaves it at 0
ON_VALUE = {"head_loop": 4, "state_subblock": 64}


def baseline(name: str) -> CutileSwitches:
    """What `off(name)` is compared with: the defaults with the switches `name` needs set as it needs them (the
    declared values themselves for every switch but decay_single, whose baseline has decay_factor on)."""
    return dataclasses.replace(CutileSwitches(), **CutileSwitches.__dataclass_fields__[name].metadata.get("needs", {}))


def off(name: str) -> CutileSwitches:
    """`baseline(name)` with `name` turned away from its default: off for a default-on trick, on for a default-off
    one (operand_swap), the other precision for cb_precision, the batched (rank-3) lowering for head_mma, the head
    loop over 4 heads for head_loop."""
    default = getattr(CutileSwitches(), name)
    value = (not default) if isinstance(default, bool) else OFF_VALUE[name] if name in OFF_VALUE else ON_VALUE[name]
    return dataclasses.replace(baseline(name), **{name: value})


# switches whose switch-effects row compiles one tile config, where both settings happen to be one kernel: head_mma
# at one head per tile (its lowerings differ at two, which the row does not compile), so the row says nothing of the
# tiles a record holds
EFFECTS_AT_ONE_CONFIG = ("head_mma",)


def same_sass_key(stage: str, sw, shape_label: str, dtype: str, arch: str | None) -> str | None:
    """The defaults' record key when `stage`'s code under `sw` is the defaults' (tuning.SAME_SASS), else None: `sw`
    differs from CutileSwitches() (its tuning mode aside) in one switch, and either the stage's key and pins are the
    defaults' (the switch is none of the stage's code-changing switches) or, on sm_90 (`arch`), the switch is at the
    value impls/cutile/switch_sass_effects.json compiled and that row (stage, dtype) reads "no-op on sm_90": the same
    normalised SASS as the defaults'."""
    from impls.cutile.switches import CODE_SWITCHES

    defaults = dataclasses.replace(CutileSwitches(), tuning=sw.tuning)
    changed = [f.name for f in dataclasses.fields(sw) if getattr(sw, f.name) != getattr(defaults, f.name)]
    if len(changed) != 1:
        return None
    baseline = record_key(stage, defaults, shape_label, dtype)
    if record_key(stage, sw, shape_label, dtype) == baseline and pins(stage, sw) == pins(stage, defaults):
        return baseline
    name = changed[0]
    if arch != "sm_90" or name not in CODE_SWITCHES or name in EFFECTS_AT_ONE_CONFIG:
        return None
    if getattr(sw, name) != getattr(off(name), name):
        return None
    return baseline if (stage, dtype, name, arch) in tuning.same_code_rows(str(SASS_EFFECTS)) else None


def device_arch(device) -> str | None:
    """"sm_90" for a compute capability 9.x device; None without a CUDA device."""
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


# How each switch enters the record key (impls/tuning.py KEY_ROLES; tests/harness/test_tuning.py checks it against
# record_key and pins): a size switch and cb_mode fix config fields (and, fixed, key the record too: `explicit`);
# fuse_state_out runs the fused kernel, whose stage ("fused") has records of its own.
KEY_ROLES = {
    **dict.fromkeys(("transposed_layout", "operand_swap", "latency_hints", "tma", "exp2", "decay_factor", "heads_first",
                     "skip_first", "head_loop", "exp2_ftz", "cb_precision", "head_mma", "fused_program", "state_pass",
                     "pdl", "opt_level", "exp_fold", "decay_single"), tuning.KEY),
    **dict.fromkeys(("cb_mode", "block_heads", "block_rows", "block_headdim", "block_dstate", "heads_per_tile",
                     "occupancy"), tuning.PIN),
    "fuse_state_out": tuning.KERNELS,
    "bwd_recompute_states": tuning.KERNELS,  # stage 2 once more in the backward, on its own records
    "tuning": tuning.NEITHER,
    # the stages run at the inner chunk: the records of the shape at that chunk (its label), under the keys of the
    # same switches; no kernel's code and no config field changes
    "inner_chunk": tuning.NEITHER,
    # the C·Bᵀ kernel's code (its occupancy hint is a compile option, not a searched field: the search's
    # kernel-only timer does not time that kernel), keyed away from the default and borrowing the tiles without it
    **dict.fromkeys(("cb_occupancy", "cb_lower_triangle"), tuning.KEY),
    "state_subblock": tuning.KEY,  # stage 2's code: keyed when set, borrowing the tiles of the key without it
    "bwd_cb": tuning.KEY,  # bwd_chunk's code: in its record key (impls/cutile/backward/tune.py), when 'shared'
    "bwd_decay_factor": tuning.KEY,  # bwd_chunk's code: in its record key (backward/tune.py), when on
    "bwd_entry_term": tuning.KEY,  # bwd_state_pass', bwd_chunk's, bwd_cumsum's code: in their keys when 'state_pass'
    "bwd_state_split": tuning.KEY,  # bwd_state_pass's code: in its record key (backward/tune.py), when off
    "bwd_exp2_ftz": tuning.KEY,  # every backward kernel's exp2: in their record keys (backward/tune.py), when on
    # bwd_dcb's and bwd_db's programs and stores: in their record keys (impls/cutile/backward/tune.py), when away
    "bwd_group_split": tuning.KEY,
    "bwd_atomics": tuning.KEY,
    "bwd_dcb_sources": tuning.KEY,  # bwd_dcb's code: in its record key (impls/cutile/backward/tune.py), when 'chunk'
}
