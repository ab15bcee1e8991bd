"""The cost model (frozen): floating-point work and minimum DRAM traffic of each stage and of the whole forward,
and of each kernel of our chunked backward, the whole backward and forward+backward.

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

The backward (impls/README.md, "The backward" steps 1–5 and "The chunked backward" steps 1–6; R_c = dS_{c+1},
G = C·Bᵀ, M = G ∘ L ∘ dt, dM = dŷ·xᵀ), flops per (batch, chunk, head), "per group" per (batch, chunk, group):
- bwd_state_pass (step 2): Σ_l e^{Λ_l} dŷ_lᵀ C_l 2QNP; R ← d_c R + … and ⟨R_c, S_c⟩ (dΛ_last's carried part) 2NP each
- bwd_chunk (step 3): V = R_c B_s 2QNP, S_c C_s (dΛ_s's entering-state term) 2QNP, G = C·Bᵀ again per head
  2Q²N, dM = dŷ·xᵀ 2Q²P, dx_s += Mᵀ dŷ 2Q²P
- bwd_dcb (step 4): dM per head again 2Q²P, Σ_h e^{Λ_l} dŷ_l S_c (dC's state term) 2QNP; d(C·Bᵀ)·B 2Q²N per group
- bwd_db (step 4): Σ_h (w x_s) R_c (dB's state term) 2QNP; d(C·Bᵀ)ᵀ·C 2Q²N per group
- bwd_cumsum (step 5): 0 (a reverse cumsum and elementwise work)
- bwd_recompute_states (step 1, switch bwd_recompute_states): fwd_pass_state's; bwd_recompute_yhat (step 1,
  with z: ŷ from compute_out without z): compute_out's; bwd_varlen_states (step 6, cu_seqlens: PyTorch autograd
  through varlen_states): its bytes only.
The whole backward's flops ("backward" flops, its compute floor) count each product of the math once:
5 × 2QNP + 2 × 2NP + 2 × 2Q²P per head (the state pass's product and recurrence and ⟨R, S⟩, V, S·C, dC's and dB's
state terms, dM, Mᵀdŷ) and 3 × 2Q²N per group (G, d(C·Bᵀ)·B, d(C·Bᵀ)ᵀ·C), + 2Q²P per head with z (ŷ's M·x) and
fwd_pass_state's flops with the states recomputed; our kernels exceed it by G per head instead of per group and dM
formed twice (bwd_chunk and bwd_dcb). At S1: 393 GFLOP (states saved), our kernels 649.

Each backward kernel's bytes: what it reads and writes, once each, as impls/triton/backward/ arranges it (the
cuTile kernels read and write the same tensors): inputs and gradients at their dtypes, R_c in x's dtype, the state
pass reading S_1 … S_{C−1} and the final states (fp32), d(C·Bᵀ) in fp32 over its causal Q(Q+1)/2 (the buffer is
allocated dense), ddt's and dΛ's per-position parts and the row-sum partials fp32 at one partial per position (each
further source tile of bwd_chunk adds b·H·C·Q·4 bytes), one fp32 per (batch, head, chunk) for dΛ_last, dA's and
ddt_bias's partials, dD's per (batch, chunk, head, headdim). Not counted: the float64 sums of the partials on the
host (a few MB at S1). The whole backward's floor ("backward" bytes_fused): x, B, C, the raw dt, A, dt_bias, D, z,
seq_idx, cu_seqlens, the saved dt and dA_cumsum (fp32) and final states, dy, d(final states) and d(per-sequence
states) read once, dx, dB, dC, ddt, dA, ddt_bias, dD, dz, d(initial states) written once; ŷ (with z) recomputed on
chip. Two variants, as switch bwd_recompute_states: the states entering every chunk saved (read once; the default,
under flops / bytes / bytes_fused) or recomputed (not read, the initial states read instead, stage 2's flops added;
under flops_recompute / bytes_recompute / bytes_fused_recompute). Gradients are assumed to flow into y and the final
states (and the per-sequence states), as in the timed rows (harness/gradient_gate.py output_gradients).
"backward" bytes is the sum of our kernels' (incl. bwd_recompute_* where they run); "forward_backward" adds the
forward's staged costs to it and, for bytes_fused, the fused forward plus its write of what the backward reads
(dt, dA_cumsum, the states unless recomputed) to the backward's floor. At S1 in bf16, states saved: staged 3.64 GB,
floor 1.28 GB (1.11 GB recomputed).

The model is a function of the Problem only (never of a backend), so numbers stay comparable; change it only
with a new version, recorded with every row of a point (the `cost_model` column): MODEL_VERSION names the
forward's entries (the chain's stages and "forward"), BACKWARD_MODEL_VERSION the backward's; a forward point's rows
carry the forward's entries and MODEL_VERSION, a backward or forward_backward point's every entry and
"MODEL_VERSION+BACKWARD_MODEL_VERSION" (harness/record.py). Each half changes its own version only: the forward's
numbers did not change when the backward's entries were added, so MODEL_VERSION stays ssd-cost-v1.
"""

