"""GPU correctness of the Triton backend: every stage and the full forward against the float64 reference (on the GPU),
plus the 1,048,576-token problem checked on sampled chunks and its final state.

Variants: the defaults, each code switch off alone (cb_precision "fp32" is its "off"), all off. Cases: the headline
S1 shape and shapes covering the contract (seqlen not a multiple of chunk, ngroups 8, seq_idx with 3 sequences,
cu_seqlens, initial states + z + per-channel D + fp32 states, per-head D with x and z as strided views of one fused
projection, headdim/dstate not powers of two). Outputs are NaN-poisoned (tests.common uses
impls.tolerance.poisoned_allocations). fp32 with cb_precision "tf32" is held to the tf32 tolerance.

TRITON_TEST_SHARD="i/n" runs every n-th test, so n processes can share the GPU and compile in parallel.

The million-token problem (test_million_tokens): a float64 reference of the whole problem does not fit the
budget, and building the reference state entering a sampled chunk from the backend's own earlier states would not
be independent. So the reference is the chunked PyTorch reference run in float32 on the GPU, chunk group by chunk
group (impls.reference stages on slices: chunk_local_states, then pass_states carrying the state between groups),
from the raw inputs: its states entering the sampled chunks and its final state are independent of the backend.
Checked against it: the backend's dt/dA_cumsum (everywhere), its fp32 chunk-local states (sampled chunks), the
entering states (sampled chunks), y on the sampled chunks (reference compute_out in float64 on the chunk's slice,
from the float32 reference's entering state) and the final state. The sampled chunks include those where
x's, the states' and y's element offsets cross 2^31 (the 64-bit-offset paths).
"""

from __future__ import annotations

import math

import pytest
import torch

import impls
from impls.inputs import make_inputs
from impls.problem import Problem, Shape
from impls.tolerance import poisoned_allocations, rel_err, tolerance
from tests.common import (
    GPU_CONTRACT_CASES,
    GPU_SMALL,
    assert_matches_float64,
    float64_forward,
    switch_variant_params,
)

pytestmark = pytest.mark.gpu

SMALL = GPU_SMALL
MILLION = Shape(batch=1, seqlen=1 << 20, nheads=80, headdim=64, ngroups=1, dstate=128, chunk_size=256)

CASES = {
    **GPU_CONTRACT_CASES,
    "p256-n256-fp32-smem": Problem(Shape(1, 300, 2, 256, 1, 256, 128), has_initial_states=True),
}
OFF = {"transposed_layout": False, "operand_swap": False, "exp2": False, "cb_precision": "fp32"}
VARIANTS = {"defaults": {}, **{f"no-{k}": {k: v} for k, v in OFF.items()}, "all-off": dict(OFF)}





def _backend(**switches):
    from impls.triton import TritonBackend
    from impls.triton.config import interpreting

    if interpreting():
        pytest.skip("impls.triton was imported under TRITON_INTERPRET=1: run `pytest tests/gpu` on its own")
    ok, reason = TritonBackend.available()
    if not ok:
        pytest.skip(reason)
    return TritonBackend(**switches)


def _skip(case, variant):
    # the big shape: defaults and all-off only (its float64 reference is heavy); the largest tiles: do they fit
    # shared memory (fp32 especially)
    return (case == "S1" or case.startswith("p256")) and variant not in ("defaults", "all-off")


@pytest.mark.parametrize("case,variant,dtype", switch_variant_params(CASES, VARIANTS, skip=_skip))
def test_triton_matches_float64(case, variant, dtype, request):
    backend = _backend(**VARIANTS[variant])
    assert_matches_float64(backend, CASES[case], dtype, f"triton {case} {variant} {dtype}",
                           fused_views=case.startswith("Dhead-noncontig"))


def test_search_then_record_on_gpu(tmp_path, monkeypatch, request):
    """tuning="search" times a small declared space (most fields pinned) with do_bench and stores records;
    "record" then reads them back; results stay correct."""
    monkeypatch.setenv("SSD_TUNING_DIR", str(tmp_path))
    pins = dict(block_rows=64, block_positions=64, block_headdim=64, block_dstate=64, block_heads=8,
                num_stages=2)
    inputs = make_inputs(Problem(SMALL), device="cuda", seed=2, dtype=torch.bfloat16)
    ref = float64_forward(inputs)
    searched = _backend(tuning="search", **pins)
    out = impls.ssd_forward(**inputs.forward_kwargs(), backend=searched)
    assert rel_err(out.y, ref.y) <= tolerance(torch.bfloat16)
    stages = searched.describe()["stages"]
    assert {info["source"] for info in stages.values()} == {"search"}, stages
    assert len(list(tmp_path.rglob("triton_*.json"))) == 4
    recorded = _backend(tuning="record", **pins)
    out = impls.ssd_forward(**inputs.forward_kwargs(), backend=recorded)
    assert rel_err(out.y, ref.y) <= tolerance(torch.bfloat16)
    assert {info["source"] for info in recorded.describe()["stages"].values()} == {"record"}
    assert {s: i["config"] for s, i in recorded.describe()["stages"].items()} == {s: i["config"] for s, i in
                                                                                    stages.items()}


