"""How a launch configuration is chosen per stage of the Triton backend: what impls/tuning.py needs (`tunable`: the
record key, the declared space with the pinned fields fixed and clamped, the fallback, the call to time) and what
one stage ran with (`Resolved`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from impls import tuning
from impls.triton import target
from impls.triton.clamp import pinned
from impls.triton.fallbacks import fallback
from impls.triton.smem import DTYPE_BYTES
from impls.triton.space import SEARCH_SPACE, search_space
from impls.triton.stages import FUSED, STAGE_FIELDS
from impls.triton.switches import TritonSwitches, code_switches


@dataclass
class Resolved:
    """What one stage ran with: the configuration after pinning and clamping, and where it came from."""

    config: dict[str, int]
    resolution: Any  # impls.tuning.Resolution: source ("search" | "record" | "fallback" | "switches"), key, reason
    pinned: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {**self.resolution.as_dict(), "config": dict(self.config), "pinned": list(self.pinned)}


STACK = ("triton", "driver")  # what a Triton record is bound to
FUSED_ONLY = ("fuse_state_out", "fused_program")  # switches that change the fused kernel's code and no other's


def record_key(switches: TritonSwitches, shape_label: str, dtype: str, flags: dict, stage: str | None = None) -> str:
    """The tuning record's key: shape, dtype, the code-changing switches and the call's flags (bias, z, ...).
    `fuse_state_out` and `fused_program` change only the fused kernel's code: with a `stage` other than FUSED they
    stay out of the key, so the fused arrangement's staged kernels (chunk_cumsum, and the stages timed on their own)
    use the records of the staged arrangement with the same other switches instead of searching again under keys of
    their own (with `fused_program` in the key, each point of the chunk program searched compute_out's 48
    configurations again on the GPU)."""
    code = code_switches(switches)
    if stage is not None and stage != FUSED:
        code = {k: v for k, v in code.items() if k not in FUSED_ONLY}
    return tuning.tuning_key(shape_label, dtype, **code, **flags)


# The switch-effects table: per stage, dtype and code switch, whether the switch alone at its AWAY value changes the
# stage's kernel launches (written by `python -m instruments.triton.switch_effects`)
LAUNCH_EFFECTS = Path(__file__).with_name("switch_launch_effects.json")
# each code switch's value away from its default (tma on: descriptors made in the kernel)
AWAY = {"transposed_layout": False, "operand_swap": False, "exp2": False, "exp2_ftz": False, "decay_factor": True,
        "heads_first": True, "tma": True, "cb_mode": "shared", "state_pass": "serial",
        "exp_fold": True, "decay_single": True}
# the row of impls/triton/switch_launch_effects.json each tuned kernel reads (stage 2: two kernels; the fused kernel:
# none)
EFFECTS_STAGE = {"chunk_cumsum": "chunk_cumsum", "chunk_state": "fwd_pass_state", "state_passing": "fwd_pass_state",
                 "compute_out": "compute_out"}


# switches that change no kernel's code: the tuning mode, the host path, the chunk the stages run at (inner_chunk:
# the records of the shape at that chunk, its label, under the keys of the same switches)
NOT_CODE = ("tuning", "launch_path", "inner_chunk")


def same_sass_key(switches: TritonSwitches, shape_label: str, dtype: str, flags: dict, stage: str) -> str | None:
    """The defaults' record key when `stage`'s code under `switches` is the defaults' (tuning.SAME_SASS), else None:
    the switches differ from TritonSwitches() (NOT_CODE aside) in one switch, and either the stage's key and
    pins are the defaults' (the switch is none of the stage's code-changing switches) or the switch is at the value
    impls/triton/switch_launch_effects.json recorded and that row (stage, dtype) reads "no-op ... (same launches)": the
    same kernels, constexprs, arguments and launch options, so the same machine code on any target."""
    defaults = dataclasses.replace(TritonSwitches(), **{k: getattr(switches, k) for k in NOT_CODE})
    changed = [f.name for f in dataclasses.fields(switches) if getattr(switches, f.name) != getattr(defaults, f.name)]
    if len(changed) != 1:
        return None
    baseline = record_key(defaults, shape_label, dtype, flags, stage)
    if record_key(switches, shape_label, dtype, flags, stage) == baseline and \
            pinned(switches, stage) == pinned(defaults, stage):
        return baseline
    name = changed[0]
    if name not in AWAY or getattr(switches, name) != AWAY[name]:
        return None
    row = (EFFECTS_STAGE.get(stage), dtype, name, "sm_90")
    return baseline if row in tuning.same_code_rows(str(LAUNCH_EFFECTS)) else None


def tunable(stage: str, switches: TritonSwitches, key: str, dtype: str, dims: dict[str, int], device: torch.device,
            launch, same_sass: str | None = None) -> tuning.Tunable:
    """The stage's choice as impls/tuning.py takes it: key (shape, dtype, code switches, call flags), the declared
    space with the pinned fields fixed and clamped, the fallback of the architecture, and the stage's launch as
    the call to time (whole stage, do_bench median; under the interpreter one configuration, the fallback, timed
    by the wall clock); `same_sass` the record borrowed where the stage's code is the defaults' (`same_sass_key`)."""
    pins = pinned(switches, stage)
    arch_name = target.arch(device)
    fixed = fallback(arch_name, stage, dims, DTYPE_BYTES[dtype], pins)
    interp = arch_name == "interpreter"
    return tuning.Tunable(
        backend="triton", stage=stage, key=key,
        gpu=target.device_name(device), mode=switches.tuning, fallback=fixed,
        space={k: list(v) for k, v in SEARCH_SPACE[stage].items()},
        configs=[fixed] if interp else search_space(stage, pins, dims), run=launch,
        pins=pins, pinned_all=set(pins) == set(STAGE_FIELDS[stage]), stack=STACK, same_sass_key=same_sass,
        stage_timer=tuning.wall_ms if interp else None)


# How each switch enters the record key (impls/tuning.py KEY_ROLES; tests/harness/test_tuning.py checks it against
# record_key and `pinned`): the size switches fix config fields without keying the record; state_pass picks stage 2's
# kernels, whose records the call's flag `state_pass` keys (backend.py).
KEY_ROLES = {
    **dict.fromkeys(("transposed_layout", "operand_swap", "exp2", "cb_precision", "cb_mode", "decay_factor",
                     "heads_first", "tma", "tma_descriptors", "fuse_state_out", "fused_program", "exp2_ftz",
                     "exp_fold", "decay_single"),
                    tuning.KEY),
    **dict.fromkeys(("block_rows", "block_positions", "block_headdim", "block_dstate", "block_heads", "block_state",
                     "num_warps", "num_stages", "heads_per_tile", "occupancy", "state_occupancy"), tuning.PIN),
    "state_pass": tuning.KERNELS,
    "bwd_recompute_states": tuning.KERNELS,  # stage 2 once more in the backward, on its own records
    **dict.fromkeys(("launch_path", "tuning", "inner_chunk"), tuning.NEITHER),
    "cb_lower_triangle": tuning.KEY,  # the C·Bᵀ kernel's grid and compute_out's loads (code_switches, when on)
    "bwd_cb": tuning.KEY,  # bwd_chunk's code: in its record key (impls/triton/backward/tune.py), when 'shared'
    "bwd_decay_factor": tuning.KEY,  # bwd_chunk's code: in its record key (backward/tune.py), when on
    "bwd_entry_term": tuning.KEY,  # bwd_state_pass', bwd_chunk's, bwd_cumsum's code: in their keys when 'state_pass'
    "bwd_state_split": tuning.KEY,  # bwd_state_pass's code: in its record key (backward/tune.py), when off
    # bwd_dcb's and bwd_db's programs and stores: in their record keys (impls/triton/backward/tune.py), when away
    "bwd_group_split": tuning.KEY,
    "bwd_atomics": tuning.KEY,
    "bwd_dcb_sources": tuning.KEY,  # bwd_dcb's code: in its record key (impls/triton/backward/tune.py), when 'chunk'
}