from __future__ import annotations

import re
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


# --- the backward (impls/README.md, "The backward" and "The chunked backward") ----------------------------------
BACKWARD_MODEL_VERSION = "ssd-bwd-cost-v1"
BACKWARD_KERNELS = ("bwd_state_pass", "bwd_chunk", "bwd_dcb", "bwd_db", "bwd_cumsum")
RECOMPUTE_STATES = "bwd_recompute_states"  # stage 2 again (switch bwd_recompute_states)
RECOMPUTE_YHAT = "bwd_recompute_yhat"  # compute_out without z, for dz (with z)
VARLEN_STATES = "bwd_varlen_states"  # the per-sequence states' gradient by autograd (cu_seqlens)
BACKWARD_STAGES = ("backward", "forward_backward")


def _per_chunk(p: Problem) -> tuple[int, int, int, int, int]:
    """(b·C·H, b·C·G, Q, N, P): the (batch, chunk, head) and (batch, chunk, group) counts and the sizes."""
    s = p.shape
    return s.batch * s.nchunks * s.nheads, s.batch * s.nchunks * s.ngroups, s.chunk_size, s.dstate, s.headdim


def backward_kernel_flops(p: Problem, recompute_states: bool = False) -> dict[str, float]:
    """Flops of each kernel of our chunked backward as it computes them (dense chunk × chunk tiles)."""
    heads, groups, Q, N, P = _per_chunk(p)
    out = {
        "bwd_state_pass": heads * (2 * Q * N * P + 4 * N * P),
        "bwd_chunk": heads * (4 * Q * N * P + 2 * Q * Q * N + 4 * Q * Q * P),
        "bwd_dcb": heads * (2 * Q * Q * P + 2 * Q * N * P) + groups * 2 * Q * Q * N,
        "bwd_db": heads * 2 * Q * N * P + groups * 2 * Q * Q * N,
        "bwd_cumsum": 0,
    }
    if recompute_states:
        out[RECOMPUTE_STATES] = stage_flops(p)["fwd_pass_state"]
    if p.has_z:
        out[RECOMPUTE_YHAT] = stage_flops(p)["compute_out"]
    if p.varlen:
        out[VARLEN_STATES] = 0
    return {k: float(v) for k, v in out.items()}


def backward_flops(p: Problem, recompute_states: bool = False) -> float:
    """Flops of the chunked backward's products, each computed once: the whole backward's compute floor."""
    heads, groups, Q, N, P = _per_chunk(p)
    flops = heads * (10 * Q * N * P + 4 * N * P + 4 * Q * Q * P) + groups * 6 * Q * Q * N
    if p.has_z:
        flops += heads * 2 * Q * Q * P  # ŷ's intra-chunk product M·x (G and S·C are formed anyway)
    if recompute_states:
        flops += stage_flops(p)["fwd_pass_state"]
    return float(flops)


def _backward_sizes(p: Problem) -> dict[str, float]:
    """The backward's own tensors (bytes), beside the forward's `_sizes`."""
    s = p.shape
    b, L, H, P, G, N, Q, C = s.batch, s.seqlen, s.nheads, s.headdim, s.ngroups, s.dstate, s.chunk_size, s.nchunks
    e = _BYTES[p.dtype]
    return {
        "R": b * C * H * P * N * e,  # dS_{c+1} per chunk, in x's dtype
        "states_read": b * (C - 1) * H * P * N * _BYTES[p.state_dtype or p.dtype],  # S_1 … S_{C−1}
        "per_chunk": b * H * C * FP32,  # one fp32 per (batch, head, chunk): dΛ_last, dA's and ddt_bias's partials
        "dG": b * C * G * Q * (Q + 1) // 2 * FP32,  # d(C·Bᵀ), its causal part, fp32
        "dD_part": b * C * H * P * FP32 if p.has_D else 0,
        "x_fp32": b * L * H * P * FP32 if p.varlen else 0,  # the varlen terms, fp32 (cu_seqlens only)
        "BC_fp32": b * L * G * N * FP32 if p.varlen else 0,
        "states_fp32": b * C * H * P * N * FP32 if p.varlen else 0,
    }


