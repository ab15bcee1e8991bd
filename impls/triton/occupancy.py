"""The register cap of a launch for the occupancy it asks for (switch occupancy; Triton's maxnreg)."""

from __future__ import annotations

REGISTERS_PER_SM = 65536  # sm_90 and sm_100


def maxnreg(config: dict[str, int]) -> int | None:
    """The launch's register cap for the configuration's occupancy (None: the compiler's choice)."""
    occupancy = config.get("occupancy", 0)
    if not occupancy:
        return None
    return min(255, REGISTERS_PER_SM // (occupancy * 32 * config["num_warps"]) // 8 * 8)