# --- the million-token problem --------------------------------------------------------------------------------
def long_inputs(shape: Shape, device, dtype, seed: int = 0) -> dict:
    """The documented distributions (impls/inputs.py, mamba2-init-v1) drawn on `device`: make_inputs draws on the
    CPU, which at 5.4e9 elements of x would take minutes."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def normal(*size, scale=1.0, dtype=dtype):
        return (torch.randn(*size, generator=gen, device=device, dtype=torch.float32) * scale).to(dtype)

    def uniform(n):
        return torch.rand(n, generator=gen, device=device, dtype=torch.float64)

    s = shape
    step = torch.exp(math.log(1e-3) + (math.log(1e-1) - math.log(1e-3)) * uniform(s.nheads))
    dt_bias = (step + torch.log(-torch.expm1(-step))).float()
    A = (-torch.exp(math.log(16.0) * uniform(s.nheads))).float()
    return dict(x=normal(s.batch, s.seqlen, s.nheads, s.headdim),
                dt=normal(s.batch, s.seqlen, s.nheads, scale=0.5), A=A,
                B=normal(s.batch, s.seqlen, s.ngroups, s.dstate), C=normal(s.batch, s.seqlen, s.ngroups, s.dstate),
                chunk_size=s.chunk_size, D=1.0 + 0.1 * normal(s.nheads, dtype=torch.float32), dt_bias=dt_bias,
                dt_softplus=True)


def _float32_reference_states(inp, dt, dA, sampled, group: int):
    """(states entering the sampled chunks, final state), from the reference stages run in float32 on slices of
    `group` chunks, the state carried from group to group: the states entering every chunk would not fit."""
    from impls.reference.fwd_pass_state import chunk_local_states, pass_states

    batch, seqlen, nheads, headdim = inp["x"].shape
    chunk, nchunks = inp["chunk_size"], dt.shape[2]
    state = torch.zeros(batch, nheads, headdim, inp["B"].shape[-1], device=dt.device, dtype=torch.float32)
    entering = {}
    for c0 in range(0, nchunks, group):
        c1 = min(nchunks, c0 + group)
        t0, t1 = c0 * chunk, min(c1 * chunk, seqlen)
        local = chunk_local_states(inp["B"][:, t0:t1].float(), inp["x"][:, t0:t1].float(), dt[:, :, c0:c1],
                                   dA[:, :, c0:c1])
        states, state = pass_states(local, dA[:, :, c0:c1, -1], state)
        for c in range(c0, c1):
            if c in sampled:
                entering[c] = states[:, c - c0].clone()
    return entering, state


def long_sequence_errors(backend, inp: dict, sampled, group: int = 128) -> dict[str, float]:
    """Relative errors of the backend's forward on a problem too long for a float64 reference (module docstring):
    dt/dA_cumsum everywhere; chunk-local states, entering states and y on the sampled chunks; the final state.
    seqlen must be a multiple of chunk_size."""
    from impls.reference.compute_out import compute_out as ref_compute_out
    from impls.reference.fwd_pass_state import chunk_local_states
    from impls.triton.fwd_pass_state import chunk_states

    chunk = inp["chunk_size"]
    assert inp["x"].shape[1] % chunk == 0
    ref_dt, ref_dA = impls.chunk_cumsum(inp["dt"].double(), inp["A"].double(), chunk, inp["dt_bias"].double(),
                                        True, backend="reference")
    with poisoned_allocations():
        out = impls.ssd_forward(**inp, backend=backend)
    errors = {"dt": rel_err(out.dt, ref_dt), "dA_cumsum": rel_err(out.dA_cumsum, ref_dA)}
    ref_dt, ref_dA = ref_dt.float(), ref_dA.float()
    out.dt = out.dA_cumsum = None  # 2 GB at a million tokens
    entering, final = _float32_reference_states(inp, ref_dt, ref_dA, set(sampled), group)
    errors["final_states"] = rel_err(out.final_states, final)
    # the chunk-local states are internal to fwd_pass_state: re-run its first kernel (fp32 scratch output)
    b_dt, b_dA = impls.chunk_cumsum(inp["dt"], inp["A"], chunk, inp["dt_bias"], True, backend=backend)
    with poisoned_allocations():
        local = chunk_states(inp["B"], inp["x"], b_dt, b_dA, None,
                             config=backend.describe()["stages"]["chunk_state"]["config"],
                             switches=backend.switches, empty=backend._empty,
                             dot_precision=backend._dot_precision(inp["x"]))
    del b_dt, b_dA
    f64 = torch.float64
    for c in sampled:
        t0, t1, sl = c * chunk, (c + 1) * chunk, slice(c, c + 1)
        B, C, x = (inp[k][:, t0:t1].to(f64) for k in ("B", "C", "x"))
        ref_local = chunk_local_states(B, x, ref_dt[:, :, sl].to(f64), ref_dA[:, :, sl].to(f64))
        errors[f"local[{c}]"] = rel_err(local[:, c], ref_local[:, 0])
        errors[f"states[{c}]"] = rel_err(out.states[:, c], entering[c])
        ref_y = ref_compute_out(C, B, x, ref_dt[:, :, sl].to(f64), ref_dA[:, :, sl].to(f64),
                                entering[c][:, None].to(f64), inp["D"].to(f64))
        errors[f"y[{c}]"] = rel_err(out.y[:, t0:t1], ref_y)
    return errors


# first chunks, the last ones, and those where an int32 element offset would wrap: x and y (5120 elements per
# token: token 419431 is in chunk 1638), the states (655360 elements per chunk: chunk 3277 starts past 2^31)
MILLION_SAMPLED = (0, 1, 1637, 1638, 2048, 3276, 3277, 3278, 4094, 4095)


@pytest.mark.heavy
def test_million_tokens(request):
    backend = _backend()
    errors = long_sequence_errors(backend, long_inputs(MILLION, "cuda", torch.bfloat16), MILLION_SAMPLED)
    tol = tolerance(torch.bfloat16)
    bad = {k: v for k, v in errors.items() if not v <= tol}
    print(f"[triton] million tokens: worst {max(errors, key=errors.get)}={max(errors.values()):.2e} "
          f"{backend.describe()['stages']}")
    assert not bad, f"over tolerance: {bad} (all: {errors})"
