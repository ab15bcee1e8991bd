"""Launch fields pinned by switches, and block sizes clamped to the problem they tile.

Block sizes are clamped to the problem (e.g. a 64-row tile on a 32-long chunk becomes 32): the result is the same,
only fewer masked lanes. The backend's `describe()` reports the configuration after clamping. MAX_DSTATE is the
largest dstate the tiles can take at all.
"""

from __future__ import annotations

from impls.triton.stages import STAGE_FIELDS
from impls.triton.switches import TritonSwitches

MAX_DSTATE = 256  # compute_out holds a whole (rows x dstate) tile of C; above 256 it would spill


def pinned(switches: TritonSwitches, stage: str) -> dict[str, int]:
    """The launch fields of `stage` that a switch fixes: a field's switch of the same name, chunk_state's occupancy
    by state_occupancy when set."""
    pins = {f: getattr(switches, f) for f in STAGE_FIELDS[stage] if getattr(switches, f)}
    if stage == "chunk_state" and switches.state_occupancy:  # stage 2's own, over the shared switch
        pins["occupancy"] = switches.state_occupancy
    return pins


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

