"""The cost model (frozen): floating-point work and minimum DRAM traffic of each stage and of the whole forward.

FLOPs count 2 per multiply-add of the matrix products as the chunked algorithm computes them, dense (the causal
mask inside a chunk is not subtracted: kernels compute the full chunk × chunk tile), plus the state recurrence
(one multiply-add per state element and chunk). Elementwise work (softplus, exp, the dt and decay scalings, D,
the z gate) is not counted: it is small and its cost is memory, which `bytes` covers. Per (batch, chunk, head)
with Q = chunk_size, N = dstate, P = headdim, G = ngroups:
- chunk_cumsum:   0
- fwd_pass_state: chunk states Bᵀ·(decay·dt·x) 2QNP, recurrence 2NP
- compute_out:    C·Bᵀ 2Q²N per group (not per head), scores·x 2Q²P, C·state 2QNP
At S1 (8, 4096, 80, 64, 1, 128, 256) this is ≈174 GFLOP, the figure of the performance issue.

Bytes are the minimum DRAM traffic: every tensor a stage reads is read once, every tensor it writes is written
once, at its dtype (dt, dA_cumsum, A, dt_bias, D and the final states in fp32; states in state_dtype, default
the input dtype; seq_idx and cu_seqlens int32). "staged" is the sum over the contract's three stages (so x is
read twice, dt/dA_cumsum written once and read twice, states written and read back); "fused" is a forward
that reads its inputs once and writes only y and the final states. At S1 in bf16: staged ≈1.46 GB with bf16
states (≈1.79 GB fp32), fused ≈0.71 GB — the issue's ≈1.44 / 1.78 / 0.70.

The model is a function of the Problem only (never of a backend), so numbers stay comparable; change it only
with a new MODEL_VERSION, which is recorded with every derived metric.
"""

from __future__ import annotations

from dataclasses import dataclass

from impls.problem import Problem
from impls.stages import FORWARD_STAGE_NAMES

MODEL_VERSION = "ssd-cost-v1"
STAGES = FORWARD_STAGE_NAMES

_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}
FP32 = 4
INT32 = 4


@dataclass(frozen=True)
class Cost:
    flops: float
    bytes: float


def _sizes(p: Problem) -> dict[str, float]:
    s = p.shape
    b, L, H, P, G, N, Q, C = s.batch, s.seqlen, s.nheads, s.headdim, s.ngroups, s.dstate, s.chunk_size, s.nchunks
    e = _BYTES[p.dtype]
    es = _BYTES[p.state_dtype or p.dtype]
    return {
        "x": b * L * H * P * e,
        "y": b * L * H * P * e,
        "z": b * L * H * P * e if p.has_z else 0,
        "BC": b * L * G * N * e,  # one of B, C
        "dt_in": b * L * H * e,
        "params": H * FP32 * (1 + p.has_dt_bias),  # A (+ dt_bias)
        "D": (H * P if p.D_per_channel else H) * FP32 if p.has_D else 0,
        "chunked": b * H * C * Q * FP32,  # one of dt_out, dA_cumsum (padded to whole chunks)
        "states": b * C * H * P * N * es,
        "final": b * H * P * N * FP32,
        "init": b * H * P * N * FP32 if p.has_initial_states else 0,
        "seq_idx": b * L * INT32 if p.has_seq_idx else 0,
        "varlen_final": max(p.nseqs, 1) * H * P * N * FP32 if p.varlen else 0,
        "cu_seqlens": (p.nseqs + 1) * INT32 if p.varlen else 0,
    }


def stage_flops(p: Problem) -> dict[str, float]:
    s = p.shape
    b, H, P, G, N, Q, C = s.batch, s.nheads, s.headdim, s.ngroups, s.dstate, s.chunk_size, s.nchunks
    per_head = b * C * H
    return {
        "chunk_cumsum": 0.0,
        "fwd_pass_state": float(per_head * (2 * Q * N * P + 2 * N * P)),
        "compute_out": float(b * C * G * 2 * Q * Q * N + per_head * (2 * Q * Q * P + 2 * Q * N * P)),
    }


def stage_bytes(p: Problem) -> dict[str, float]:
    z = _sizes(p)
    cumsum = z["dt_in"] + z["params"] + 2 * z["chunked"]
    state = z["BC"] + z["x"] + 2 * z["chunked"] + z["init"] + z["seq_idx"] + z["states"] + z["final"]
    out = 2 * z["BC"] + z["x"] + 2 * z["chunked"] + z["states"] + z["D"] + z["z"] + z["seq_idx"] + z["y"]
    varlen = z["varlen_final"] + z["cu_seqlens"]  # the varlen states, read off the stage outputs
    return {"chunk_cumsum": float(cumsum), "fwd_pass_state": float(state), "compute_out": float(out + varlen)}


def fused_bytes(p: Problem) -> float:
    z = _sizes(p)
    reads = z["x"] + z["dt_in"] + z["params"] + 2 * z["BC"] + z["D"] + z["z"] + z["init"] + z["seq_idx"] \
        + z["cu_seqlens"]
    writes = z["y"] + z["final"] + z["varlen_final"]
    return float(reads + writes)


def costs(p: Problem) -> dict[str, dict[str, float]]:
    """{stage or "forward": {"flops", "bytes" (staged), "bytes_fused" (forward only)}}."""
    flops, nbytes = stage_flops(p), stage_bytes(p)
    out = {st: {"flops": flops[st], "bytes": nbytes[st]} for st in STAGES}
    out["forward"] = {"flops": sum(flops.values()), "bytes": sum(nbytes.values()), "bytes_fused": fused_bytes(p)}
    return out


def derived(cost: dict[str, float], median_ms: float, matmul_tflops: float | None = None,
            copy_gbps: float | None = None) -> dict[str, float]:
    """TFLOP/s and GB/s achieved, and the fraction of the floor: floor time = max(flops / matmul ceiling,
    bytes / copy ceiling), fraction = floor / measured (1.0 = at the roofline of the measured ceilings)."""
    seconds = median_ms * 1e-3
    out = {"gbps": cost["bytes"] / seconds / 1e9}
    if cost["flops"]:
        out["tflops"] = cost["flops"] / seconds / 1e12
    if matmul_tflops and copy_gbps:
        for key, suffix in (("bytes", ""), ("bytes_fused", "_fused")):
            if key in cost:
                floor_s = max(cost["flops"] / (matmul_tflops * 1e12), cost[key] / (copy_gbps * 1e9))
                out[f"frac_floor{suffix}"] = floor_s / seconds
    return out
