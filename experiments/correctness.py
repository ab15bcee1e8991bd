"""The correctness gate run before any timing: each stage and the whole forward against the reference.

The ground truth is the reference in float64 (on the GPU when it fits, else on the CPU for CPU runs); for shapes
whose float64 work would not fit, the chunked reference in fp32 on the GPU; and where that would not fit either
(the 2^20-token problem), the reference on sampled chunks (impls/reference/sampled.py: dt/dA_cumsum everywhere,
states and y on sampled chunks, the final state). The row records which ("reference").
Every tensor the backend allocates with torch.empty* while it is checked is NaN-filled first (an unwritten
output then fails the check instead of passing on stale memory). Tuning is resolved before that (`resolve_tuning`),
with plain allocations, so a search times its candidates as a plain call runs them. Each stage's tolerance follows
the matmul precision the backend reports for it (`Backend.precision`). The whole forward is called, checked and
timed through the public entry, `impls.ssd_forward(..., backend=<the built backend>)`, so its figures include what
a user's call pays.
"""

from __future__ import annotations

import math
import time

import torch

from impls.api import ssd_forward
from impls.inputs import Inputs
from impls.reference.compute_out import BLOCK_ELEMENTS
from impls.reference.sampled import sampled_reference
from impls.registry import get_backend
from impls.tolerance import poisoned_allocations, rel_err, tolerance

STAGE_OUTPUTS = {"chunk_cumsum": ("dt", "dA_cumsum"), "fwd_pass_state": ("states", "final_states"),
                 "compute_out": ("y",), "forward": ("y", "final_states", "varlen_states")}


class GateFailure(RuntimeError):
    """The backend's output is wrong (error over tolerance, NaN or inf)."""


REFERENCE_KINDS = ("float64", "fp32-chunked", "sampled")


def reference_bytes(inputs: Inputs, itemsize: int) -> int:
    """Working set of the full reference at `itemsize` bytes per element: copies of x-sized tensors, the entering
    and chunk-local states, and its bounded block work tensors."""
    b, L, h, p = inputs.x.shape
    n = inputs.B.shape[-1]
    nchunks = math.ceil(L / inputs.chunk_size)
    return itemsize * (6 * inputs.x.numel() + 2 * b * nchunks * h * p * n + 6 * BLOCK_ELEMENTS)


def reference_kind(inputs: Inputs, device: torch.device, requested: str) -> str:
    """`requested`, or with "auto" the most exact reference whose working set fits in half of the free device
    memory (the backend's own outputs need the rest): float64, then fp32-chunked, then sampled."""
    if requested != "auto":
        if requested not in REFERENCE_KINDS:
            raise ValueError(f"bench.reference: expected auto or one of {REFERENCE_KINDS}, got {requested!r}")
        return requested
    if device.type != "cuda":
        return "float64"
    free, _ = torch.cuda.mem_get_info(device)
    if reference_bytes(inputs, 8) < 0.5 * free:
        return "float64"
    if reference_bytes(inputs, 4) < 0.5 * free:
        return "fp32-chunked"
    return "sampled"


def reference_forward(inputs: Inputs, kind: str):
    """The reference's ForwardResult (with its intermediates) in float64 or fp32, or a SampledReference."""
    if kind == "sampled":
        return sampled_reference(**_kwargs(inputs))
    dtype = torch.float64 if kind == "float64" else torch.float32
    kwargs = _kwargs(inputs.to(dtype=dtype))
    kwargs["state_dtype"] = dtype
    return get_backend("reference").ssd_forward(**{k: kwargs[k] for k in _FORWARD_ARGS})


_FORWARD_ARGS = ("x", "dt", "A", "B", "C", "chunk_size", "D", "z", "dt_bias", "initial_states", "seq_idx",
                 "cu_seqlens", "dt_softplus", "dt_limit", "state_dtype")


def _kwargs(inputs: Inputs) -> dict:
    kw = inputs.forward_kwargs()
    if kw["cu_seqlens"] is not None and kw["seq_idx"] is None:
        from impls.api import seq_idx_from_cu_seqlens
        kw["seq_idx"] = seq_idx_from_cu_seqlens(kw["cu_seqlens"], inputs.x.shape[1])
    kw["dt_limit"] = tuple(float(v) for v in kw["dt_limit"])
    return kw