def backward_kernel_bytes(p: Problem, recompute_states: bool = False) -> dict[str, float]:
    """Minimum DRAM bytes of each kernel of our chunked backward: each tensor it reads read once, each it writes
    written once (dt_in, dx, dz, dB, dC in their inputs' dtypes; the buffers between kernels as stored)."""
    z, w = _sizes(p), _backward_sizes(p)
    gated = z["z"]  # dy's gate: z read where dŷ is formed (0 without z)
    varlen_chunked = 2 * z["chunked"] if p.varlen else 0
    out = {
        "bwd_state_pass": z["BC"] + z["chunked"] + w["states_read"] + 2 * z["final"] + z["y"] + gated + z["seq_idx"]
        + w["states_fp32"] + w["R"] + w["per_chunk"] + z["init"],
        "bwd_chunk": z["x"] + 2 * z["BC"] + 2 * z["chunked"] + z["seq_idx"] + z["states"] + w["R"] + z["y"]
        + gated + (z["y"] if p.has_z else 0) + z["D"] + w["x_fp32"]
        + z["x"] + z["z"] + 3 * z["chunked"] + w["dD_part"],
        "bwd_dcb": z["x"] + z["BC"] + 2 * z["chunked"] + z["seq_idx"] + z["states"] + z["y"] + gated
        + w["dG"] + z["BC"],
        "bwd_db": z["x"] + z["BC"] + 2 * z["chunked"] + z["seq_idx"] + w["R"] + w["dG"] + w["BC_fp32"] + z["BC"],
        "bwd_cumsum": z["dt_in"] + z["params"] + 4 * z["chunked"] + w["per_chunk"] + varlen_chunked
        + z["dt_in"] + w["per_chunk"] * (1 + p.has_dt_bias),
    }
    if recompute_states:
        out[RECOMPUTE_STATES] = stage_bytes(p)["fwd_pass_state"]
    if p.has_z:
        out[RECOMPUTE_YHAT] = 2 * z["BC"] + z["x"] + 2 * z["chunked"] + z["states"] + z["D"] + z["seq_idx"] + z["y"]
    if p.varlen:
        out[VARLEN_STATES] = z["BC"] + z["x"] + 2 * z["chunked"] + z["states"] + z["cu_seqlens"] \
            + z["varlen_final"] + w["BC_fp32"] + w["x_fp32"] + varlen_chunked + w["states_fp32"]
    return {k: float(v) for k, v in out.items()}


def _saved_bytes(p: Problem, recompute_states: bool) -> float:
    """What the forward keeps for the backward (impls/chunked_backward.py `Saved`) beyond its outputs: dt and
    dA_cumsum (fp32), and the states entering every chunk unless they are recomputed."""
    z = _sizes(p)
    return float(2 * z["chunked"] + (0 if recompute_states else z["states"]))


def backward_floor_bytes(p: Problem, recompute_states: bool = False) -> float:
    """The whole backward at its floor: every input it needs, every saved tensor and incoming gradient read once,
    every gradient written once."""
    z = _sizes(p)
    inputs = z["x"] + 2 * z["BC"] + z["dt_in"] + z["params"] + z["D"] + z["z"] + z["seq_idx"] + z["cu_seqlens"]
    inputs += z["init"] if recompute_states else 0  # S_0 is among the saved states otherwise
    saved = _saved_bytes(p, recompute_states) + z["final"]
    incoming = z["y"] + z["final"] + z["varlen_final"]  # dy, d(final states), d(per-sequence states)
    grads = z["x"] + 2 * z["BC"] + z["dt_in"] + z["params"] + z["D"] + z["z"] + z["init"]
    return float(inputs + saved + incoming + grads)


def _backward_entry(p: Problem, recompute_states: bool, suffix: str) -> dict[str, float]:
    return {f"flops{suffix}": backward_flops(p, recompute_states),
            f"bytes{suffix}": sum(backward_kernel_bytes(p, recompute_states).values()),
            f"bytes_fused{suffix}": backward_floor_bytes(p, recompute_states)}


