"""The shared-memory model of the Triton backend: what compute_out (and the fused kernel) stage in shared memory
for a launch configuration, and the budget a fallback configuration is shrunk to fit (impls/triton/fallbacks.py).
"""

from __future__ import annotations

from impls.triton.clamp import pow2_at_least_16

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
SMEM_BUDGET = 160 * 1024  # bytes of staged operands a fallback configuration may plan for (H200: 227 KiB max)


def compute_out_smem(config: dict[str, int], dims: dict[str, int], itemsize: int) -> int:
    """Rough shared-memory need of compute_out: C rows and the state tile once, B and x tiles per stage."""
    dstate = pow2_at_least_16(dims.get("dstate", 16))
    once = config["block_rows"] * dstate + dstate * config["block_headdim"]
    staged = config["num_stages"] * config["block_positions"] * (dstate + config["block_headdim"])
    return itemsize * (once + staged)