def run_stages(backend, inputs: Inputs, device=None, first_call: dict | None = None) -> dict:
    """The backend's stages chained on its own outputs, then its whole forward: stage -> {name: tensor}.
    With `first_call`, each call's wall time (synchronised) is stored there: the first call of a stage pays
    its compilation and autotuning."""
    kw = _kwargs(inputs)
    timed = {} if first_call is None else first_call
    device = device or inputs.x.device

    def call(stage, fn):
        t0 = time.perf_counter()
        result = fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        timed.setdefault(stage, time.perf_counter() - t0)
        return result

    out = {}
    if "chunk_cumsum" in backend.STAGES:  # a forward-only peer (fla) has no stage split to chain
        dt, dA = call("chunk_cumsum", lambda: backend.chunk_cumsum(kw["dt"], kw["A"], kw["chunk_size"],
                                                                    kw["dt_bias"], kw["dt_softplus"], kw["dt_limit"]))
        out["chunk_cumsum"] = {"dt": dt, "dA_cumsum": dA}
        states, final = call("fwd_pass_state", lambda: backend.fwd_pass_state(
            kw["B"], kw["x"], dt, dA, kw["initial_states"], kw["seq_idx"], kw["state_dtype"]))
        out["fwd_pass_state"] = {"states": states, "final_states": final}
        y = call("compute_out", lambda: backend.compute_out(kw["C"], kw["B"], kw["x"], dt, dA, states, kw["D"],
                                                            kw["z"], kw["seq_idx"]))
        out["compute_out"] = {"y": y}
    res = call("forward", public_forward_call(backend, kw))
    out["forward"] = {"y": res.y, "final_states": res.final_states, "varlen_states": res.varlen_states}
    return out


def public_forward(backend, kw: dict):
    """The whole forward as a user calls it: the public entry, on a built backend or by name."""
    return ssd_forward(**{k: kw[k] for k in _FORWARD_ARGS}, backend=backend)


def public_forward_call(backend, kw: dict):
    """`public_forward` as a zero-argument call (to time)."""
    return lambda: public_forward(backend, kw)


def forward_kwargs(inputs: Inputs) -> dict:
    """The arguments the harness calls the forward with (seq_idx derived from cu_seqlens where absent)."""
    return _kwargs(inputs)


def resolve_tuning(backend, inputs: Inputs, device=None, first_call: dict | None = None) -> None:
    """For a backend that resolves configs on its first call (`Backend.TUNED`: a search, a record read, an
    autotuner), one pass over its stages and forward with plain allocations, before the gate poisons them: a
    search then times its candidates as a plain call runs, and the first call's time (compilation and tuning) is
    measured here. Nothing for untuned backends."""
    if backend.TUNED:
        run_stages(backend, inputs, device, first_call)


def stage_callables(backend, inputs: Inputs) -> dict:
    """Zero-argument calls to time: each stage on the outputs of the same backend's previous stage, and the
    whole forward."""
    kw = _kwargs(inputs)
    forward = {"forward": public_forward_call(backend, kw)}
    # a peer's adapter steps and its own kernels, timed apart as stages "part:<name>"
    forward.update({f"part:{name}": fn
                    for name, fn in backend.forward_parts(**{k: kw[k] for k in _FORWARD_ARGS}).items()})
    if "chunk_cumsum" not in backend.STAGES:
        return forward
    dt, dA = backend.chunk_cumsum(kw["dt"], kw["A"], kw["chunk_size"], kw["dt_bias"], kw["dt_softplus"],
                                  kw["dt_limit"])
    states, _ = backend.fwd_pass_state(kw["B"], kw["x"], dt, dA, kw["initial_states"], kw["seq_idx"],
                                       kw["state_dtype"])
    return {
        "chunk_cumsum": lambda: backend.chunk_cumsum(kw["dt"], kw["A"], kw["chunk_size"], kw["dt_bias"],
                                                     kw["dt_softplus"], kw["dt_limit"]),
        "fwd_pass_state": lambda: backend.fwd_pass_state(kw["B"], kw["x"], dt, dA, kw["initial_states"],
                                                         kw["seq_idx"], kw["state_dtype"]),
        "compute_out": lambda: backend.compute_out(kw["C"], kw["B"], kw["x"], dt, dA, states, kw["D"], kw["z"],
                                                   kw["seq_idx"]),
        **forward,
    }


def check(backend, inputs: Inputs, ref, dtype: torch.dtype, device=None,
          first_call: dict | None = None) -> dict[str, dict]:
    """Per stage: {"rel_err": max over its outputs, "tol", "precision", "ok", "error"}; never raises for wrong
    numbers. The tolerance of a stage is the dtype's, or tf32's where the backend reports tf32 matmuls for it."""
    device = device or inputs.x.device
    resolve_tuning(backend, inputs, device, first_call)
    with poisoned_allocations():
        got = run_stages(backend, inputs, device, first_call)
    report = {}
    for stage, names in STAGE_OUTPUTS.items():
        if stage not in got:
            continue
        errs = {}
        for name in names:
            expected = getattr(ref, name)
            actual = got[stage].get(name)
            if expected is None:
                continue
            if actual is None:
                errs[name] = math.inf
                continue
            if hasattr(ref, "pick"):  # a sampled reference holds only part of each output
                actual = ref.pick(name, actual)
            errs[name] = rel_err(actual, expected)
        precision = backend.precision(stage, dtype, device)
        tol = tolerance(dtype, precision == "tf32")
        worst = max(errs.values()) if errs else math.nan
        ok = bool(errs) and all(math.isfinite(e) and e <= tol for e in errs.values())
        bad = {k: v for k, v in errs.items() if not (math.isfinite(v) and v <= tol)}
        report[stage] = {"rel_err": worst, "tol": tol, "precision": precision, "ok": ok, "errors": errs,
                         "error": None if ok else f"{stage}: rel_err {bad} > tol {tol} (NaN/inf counts as inf)"}
    return report
