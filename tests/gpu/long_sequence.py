"""The 1,048,576-token problem, shared by the cuTile and Triton GPU suites: inputs drawn on the GPU and the checks
on sampled chunks and the final state.

A float64 reference of the whole problem does not fit the budget, and building the reference state entering a
sampled chunk from the backend's own earlier states would not be independent. So the reference is the chunked
PyTorch reference run in float32 on the GPU, chunk group by chunk group (impls.reference stages on slices:
chunk_local_states, then pass_states carrying the state between groups), from the raw inputs: its states entering
the sampled chunks and its final state are independent of the backend. Checked against it: the backend's
dt/dA_cumsum (everywhere), the entering states (sampled chunks), y on the sampled chunks (reference compute_out in
float64 on the chunk's slice, from the float32 reference's entering state), the final state, and the chunk-local
states where the backend materialises them. The sampled chunks include those where x's, the states' and y's
element offsets cross 2^31 (the 64-bit-offset paths).
"""

from __future__ import annotations

import math

import torch

import impls
from impls.problem import Shape
from impls.tolerance import poisoned_allocations, rel_err

MILLION = Shape(batch=1, seqlen=1 << 20, nheads=80, headdim=64, ngroups=1, dstate=128, chunk_size=256)


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


def long_sequence_errors(backend, inp: dict, sampled, group: int = 128, local_states=None) -> dict[str, float]:
    """Relative errors of the backend's forward on a problem too long for a float64 reference (module docstring):
    dt/dA_cumsum everywhere; entering states and y on the sampled chunks; the final state; and, where the backend
    materialises them (`local_states(inp, dt, dA)` -> (b, c, h, p, n)), its chunk-local states on the sampled
    chunks. seqlen must be a multiple of chunk_size."""
    from impls.reference.compute_out import compute_out as ref_compute_out
    from impls.reference.fwd_pass_state import chunk_local_states

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
    local = None
    if local_states is not None:  # internal to fwd_pass_state: re-run the backend's kernel that makes them
        b_dt, b_dA = impls.chunk_cumsum(inp["dt"], inp["A"], chunk, inp["dt_bias"], True, backend=backend)
        with poisoned_allocations():
            local = local_states(inp, b_dt, b_dA)
        del b_dt, b_dA
    f64 = torch.float64
    for c in sampled:
        t0, t1, sl = c * chunk, (c + 1) * chunk, slice(c, c + 1)
        B, C, x = (inp[k][:, t0:t1].to(f64) for k in ("B", "C", "x"))
        if local is not None:
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
