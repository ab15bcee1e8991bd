"""Host-side integer helpers for the launch grids and block sizes. Triton's `triton.cdiv` and
`triton.next_power_of_2` are constexpr functions (`ConstexprFunction.__call__` unwraps every argument), about a
microsecond each when called from host code: the stages call these instead.
"""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of two ≥ n (1 for n ≤ 1)."""
    return 1 << (n - 1).bit_length() if n > 1 else 1
