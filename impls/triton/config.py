"""Switches and launch configurations of the Triton backend, and how a configuration is chosen per stage.

Two kinds of knobs:
- *switches* (`TritonSwitches`) change what the kernels compute with: layout of the states, operand order of the
  MMAs, exp vs exp2, tf32 vs fp32 dots. They are part of the kernel's identity (and of the tuning key).
- *launch configurations* (per kernel, a dict of block sizes, num_warps, num_stages) change how the work is tiled and
  scheduled. They come from the tuning machinery in impls/tuning.py (search / record / fallback / auto); a
  tile-size or num_warps/num_stages switch left at 0 means "tuned", a value pins that field in every stage
  where it applies (the search then only varies the other fields; a stage whose fields are all pinned reports
  the source "switches").

Block sizes are clamped to the problem (e.g. a 64-row tile on a 32-long chunk becomes 32): the result is the same,
only fewer masked lanes. `describe()` reports the configuration after clamping.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import Any

import torch

from impls import tuning
from impls.registry import switch
from impls.tuning import MODES

STAGES = ("chunk_cumsum", "chunk_state", "state_passing", "compute_out")
FUSED = "fused_state_out"  # the kernel of stages 2 and 3 together (switch fuse_state_out), tuned like a stage
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
MAX_DSTATE = 256  # compute_out holds a whole (rows x dstate) tile of C; above 256 it would spill


@dataclass(frozen=True)
class TritonSwitches:
    """Defaults: every switch on, launch configuration tuned (tuning mode "auto"). Names follow the cuTile
    backend's switches where both have the knob."""

    transposed_layout: bool = switch(
        True,
        "states (the entering-state tensor of fwd_pass_state, and its fp32 chunk-local scratch) are stored "
        "(batch, nchunks, nheads, dstate, headdim), i.e. dstate-major, and returned as a .transpose(-1, -2) view; "
        "compute_out then reads the (dstate x headdim) operand of C·stateᵀ with headdim contiguous")
    operand_swap: bool = switch(
        True,
        "MMAs computed transposed: chunk state as Bᵀ·x (dstate on M, headdim on N) instead of xᵀ·B; output tile "
        "as yᵀ = xᵀ·(B·Cᵀ ∘ Lᵀ) + state·Cᵀ (headdim on M, chunk positions on N) instead of "
        "y = (C·Bᵀ ∘ L)·x + C·stateᵀ (chunk positions on M, headdim on N)",
        sm90="the order of tl.dot's operands decides which tile is the warpgroup MMA's M side (64-row granules) and "
             "which lands on N; Triton picks the instruction and layouts",
        sm100="the order of tl.dot's operands decides the M side of the accumulator; Triton picks the MMA "
              "instruction (tcgen05 where it applies) and the layouts")
    exp2: bool = switch(
        True, "every exp(v) computed as exp2(v·log2 e), with log2 e folded into the dA_cumsum values as loaded "
        "(one multiply per loaded element instead of per exponent); softplus via exp2/log2 too")
    cb_precision: str = switch(
        "tf32", "fp32 inputs: tl.dot input_precision of every MMA ('tf32' = tensor cores at tf32, 'fp32' = "
        "input_precision='ieee'); fp16/bf16 inputs are unaffected", choices=("tf32", "fp32"))
    cb_mode: str = switch(
        "inline", "compute_out's C·Bᵀ: 'inline' = recomputed on the fly for each head; 'shared' = once per (batch, "
                  "chunk, group) by cb_kernel (fp32, read back by every head of the group)",
        choices=("inline", "shared"))
    decay_factor: bool = switch(
        False, "compute_out: source tiles wholly before the row tile use the factored decay exp(dA_m - dA_ref)·"
               "exp(dA_ref - dA_k), dA_ref at the row tile's first row (impls/README.md): the source factor times dt "
               "scales the C·Bᵀ tile's columns, the row factor the tiles' sum — no causal mask and no exp per "
               "(row, source) pair there; off by default, as cuTile's (docs/perf-notes.md: Switch defaults)")
    tma: bool = switch(
        False, "tensor-descriptor loads and stores (tl.make_tensor_descriptor) for the MMA stages' tiles: x and B in "
               "chunk_state (and its fp32 scratch store), C, B, x and the states in compute_out (and the y store), "
               "C, B and x in the fused kernel; off = pointer loads with masks. Needs the tensors contiguous in the "
               "last dimension, 16-byte aligned, strides 16-byte multiples (else ValueError naming the tensor). "
               "chunk_cumsum and state_passing keep pointer loads (as cuTile's chunk_cumsum, whose compiler uses no "
               "TMA there). Off by default",
        sm90="in-kernel TMA descriptors (tensormap.cp_fenceproxy into a workspace from triton.set_allocator), tiles "
             "by cp.async.bulk.tensor into shared memory, out-of-bounds boxes zero-filled",
        sm100="same TMA descriptors and bulk copies")
    tma_descriptors: str = switch(
        "device", "with tma on, where the tensor descriptors of compute_out and chunk_state (x, B, C, the states, "
                  "the fp32 scratch, y) are made: 'device' = in the kernel by every program "
                  "(tl.make_tensor_descriptor, the behaviour tma had alone); 'host' = once per launch on the host "
                  "(triton.tools.tensor_descriptor.TensorDescriptor) and passed as kernel arguments. 'host' needs "
                  "tma=True and the three-stage arrangement (ValueError otherwise); same alignment rules as tma",
        choices=("device", "host"),
        sm90="'host': the descriptor is a __grid_constant__ CUtensorMap kernel parameter, encoded once per launch by "
             "the driver; no tensormap.cp_fenceproxy, no workspace",
        sm100="same")
    fuse_state_out: bool = switch(
        False, "the forward as chunk_cumsum, then one kernel for stages 2 and 3 (impls/triton/fused.py): one program "
               "per (chunk, batch, head, row tile, headdim tile) does its rows' intra-chunk output; the row-tile-0 "
               "program of each (chunk, batch, head, headdim tile) also computes the chunk's local state and hands "
               "the state on (flags with acquire/release, programs numbered by an atomic ticket so that waits only "
               "point at running programs); every program adds exp(dA)·C·S_c once S_c is there. Off by default",
        sm90="removes the chunk-local fp32 scratch (write and read-back), the state_passing launch and the "
             "compute_out launch; the states are still written (the contract's output, read back by the row tiles)")
    tuning: str = switch("auto", "where launch configurations come from (impls/tuning.py modes)", choices=MODES)
    # Launch sizes: 0 = from tuning (as in the cuTile backend); a value pins that field wherever it applies.
    block_rows: int = switch(0, "compute_out: chunk rows (output positions) per program; 0 = from tuning",
                             choices=(0, 16, 32, 64, 128))
    block_positions: int = switch(
        0, "chunk positions per inner step: compute_out's source positions, chunk_state's reduction step; "
           "0 = from tuning", choices=(0, 16, 32, 64, 128))
    block_headdim: int = switch(0, "headdim columns per program (chunk_state, compute_out); 0 = from tuning",
                                choices=(0, 16, 32, 64, 128, 256))
    block_dstate: int = switch(0, "dstate columns per program in chunk_state (compute_out takes all of dstate); "
                                  "0 = from tuning", choices=(0, 16, 32, 64, 128, 256))
    block_heads: int = switch(0, "chunk_cumsum: heads per program; 0 = from tuning", choices=(0, 1, 2, 4, 8, 16))
    block_state: int = switch(0, "state_passing: state elements per program; 0 = from tuning",
                              choices=(0, 64, 128, 256, 512, 1024, 2048, 4096))
    num_warps: int = switch(0, "warps per program in every stage; 0 = from tuning", choices=(0, 1, 2, 4, 8, 16))
    num_stages: int = switch(
        0, "software-pipelining depth of the loops (chunk_state, compute_out); 0 = from tuning. Triton's "
           "nearest analogue of cuTile's latency hints", choices=(0, 1, 2, 3, 4, 5))
    heads_per_tile: int = switch(
        0, "compute_out: heads of one group per program (1 or 2; must divide nheads / ngroups, else ValueError); "
           "with 2, C's rows, each B tile and each C·Bᵀ tile are loaded/computed once for both heads, each head "
           "keeping its own state term, scores, x tiles, accumulator and epilogue (cuTile's head_mma='per_head'); "
           "0 = from tuning (fallback 1)", choices=(0, 1, 2))
    occupancy: int = switch(
        0, "CTAs per SM the register allocation must leave room for (chunk_state, compute_out, the fused kernel): "
           "N > 0 launches with maxnreg = 65536 / (N · 32 · num_warps), rounded down to a multiple of 8, at most "
           "255; 0 = from tuning, whose fallback 0 leaves registers to the compiler. cuTile's occupancy hint, as far "
           "as Triton can express it: registers only (shared memory still decides its own limit)",
        choices=(0, 1, 2, 3, 4),
        sm90="PTX .maxnreg on the kernel (Triton 3.6 has no .minnctapersm; an `occupancy=` compile option is "
             "ignored without an error, docs/triton-switches.md)")


