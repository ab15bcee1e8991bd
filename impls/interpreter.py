"""What Triton's CPU interpreter (TRITON_INTERPRET=1) cannot compute right, for the backends whose kernels are Triton
kernels (triton, mamba_ssm, vllm): each asks `refuses` last in its `supports`, so that what its kernels cannot do
anywhere is said first."""

from __future__ import annotations

BF16_DOTS = ("bfloat16 under the Triton interpreter (TRITON_INTERPRET=1): it computes bf16 tl.dot wrongly "
             "(triton-lang/triton#11584; outputs off by orders of magnitude), so bfloat16 runs compiled, on CUDA "
             "devices, only")


def refuses(problem, interpreting: bool) -> str:
    """Why `problem` cannot run in the interpreter ("" where it can, or when not interpreting): bf16 inputs to
    kernels with dots (chunk_cumsum has none: its Problem, from the public entry, has headdim 0)."""
    return BF16_DOTS if interpreting and problem.dtype == "bfloat16" and problem.shape.headdim else ""
