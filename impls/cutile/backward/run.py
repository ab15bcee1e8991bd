"""The cuTile backward behind `impls.ssd`: what the forward keeps (`forward_for_backward`) and the order of the
backward's kernels (`CutileBackward.backward`), the same as our Triton backward's; the math is impls/README.md's "The
chunked backward"."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from impls.chunked_backward import Saved, backward_inputs, cast, partial_sums
from impls.cutile.backward import tune
from impls.cutile.backward.chunk import chunk_grads, shared_cb
from impls.cutile.backward.common import unit_last
from impls.cutile.backward.cumsum import cumsum_grads
from impls.cutile.backward.db import db_grads
from impls.cutile.backward.dcb import dcb_grads
from impls.cutile.backward.state_pass import state_pass
from impls.problem import Shape, dtype_name
from impls.registry import ForwardResult


@dataclass(frozen=True)
class Launches:
    """What every kernel launch of one backward call shares: the backend (its switches and tuning records), the
    problem's shape, dtype and device, and whether fp32 operands go through tf32 tensor cores."""

    backend: object
    shape: Shape
    dtype: str
    device: torch.device
    tf32: bool

    def run(self, stage: str, flags: dict, stage_call):
        """`stage_call(config, None)`'s outputs with the config `stage` resolves to; `stage_call(config, submit)`
        hands its kernel's launch to `submit` (None: impls.cutile.common.launch), so that the search's kernel-only
        timer gets the launch each config builds."""
        def make_call(config):
            calls = []
            stage_call(config, calls.append)
            return calls[0]

        config = tune.resolve(self.backend, stage, self.shape, self.dtype, flags, self.device, make_call,
                              lambda cfg: stage_call(cfg, None))
        return stage_call(config, None)


@dataclass
class CutileBackward:
    """The forward's outputs and what the backward reads: `backward` runs the kernels."""

    outputs: ForwardResult
    backend: object
    args: dict
    needs: dict
    saved: Saved

    def backward(self, grads: dict) -> dict:
        """{output name: incoming gradient (None: none)} -> {input name: gradient}, for the inputs `needs` asks."""
        a, sv = self.args, self.saved
        x, B, C, D, z, seq_idx = a["x"], a["B"], a["C"], a["D"], a["z"], a["seq_idx"]
        dy, states, extra, yhat = backward_inputs(self.backend, a, sv, self.outputs.y, grads)
        dy = unit_last(dy.to(x.dtype))
        ext = {name: None if t is None else t.contiguous() for name, t in vars(extra).items()}
        go = Launches(self.backend, Shape(*x.shape, *B.shape[2:], sv.dt.shape[3]), dtype_name(x.dtype),
                      x.device, x.dtype == torch.float32 and self.backend.switches.cb_precision == "tf32")
        sw, tf32 = self.backend.switches, go.tf32
        flags = {"seq": seq_idx is not None, "z": z is not None, "varlen": ext["states"] is not None}
        has_init = a["initial_states"] is not None
        (ds, lasts, dinit, enter) = go.run(tune.STATE_PASS, {**flags, "init": has_init}, lambda cfg, submit: state_pass(
            C, sv.dA_cumsum, seq_idx, states, sv.final_states, grads.get("final_states"), dy, z, ext["states"],
            has_init, sw=sw, config=cfg, tf32=tf32, submit=submit))
        cb = shared_cb(C, B, sv.dt.shape[3], sw=sw, tf32=tf32)  # None unless switch bwd_cb='shared'
        (dx, dz, ddt1, dl, row, dD_part) = go.run(
            tune.CHUNK, {**flags, "D": "none" if D is None else D.dim()}, lambda cfg, submit: chunk_grads(
                x, B, C, sv.dt, sv.dA_cumsum, seq_idx, states, ds, dy, z, yhat, D, ext["dx"], cb, sw=sw, config=cfg,
                tf32=tf32, submit=submit))
        (dC, dG, dcb_enter) = go.run(tune.DCB, flags, lambda cfg, submit: dcb_grads(
            x, B, C, sv.dt, sv.dA_cumsum, seq_idx, states, dy, z, sw=sw, config=cfg, tf32=tf32, submit=submit))
        dB = go.run(tune.DB, flags, lambda cfg, submit: db_grads(
            x, B, C, sv.dt, sv.dA_cumsum, seq_idx, ds, dG, ext["dB"], sw=sw, config=cfg, tf32=tf32, submit=submit))
        row_tile = row.shape[4] // row.shape[3]  # the chunk kernel's source tile
        cumsum_flags = {"bias": a["dt_bias"] is not None, "softplus": a["dt_softplus"],
                        "limit": tuple(a["dt_limit"]) != (0.0, math.inf), "varlen": ext["states"] is not None}
        (ddt, dA_part, bias_part) = go.run(tune.CUMSUM, cumsum_flags, lambda cfg, submit: cumsum_grads(
            a["dt"], a["A"], a["dt_bias"], a["dt_softplus"], a["dt_limit"], sv.dt, dl, ddt1, row, row_tile, lasts,
            ext["dA_cumsum"], ext["ddt"], enter if enter is not None else dcb_enter, sw=sw, config=cfg, submit=submit))
        found = {"x": dx, "dt": ddt, "B": dB, "C": dC, "z": dz, "initial_states": dinit}
        found.update(partial_sums(a, dA_part, bias_part, dD_part))
        return {name: cast(found.get(name), a[name]) for name, wanted in self.needs.items() if wanted}


def forward_for_backward(backend, args: dict, needs: dict) -> CutileBackward:
    """The forward (`backend.ssd_forward`) on `args`, keeping what the backward reads (`Saved`): the states entering
    every chunk unless switch bwd_recompute_states is on or the forward made none (fuse_state_out's serial
    program), where the backward runs stage 2 again."""
    out = backend.ssd_forward(**args)
    keep = None if backend.switches.bwd_recompute_states else out.states
    saved = Saved(out.dt, out.dA_cumsum, out.final_states, keep)
    return CutileBackward(ForwardResult(out.y, out.final_states, out.varlen_states), backend, args, needs, saved)
