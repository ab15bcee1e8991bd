"""The stages of the Triton backend that take a launch configuration, and the launch fields each one has.

The four stages of the forward, and FUSED: the kernel of stages 2 and 3 together (switch fuse_state_out), tuned
like a stage. A launch field of STAGE_FIELDS that a switch of the same name pins (impls/triton/clamp.py: `pinned`)
overrides the tuned value.
"""

from __future__ import annotations

STAGES = ("chunk_cumsum", "chunk_state", "state_passing", "compute_out")
FUSED = "fused_state_out"  # the kernel of stages 2 and 3 together (switch fuse_state_out), tuned like a stage

# Which launch fields each stage has; a pinned switch of the same name overrides the tuned value.
STAGE_FIELDS: dict[str, tuple[str, ...]] = {
    "chunk_cumsum": ("block_heads", "num_warps"),
    "chunk_state": ("block_headdim", "block_dstate", "block_positions", "num_warps", "num_stages", "occupancy"),
    "state_passing": ("block_state", "num_warps"),
    "compute_out": ("block_rows", "block_positions", "block_headdim", "num_warps", "num_stages", "occupancy",
                    "heads_per_tile"),
    FUSED: ("block_rows", "block_positions", "block_headdim", "num_warps", "num_stages", "occupancy"),
}