# Which launch fields each stage has; a pinned switch of the same name overrides the tuned value.
STAGE_FIELDS: dict[str, tuple[str, ...]] = {
    "chunk_cumsum": ("block_heads", "num_warps"),
    "chunk_state": ("block_headdim", "block_dstate", "block_positions", "num_warps", "num_stages", "occupancy"),
    "state_passing": ("block_state", "num_warps"),
    "compute_out": ("block_rows", "block_positions", "block_headdim", "num_warps", "num_stages", "occupancy",
                    "heads_per_tile"),
    FUSED: ("block_rows", "block_positions", "block_headdim", "num_warps", "num_stages", "occupancy"),
}

# Fixed configurations per architecture (tuning mode "fallback", or "auto" without a record). sm_90 and sm_100
# share them until measurements say otherwise; the interpreter gets 16-wide tiles so that the CPU tests walk
# through several tiles and inner steps even at tiny shapes.
_GPU_FALLBACK: dict[str, dict[str, int]] = {
    "chunk_cumsum": {"block_heads": 8, "num_warps": 4},
    "chunk_state": {"block_headdim": 64, "block_dstate": 64, "block_positions": 64, "num_warps": 4,
                    "num_stages": 3, "occupancy": 0},
    "state_passing": {"block_state": 1024, "num_warps": 4},
    "compute_out": {"block_rows": 64, "block_positions": 64, "block_headdim": 64, "num_warps": 4,
                    "num_stages": 2, "occupancy": 0, "heads_per_tile": 1},
    FUSED: {"block_rows": 64, "block_positions": 64, "block_headdim": 64, "num_warps": 4, "num_stages": 2,
            "occupancy": 0},
}
FALLBACK: dict[str, dict[str, dict[str, int]]] = {
    "sm90": _GPU_FALLBACK,
    "sm100": _GPU_FALLBACK,
    "other": _GPU_FALLBACK,
    "interpreter": {
        "chunk_cumsum": {"block_heads": 2, "num_warps": 1},
        "chunk_state": {"block_headdim": 16, "block_dstate": 16, "block_positions": 16, "num_warps": 1,
                        "num_stages": 1, "occupancy": 0},
        "state_passing": {"block_state": 64, "num_warps": 1},
        "compute_out": {"block_rows": 16, "block_positions": 16, "block_headdim": 16, "num_warps": 1,
                        "num_stages": 1, "occupancy": 0, "heads_per_tile": 1},
        FUSED: {"block_rows": 16, "block_positions": 16, "block_headdim": 16, "num_warps": 1, "num_stages": 1,
                "occupancy": 0},
    },
}

