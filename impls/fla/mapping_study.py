"""How far each near-miss of the FLA mapping lands from the float64 SSD reference (CPU, float64 GLA math).

`python -m impls.fla.mapping_study` prints ‖y − y_ref‖/‖y_ref‖ for the exact map and for each variant that
changes one thing, computed with a float64 sequential simple GLA (FLA's recurrence without its kernels), so the
numbers isolate the mapping from FLA's own rounding. docs/peers.md quotes the table.
"""

from __future__ import annotations

import argparse
import math
import sys

import torch

import impls
from impls.fla import mapping
from impls.inputs import make_inputs
from impls.problem import Problem, Shape
from impls.tolerance import rel_err


def gla_sequential(q, k, v, g, scale=1.0, initial_state=None, cu_seqlens=None, state_v_first=False):
    """FLA's simple-GLA recurrence, one token at a time in float64: S_t = exp(g_t) S + k_tᵀ v_t,
    o_t = scale·q_t S_t; with cu_seqlens (batch 1) the state restarts from initial_state[i] at sequence i.
    Returns (o in q's dtype, final states (N, h, K, V) — (N, h, V, K) with state_v_first — float32)."""
    f64 = torch.float64
    b, t, h, K = q.shape
    V = v.shape[-1]
    bounds = cu_seqlens.tolist() if cu_seqlens is not None else None
    rows = [(0, t)] * b if bounds is None else list(zip(bounds[:-1], bounds[1:]))
    h0 = None if initial_state is None else initial_state.to(f64)
    if h0 is not None and state_v_first:
        h0 = h0.transpose(-1, -2)
    o = torch.zeros(b, t, h, V, dtype=f64)
    finals = []
    for i, (start, end) in enumerate(rows):
        r = i if bounds is None else 0
        S = h0[i].clone() if h0 is not None else torch.zeros(h, K, V, dtype=f64)
        for s in range(start, end):
            outer = k[r, s].to(f64)[:, :, None] * v[r, s].to(f64)[:, None, :]
            S = torch.exp(g[r, s].to(f64))[:, None, None] * S + outer
            o[r, s] = scale * torch.einsum("hk,hkv->hv", q[r, s].to(f64), S)
        finals.append(S.transpose(-1, -2) if state_v_first else S)
    final_dtype = f64 if q.dtype == f64 else torch.float32  # FLA: fp32; float64 for the CPU float64 checks
    return o.to(q.dtype), torch.stack(finals).to(final_dtype)


def _y(args, inputs):
    o, ht = gla_sequential(args.q, args.k, args.v, args.g, args.scale, args.initial_state)
    return mapping.finish(o, ht, inputs.x, inputs.D, inputs.z)[0]


STUDY_SHAPE = Shape(1, 512, 8, 64, 2, 128, 64)


def study(shape=STUDY_SHAPE, dtype=torch.bfloat16, seed=0) -> dict[str, float]:
    inputs = make_inputs(Problem(shape), seed=seed, dtype=dtype)
    ref = impls.ssd_forward(**inputs.to(torch.float64).forward_kwargs(), backend="reference").y
    kw = dict(x=inputs.x, dt=inputs.dt, A=inputs.A, B=inputs.B, C=inputs.C, chunk_size=64, dt_bias=inputs.dt_bias,
              dt_softplus=inputs.dt_softplus, dt_limit=inputs.dt_limit)
    exact = mapping.gla_args(**kw)
    out = {"exact map (v=dt·x rounded to the input dtype)": rel_err(_y(exact, inputs), ref)}

    def variant(label, **changes):
        args = mapping.gla_args(**kw)
        for name, value in changes.items():
            setattr(args, name, value(args) if callable(value) else value)
        out[label] = rel_err(_y(args, inputs), ref)

    variant("v = dt·x in float64 (no rounding of v)",
            v=lambda a: inputs.x.double() * mapping.process_dt(inputs.dt, inputs.dt_bias, True, inputs.dt_limit,
                                                               torch.float64)[..., None])
    variant("scale = dstate^-1/2 (FLA's default)", scale=shape.dstate ** -0.5)
    variant("g = dt·A rounded to the input dtype", g=lambda a: a.g.to(dtype).float())
    variant("g in log2 units (dt·A·log2 e)", g=lambda a: a.g * math.log2(math.e))
    dt_low = mapping.process_dt(inputs.dt, inputs.dt_bias, True, inputs.dt_limit, dtype)  # softplus in bf16
    variant("dt processed in the input dtype", g=(dt_low.float() * inputs.A),
            v=(inputs.x * dt_low[..., None]).to(dtype))
    reps = shape.nheads // shape.ngroups
    variant("groups tiled (h % ngroups) instead of repeated (h // ngroups)",
            q=inputs.C.repeat(1, 1, reps, 1), k=inputs.B.repeat(1, 1, reps, 1))
    no_bias = mapping.gla_args(**{**kw, "dt_bias": None})
    variant("dt_bias left out", g=no_bias.g, v=no_bias.v)
    o, ht = gla_sequential(exact.q, exact.k, exact.v, exact.g, exact.scale)
    out["D·x left out"] = rel_err(mapping.finish(o, ht, inputs.x)[0], ref)
    return out


def main(argv=None) -> int:
    argparse.ArgumentParser(prog="python -m impls.fla.mapping_study",
                            description="The error of each way of mapping the SSD onto FLA's simple GLA, against "
                                        "float64 (CPU, minutes).").parse_args(argv)
    for label, err in study().items():
        print(f"{err:10.3e}  {label}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
