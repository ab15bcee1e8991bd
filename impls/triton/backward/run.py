"""The Triton backward behind `impls.ssd`: what the forward keeps (`forward_for_backward`) and the order of the
backward's kernels (`TritonBackward.backward`); the math is impls/README.md's "The chunked backward"."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from impls.chunked_backward import Saved, backward_inputs, cast, partial_sums
from impls.problem import Shape, dtype_name
from impls.registry import ForwardResult
from impls.triton.backward import tune
from impls.triton.backward.chunk import chunk_grads, shared_cb
from impls.triton.backward.cumsum import cumsum_grads
from impls.triton.backward.db import db_grads
from impls.triton.backward.dcb import dcb_grads
from impls.triton.backward.state_pass import state_pass


@dataclass(frozen=True)
class Launches:
    """What every kernel launch of one backward call shares: the backend (its switches, allocator and tuning
    records), the problem's shape, dtype and device, and the dots' input precision."""

    backend: object
    shape: Shape
    dtype: str
    device: torch.device
    precision: str

    def config(self, stage: str, flags: dict, launch) -> dict:
        return tune.resolve(self.backend, stage, self.shape, self.dtype, flags, self.device, launch)

    def run(self, stage: str, flags: dict, launch):
        return launch(self.config(stage, flags, launch))

    @property
    def kw(self) -> dict:
        return {"switches": self.backend.switches, "empty": self.backend._empty}


@dataclass
class TritonBackward:
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
        go = Launches(self.backend, Shape(*x.shape, *B.shape[2:], sv.dt.shape[3]), dtype_name(x.dtype), x.device,
                      self.backend._dot_precision(x))
        dots = {**go.kw, "dot_precision": go.precision}
        flags = {"seq": seq_idx is not None, "z": z is not None, "varlen": extra.states is not None}
        has_init = a["initial_states"] is not None
        ds, lasts, dinit, enter = go.run(tune.STATE_PASS, {**flags, "init": has_init}, lambda cfg: state_pass(
            C, sv.dA_cumsum, seq_idx, states, sv.final_states, grads.get("final_states"), dy, z, extra.states,
            has_init, config=cfg, **dots))

        cb = shared_cb(C, B, sv.dt.shape[3], **dots)  # None unless switch bwd_cb='shared'

        def chunk(cfg):
            return chunk_grads(x, B, C, sv.dt, sv.dA_cumsum, seq_idx, states, ds, dy, z, yhat, D, extra.dx, cb,
                               config=cfg, **dots)

        chunk_config = go.config(tune.CHUNK, {**flags, "D": "none" if D is None else D.dim()}, chunk)
        dx, dz, ddt1, dl, row, dD_part = chunk(chunk_config)
        dC, dG, dcb_enter = go.run(tune.DCB, flags, lambda cfg: dcb_grads(
            x, B, C, sv.dt, sv.dA_cumsum, seq_idx, states, dy, z, config=cfg, **dots))
        dB = go.run(tune.DB, flags, lambda cfg: db_grads(x, B, C, sv.dt, sv.dA_cumsum, seq_idx, ds, dG, extra.dB,
                                                         config=cfg, **dots))
        cumsum_flags = {"bias": a["dt_bias"] is not None, "softplus": a["dt_softplus"],
                        "limit": tuple(a["dt_limit"]) != (0.0, math.inf), "varlen": extra.states is not None}
        ddt, dA_part, bias_part = go.run(tune.CUMSUM, cumsum_flags, lambda cfg: cumsum_grads(
            a["dt"], a["A"], a["dt_bias"], a["dt_softplus"], a["dt_limit"], sv.dt, dl, ddt1, row,
            chunk_config["block_sources"], lasts, extra.dA_cumsum, extra.ddt,
            enter if enter is not None else dcb_enter, config=cfg, **go.kw))
        found = {"x": dx, "dt": ddt, "B": dB, "C": dC, "z": dz, "initial_states": dinit}
        found.update(partial_sums(a, dA_part, bias_part, dD_part))
        return {name: cast(found.get(name), a[name]) for name, wanted in self.needs.items() if wanted}


def forward_for_backward(backend, args: dict, needs: dict) -> TritonBackward:
    """The forward (`backend.ssd_forward`) on `args`, keeping what the backward reads (`Saved`)."""
    out = backend.ssd_forward(**args)
    keep = None if backend.switches.bwd_recompute_states else out.states
    saved = Saved(out.dt, out.dA_cumsum, out.final_states, keep)
    return TritonBackward(ForwardResult(out.y, out.final_states, out.varlen_states), backend, args, needs, saved)