# The declared search spaces (cartesian products; duplicates after clamping are tried once), sized so that a
# Triton search times as many configurations per stage as cuTile's (impls/cutile/tune.py SPACE, with the default
# switches on the headline shapes S1-S4: chunk_cumsum 6, fwd_pass_state 6, compute_out 24, fused 2;
# tests/test_triton_search_space.py checks it). The rule, in order:
#   1. an axis cuTile searches takes cuTile's values where Triton has the same knob (block_heads, block_headdim,
#      block_dstate, block_rows, heads_per_tile, occupancy -- Triton's as the maxnreg register cap);
#   2. the launch knobs only Triton has (num_warps, num_stages, block_positions) stay at the sm_90 fallback's value;
#   3. the slots of a cuTile axis Triton has no knob for go to one Triton-only knob with as many values, the
#      fallback's value first: chunk_cumsum's occupancy (2 values; no register cap on that kernel) -> num_warps
#      (4, 2); compute_out's shared_cb (2; Triton's cb_mode is a code switch with a tuning key of its own) ->
#      num_stages (2, 3);
#   4. fwd_pass_state is one cuTile kernel and two Triton kernels: its 6 are shared, state_passing (elementwise)
#      2 (block_state 1024, 2048), chunk_state 4 (cuTile's occupancy axis (2, 3, 4) trimmed to its ends (2, 4)).
# Clamping can merge configurations (S4: dstate 64 makes block_dstate 128 the same kernel as 64, so chunk_state
# times 2 there, cuTile 6 of which 3 with a 128-wide dstate block over 64 states).
SEARCH_SPACE: dict[str, dict[str, tuple[int, ...]]] = {
    "chunk_cumsum": {"block_heads": (4, 8, 16), "num_warps": (4, 2)},
    "chunk_state": {"block_headdim": (64,), "block_dstate": (64, 128), "block_positions": (64,),
                    "num_warps": (4,), "num_stages": (3,), "occupancy": (2, 4)},
    "state_passing": {"block_state": (1024, 2048), "num_warps": (4,)},
    "compute_out": {"block_rows": (64, 128), "block_positions": (64,), "block_headdim": (64,),
                    "num_warps": (4,), "num_stages": (2, 3), "occupancy": (2, 3, 4), "heads_per_tile": (1, 2)},
    FUSED: {"block_rows": (64,), "block_positions": (64,), "block_headdim": (32, 64),
            "num_warps": (4,), "num_stages": (2,), "occupancy": (2,)},
}
# the cuTile stage each Triton kernel's search counts towards (rule 4)
CUTILE_STAGE = {"chunk_cumsum": "chunk_cumsum", "chunk_state": "fwd_pass_state", "state_passing": "fwd_pass_state",
                "compute_out": "compute_out", FUSED: "fused"}

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