def backward_costs(p: Problem, forward: dict[str, float]) -> dict[str, dict[str, float]]:
    """{each backward kernel, "backward", "forward_backward": cost}: the states saved (the default) under flops,
    bytes, bytes_fused; recomputed (switch bwd_recompute_states) under the same names with "_recompute"."""
    flops, nbytes = backward_kernel_flops(p, True), backward_kernel_bytes(p, True)
    out = {k: {"flops": flops[k], "bytes": nbytes[k]} for k in flops}
    out["backward"] = {**_backward_entry(p, False, ""), **_backward_entry(p, True, "_recompute")}
    both = {}
    for suffix, recompute in (("", False), ("_recompute", True)):
        bwd = out["backward"]
        both[f"flops{suffix}"] = forward["flops"] + bwd[f"flops{suffix}"]
        both[f"bytes{suffix}"] = forward["bytes"] + bwd[f"bytes{suffix}"]
        both[f"bytes_fused{suffix}"] = forward["bytes_fused"] + _saved_bytes(p, recompute) \
            + bwd[f"bytes_fused{suffix}"]
    out["forward_backward"] = both
    return out


def costs(p: Problem) -> dict[str, dict[str, float]]:
    """{forward stage or "forward": {"flops", "bytes" (staged), "bytes_fused" (forward only)}}, then the
    backward's entries (`backward_costs`: each backward kernel, "backward", "forward_backward")."""
    flops, nbytes = stage_flops(p), stage_bytes(p)
    out = {st: {"flops": flops[st], "bytes": nbytes[st]} for st in STAGES}
    out["forward"] = {"flops": sum(flops.values()), "bytes": sum(nbytes.values()), "bytes_fused": fused_bytes(p)}
    return {**out, **backward_costs(p, out["forward"])}


# the backends whose kernels the model prices one by one: ours, written to its stages; a peer's kernels (TileGym's
# cuTile kernels carry our stages' names) are its own arrangement and get none
PRICED_BACKENDS = ("cutile", "triton")


def priced_kernel(kernel: str, costs: dict, backend: str) -> str | None:
    """The entry of `costs` (`costs(p)`) that prices a kernel `backend` launched, on its own, or None: for our
    backends (PRICED_BACKENDS), the entry (a forward stage or one of our backward kernels) whose name is the kernel's,
    or the kernel's less "_kernel" and what cuTile appends to it (Triton keeps the Python function's name,
    `bwd_chunk_kernel`; cuTile adds its specialisation, `bwd_chunk_kernel_Kt2_A4bf16_…`: both are `bwd_chunk`).
    Peers' kernels and our others (the C·Bᵀ kernel, the fold) have none."""
    if backend not in PRICED_BACKENDS:
        return None
    for name in (kernel, re.sub(r"_kernel(_K\w*)?$", "", kernel)):
        if name in costs and name not in ("forward", *BACKWARD_STAGES):
            return name
    return None


# (bytes key, flops key, suffix of frac_floor): the staged and fused floors, and the backward's with the states
# recomputed (switch bwd_recompute_states); a cost has the keys of the floors it defines
FLOORS = (("bytes", "flops", ""), ("bytes_fused", "flops", "_fused"),
          ("bytes_recompute", "flops_recompute", "_recompute"),
          ("bytes_fused_recompute", "flops_recompute", "_fused_recompute"))


def floor_seconds(cost: dict[str, float], bytes_key: str, flops_key: str, matmul_tflops: float,
                  copy_gbps: float) -> float:
    """max(flops / matmul ceiling, bytes / copy ceiling), in seconds; their sum for a cost marked `serial` (work done
    by separate kernels one after another, the flops by GEMMs that move no modelled bytes: the Mamba-2 layer's
    non-SSD stages, models/floor.py)."""
    compute, memory = cost[flops_key] / (matmul_tflops * 1e12), cost[bytes_key] / (copy_gbps * 1e9)
    return compute + memory if cost.get("serial") else max(compute, memory)


def derived(cost: dict[str, float], median_ms: float, matmul_tflops: float | None = None,
            copy_gbps: float | None = None) -> dict[str, float]:
    """TFLOP/s and GB/s achieved, and the fraction of each floor the cost defines (FLOORS): floor time =
    max(flops / matmul ceiling, bytes / copy ceiling) (their sum for a `serial` cost: floor_seconds), fraction =
    floor / measured (1.0 = at the roofline of the measured ceilings)."""
    seconds = median_ms * 1e-3
    out = {"gbps": cost["bytes"] / seconds / 1e9}
    if cost["flops"]:
        out["tflops"] = cost["flops"] / seconds / 1e12
    if matmul_tflops and copy_gbps:
        for bytes_key, flops_key, suffix in FLOORS:
            if bytes_key in cost:
                floor_s = floor_seconds(cost, bytes_key, flops_key, matmul_tflops, copy_gbps)
                out[f"frac_floor{suffix}"] = floor_s / seconds
    return out
