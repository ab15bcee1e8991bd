"""The "tilegym" backward: TileGym 1.5.1's `mamba2_chunk_backward` (cuTile, five launches; it recomputes the
chunk states) behind `impls.ssd`, with what it lacks done on our side and reported apart (impls/README.md, "The
backward"): dt's processing (bias, softplus, clamp) is differentiated by torch autograd from TileGym's gradient of
the processed dt. The z gate and a per-channel D have no TileGym gradient: such calls are refused."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from impls.registry import BackendUnavailable, ForwardResult
from impls.tilegym import adapter

OUTPUTS_WITHOUT_GRADIENT = {
    "z": "TileGym's backward has no z gate (the gate's gradient would be ours, not TileGym's)",
    "D per channel": "TileGym's backward takes a per-head D only",
    "state_dtype": "TileGym's backward recomputes its states in fp32 and takes no state_dtype of the forward's",
}


def refusal(args: dict) -> str:
    """Why TileGym's backward cannot take `args` (ssd_forward's keyword arguments), or ""."""
    if args["z"] is not None:
        return OUTPUTS_WITHOUT_GRADIENT["z"]
    if args["D"] is not None and args["D"].dim() == 2:
        return OUTPUTS_WITHOUT_GRADIENT["D per channel"]
    if args["state_dtype"] is not None:
        return OUTPUTS_WITHOUT_GRADIENT["state_dtype"]
    return ""


@dataclass
class TilegymBackward:
    """The forward's outputs and what TileGym's backward is called with."""

    outputs: ForwardResult
    mod: object
    args: dict
    needs: dict

    def backward(self, grads: dict) -> dict:
        a = self.args
        x, B, C, A = a["x"], a["B"], a["C"], a["A"]
        b, t, h, p = x.shape
        n = B.shape[-1]
        with torch.enable_grad():  # dt's processing, differentiated on our side (adapter step "prepare.dt")
            dt = a["dt"].detach().requires_grad_(self.needs.get("dt", False))
            bias = None if a["dt_bias"] is None else a["dt_bias"].detach().requires_grad_(self.needs.get("dt_bias",
                                                                                                          False))
            dt32 = adapter.processed_dt(dt, bias, a["dt_softplus"], a["dt_limit"], A)
        init32 = adapter.kernel_initial_state(a["initial_states"], b, h, p, n, x)
        dy = grads.get("y")
        dy = torch.zeros_like(x) if dy is None else dy.to(x.dtype).contiguous()
        dfinal = grads.get("final_states")
        dfinal = torch.zeros_like(init32) if dfinal is None else dfinal.to(init32.dtype).contiguous()
        dx, dA, dB, dC, dD, ddt32, dinit = self.mod.mamba2_chunk_backward(
            x, A.to(torch.float32).contiguous(), B, C, adapter.kernel_D(a["D"], h, x), dt32.detach(), init32, dy,
            dfinal, chunk_size=a["chunk_size"], state_dtype=torch.float32)
        wanted = [t for t in (dt, bias) if t is not None and t.requires_grad]
        found = iter(torch.autograd.grad(dt32, wanted, ddt32.to(dt32.dtype)) if wanted else ())
        out = {"x": dx, "A": dA.to(A.dtype), "B": dB, "C": dC}
        out.update({name: next(found) for name, t in (("dt", dt), ("dt_bias", bias))
                    if t is not None and t.requires_grad})
        if a["D"] is not None:
            out["D"] = dD.to(a["D"].dtype)
        if a["initial_states"] is not None:
            out["initial_states"] = dinit.to(a["initial_states"].dtype)
        return out


def forward_for_backward(backend, args: dict, needs: dict) -> TilegymBackward:
    why = refusal(args)
    if why:
        raise BackendUnavailable(f"backend 'tilegym' has no backward for this call: {why}")
    outputs = backend.ssd_forward(**args)
    return TilegymBackward(ForwardResult(outputs.y, outputs.final_states), backend.mod(), args, needs)