SMEM_BUDGET = 160 * 1024  # bytes of staged operands a fallback configuration may plan for (H200: 227 KiB max)


def compute_out_smem(config: dict[str, int], dims: dict[str, int], itemsize: int) -> int:
    """Rough shared-memory need of compute_out: C rows and the state tile once, B and x tiles per stage."""
    dstate = pow2_at_least_16(dims.get("dstate", 16))
    once = config["block_rows"] * dstate + dstate * config["block_headdim"]
    staged = config["num_stages"] * config["block_positions"] * (dstate + config["block_headdim"])
    return itemsize * (once + staged)


def fallback(arch_name: str, stage: str, dims: dict[str, int], itemsize: int, pins: dict[str, int]) -> dict:
    """The fixed configuration of `stage` on `arch_name`, pinned fields applied, clamped, and for compute_out
    shrunk (fewer stages, then narrower inner steps) until its operands fit SMEM_BUDGET (fp32 at dstate 256)."""
    config = clamp(stage, {**FALLBACK[arch_name][stage], **pins}, dims)
    if stage in ("compute_out", FUSED) and arch_name != "interpreter":
        while compute_out_smem(config, dims, itemsize) > SMEM_BUDGET:
            if config["num_stages"] > 1 and "num_stages" not in pins:
                config["num_stages"] -= 1
            elif config["block_positions"] > 32 and "block_positions" not in pins:
                config["block_positions"] //= 2
            elif config["block_rows"] > 32 and "block_rows" not in pins:
                config["block_rows"] //= 2
            else:
                break
    return config


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1 when the kernels were defined)."""
    from triton.runtime.interpreter import InterpretedFunction

    from impls.triton.chunk_cumsum import chunk_cumsum_kernel

    return isinstance(chunk_cumsum_kernel, InterpretedFunction)


def arch(device: torch.device) -> str:
    if interpreting() or device.type != "cuda":
        return "interpreter"
    major, _ = torch.cuda.get_device_capability(device)
    return {9: "sm90", 10: "sm100"}.get(major, "other")


def device_name(device: torch.device) -> str:
    if interpreting() or device.type != "cuda":
        return "triton-interpreter"
    return torch.cuda.get_device_name(device)


REGISTERS_PER_SM = 65536  # sm_90 and sm_100


def maxnreg(config: dict[str, int]) -> int | None:
    """The launch's register cap for the configuration's occupancy (None: the compiler's choice)."""
    occupancy = config.get("occupancy", 0)
    if not occupancy:
        return None
    return min(255, REGISTERS_PER_SM // (occupancy * 32 * config["num_warps"]) // 8 * 8)


def pinned(switches: TritonSwitches, stage: str) -> dict[str, int]:
    """The launch fields of `stage` that a switch fixes."""
    return {f: getattr(switches, f) for f in STAGE_FIELDS[stage] if getattr(switches, f)}


def pow2_at_least_16(n: int) -> int:
    return max(16, triton_next_pow2(n))


def triton_next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def clamp(stage: str, config: dict[str, int], dims: dict[str, int]) -> dict[str, int]:
    """Block sizes no larger than the (power-of-two, >= 16) extent they tile; block sizes are powers of two."""
    out = dict(config)
    limits = {
        "block_heads": triton_next_pow2(dims.get("nheads", 1)),
        "block_rows": dims.get("chunk", 16),
        "block_positions": dims.get("chunk", 16),
        "block_headdim": pow2_at_least_16(dims.get("headdim", 16)),
        "block_dstate": pow2_at_least_16(dims.get("dstate", 16)),
        "block_state": max(16, triton_next_pow2(dims.get("headdim", 1) * dims.get("dstate", 1))),
    }
    for key, value in out.items():
        if key.startswith("block_"):
            if value < 1 or value & (value - 1):
                raise ValueError(f"switch {key!r} of backend 'triton': expected a power of two, got {value}")
            if key in ("block_rows", "block_positions", "block_headdim", "block_dstate") and value < 16:
                raise ValueError(f"switch {key!r} of backend 'triton': tl.dot needs >= 16, got {value}")
            out[key] = min(value, limits[key])
    return out


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


@dataclass
class Resolved:
    """What one stage ran with: the configuration after pinning and clamping, and where it came from."""

    config: dict[str, int]
    resolution: Any  # impls.tuning.Resolution: source ("search" | "record" | "fallback" | "switches"), key, reason
    pinned: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {**self.resolution.as_dict(), "config": dict(self.config), "pinned": list(self.pinned)}


STACK = ("triton", "driver")  # what a Triton record is bound to


def record_key(switches: TritonSwitches, shape_label: str, dtype: str, flags: dict) -> str:
    """The tuning record's key: shape, dtype, the code-changing switches and the call's flags (bias, z, ...)."""
    return tuning.tuning_key(shape_label, dtype, **code_switches(switches), **flags)


def tunable(stage: str, switches: TritonSwitches, key: str, dtype: str, dims: dict[str, int], device: torch.device,
            launch) -> tuning.Tunable:
    """The stage's choice as impls/tuning.py takes it: key (shape, dtype, code switches, call flags), the declared
    space with the pinned fields fixed and clamped, the fallback of the architecture, and the stage's launch as
    the call to time (whole stage, do_bench median; under the interpreter one configuration, the fallback, timed
    by the wall clock)."""
    pins = pinned(switches, stage)
    arch_name = arch(device)
    fixed = fallback(arch_name, stage, dims, DTYPE_BYTES[dtype], pins)
    interp = arch_name == "interpreter"
    return tuning.Tunable(
        backend="triton", stage=stage, key=key,
        gpu=device_name(device), mode=switches.tuning, fallback=fixed,
        space={k: list(v) for k, v in SEARCH_SPACE[stage].items()},
        configs=[fixed] if interp else search_space(stage, pins, dims), run=launch,
        pins=pins, pinned_all=set(pins) == set(STAGE_FIELDS[stage]), stack=STACK,
        stage_timer=tuning.wall_ms if interp else None)


def code_switches(switches: TritonSwitches) -> dict[str, Any]:
    """The switches that change the kernels' code (part of the tuning key)."""
    return {k: v for k, v in dataclasses.asdict(switches).items()
            if k in ("transposed_layout", "operand_swap", "exp2", "cb_precision", "cb_mode")
            # in the key only when on: records found without them keep their keys
            or (k in ("decay_factor", "tma", "fuse_state_out") and v)
            or (k == "tma_descriptors" and v != "device")}
