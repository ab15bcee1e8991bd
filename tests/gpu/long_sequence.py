"""The 1,048,576-token problem, shared by the cuTile and Triton GPU suites: inputs drawn on the GPU and the checks
on sampled chunks and the final state.

The ground truth is impls/reference/sampled.py (the harness's gate for such problems uses the same): dt and
dA_cumsum everywhere, the states entering the sampled chunks and y on them, the final state — all from the raw
inputs, independent of the backend. On top, the chunk-local states where the backend materialises them. The
sampled chunks include those where x's, the states' and y's element offsets cross 2^31 (the 64-bit-offset paths).
"""

from __future__ import annotations

import torch

import impls
from impls.inputs import make_inputs
from impls.problem import Problem, Shape
from impls.reference.sampled import sampled_chunks, sampled_reference
from impls.tolerance import poisoned_allocations
from tests.common import judged

MILLION = Shape(batch=1, seqlen=1 << 20, nheads=80, headdim=64, ngroups=1, dstate=128, chunk_size=256)


def long_inputs(shape: Shape, device, dtype, seed: int = 0) -> dict:
    """The headline problem's inputs (impls/inputs.py), drawn on `device`."""
    kw = make_inputs(Problem(shape), device=device, seed=seed, dtype=dtype, draw_device=device).forward_kwargs()
    return {k: v for k, v in kw.items() if v is not None and k not in ("cu_seqlens", "seq_idx")}


def long_sequence_errors(backend, inp: dict, sampled, group: int = 128, local_states=None) -> dict[str, float]:
    """Relative errors of the backend's forward against the sampled reference (module docstring), per output and
    per sampled chunk, whole and block-wise ("[blocks]": per (batch, chunk, head) or (batch, head)); and, where
    the backend materialises them (`local_states(inp, dt, dA)` -> (b, c, h, p, n)), its chunk-local states on
    the sampled chunks."""
    from impls.reference.fwd_pass_state import chunk_local_states

    ref = sampled_reference(**inp, chunks=sampled, group=group)
    with poisoned_allocations():
        out = impls.ssd_forward(**inp, backend=backend)
    chunk = inp["chunk_size"]
    errors = {}

    def judge(key: str, name: str, actual, expected) -> None:  # whole tensor and block-wise (tests.common)
        errors[key], errors[f"{key}[blocks]"] = judged(name, actual, expected, chunk)

    judge("dt", "dt", out.dt, ref.dt)
    judge("dA_cumsum", "dA_cumsum", out.dA_cumsum, ref.dA_cumsum)
    judge("final_states", "final_states", out.final_states, ref.final_states)
    out.dt = out.dA_cumsum = None  # 2 GB at a million tokens
    local = None
    if local_states is not None:  # internal to fwd_pass_state: re-run the backend's kernel that makes them
        b_dt, b_dA = impls.chunk_cumsum(inp["dt"], inp["A"], chunk, inp["dt_bias"], True, backend=backend)
        with poisoned_allocations():
            local = local_states(inp, b_dt, b_dA)
        del b_dt, b_dA
    f64 = torch.float64
    offset = 0
    for i, (c, t) in enumerate(zip(ref.chunks, ref.token_slices())):
        n = t.stop - t.start
        if local is not None:
            sl = slice(c, c + 1)
            ref_local = chunk_local_states(inp["B"][:, t].to(f64), inp["x"][:, t].to(f64), ref.dt[:, :, sl],
                                           ref.dA_cumsum[:, :, sl])
            judge(f"local[{c}]", "states", local[:, c:c + 1], ref_local)
        judge(f"states[{c}]", "states", out.states[:, c:c + 1], ref.states[:, i:i + 1])
        judge(f"y[{c}]", "y", out.y[:, t], ref.y[:, offset:offset + n])
        offset += n
    return errors


# first chunks, middle, last ones, and those where an int32 element offset would wrap: x and y (5120 elements per
# token: token 419431 is in chunk 1638), the states (655360 elements per chunk: chunk 3277 starts past 2^31)
MILLION_SAMPLED = sampled_chunks(MILLION.batch, MILLION.seqlen, MILLION.nheads, MILLION.headdim, MILLION.dstate,
                                 MILLION.chunk_size)
