"""The fixed launch configurations of the Triton backend per architecture (tuning mode "fallback", or "auto"
without a record), pinned, clamped to the problem and shrunk to the shared-memory budget.
"""

from __future__ import annotations

from impls.triton.clamp import clamp
from impls.triton.smem import SMEM_BUDGET, compute_out_smem
from impls.triton.stages import FUSED

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

