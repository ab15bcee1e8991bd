"""Stand-in for vLLM's `ops/mamba_ssm.py`, which ssd_chunk_state.py imports for `softplus` alone (the real file
imports vLLM's custom ops, env and logger). The same expression as vLLM 0.33.0's Triton-3 branch;
tests/backends/test_vllm.py compares the two functions' syntax trees."""

import triton
import triton.language as tl


@triton.jit
def softplus(dt):
    dt = tl.where(dt <= 20.0, tl.math.log(tl.math.exp(dt) + 1), dt)
    return dt
