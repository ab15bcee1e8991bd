"""The correctness gate's checks: each stage and the whole forward against the reference (the gate step that runs
them for a point is experiments/gate.py).

The ground truth is the reference in float64 (on the GPU when it fits, else on the CPU for CPU runs); for shapes
whose float64 work would not fit, the chunked reference in fp32 on the GPU; and where that would not fit either
(the 2^20-token problem), the reference on sampled chunks (impls/reference/sampled.py: dt/dA_cumsum everywhere,
states and y on sampled chunks, the final state). The row records which ("reference").
Each output passes when its whole-tensor relative error and every block's (impls.tolerance.blockwise_err) are
within the dtype's tolerance; on the GPU the forward's error must also be at most 2x mamba-ssm's own on the same
inputs (`mamba_ssm_rule`), or the row says why that rule was skipped.
Every tensor the backend allocates with torch.empty* while it is checked is NaN-filled first (an unwritten
output then fails the check instead of passing on stale memory). Tuning is resolved before that (`resolve_tuning`),
with plain allocations, so a search times its candidates as a plain call runs them. Each stage's tolerance follows
the matmul precision the backend reports for it (`Backend.precision`). The whole forward is called and checked
through the public entry (experiments/calls.py), so its figures include what a user's call pays.
"""

from __future__ import annotations

import math
import time

import torch

from experiments.calls import FORWARD_ARGS, forward_kwargs, public_forward_call
from impls import tolerance as tolerances
from impls import validate
from impls.api import non_increasing_decay
from impls.inputs import Inputs
from impls.reference.compute_out import BLOCK_ELEMENTS
from impls.reference.sampled import INT32_LIMIT, sampled_reference
from impls.registry import get_backend
from impls.tolerance import MAMBA_SSM_FACTOR, poisoned_allocations, rel_err, tolerance

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
        return sampled_reference(**forward_kwargs(inputs))
    dtype = torch.float64 if kind == "float64" else torch.float32
    kwargs = forward_kwargs(inputs.to(dtype=dtype))
    kwargs["state_dtype"] = dtype
    return get_backend("reference").ssd_forward(**{k: kwargs[k] for k in FORWARD_ARGS})


def run_stages(backend, inputs: Inputs, device=None, first_call: dict | None = None) -> dict:
    """The backend's stages chained on its own outputs, then its whole forward: stage -> {name: tensor}.
    With `first_call`, each call's wall time (synchronised) is stored there: the first call of a stage pays
    its compilation and autotuning."""
    kw = forward_kwargs(inputs)
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


def resolve_tuning(backend, inputs: Inputs, device=None, first_call: dict | None = None) -> None:
    """For a backend that resolves configs on its first call (`Backend.TUNED`: a search, a record read, an
    autotuner), one pass over its stages and forward with plain allocations, before the gate poisons them: a
    search then times its candidates as a plain call runs, and the first call's time (compilation and tuning) is
    measured here. Nothing for untuned backends."""
    if backend.TUNED:
        run_stages(backend, inputs, device, first_call)


def check(backend, inputs: Inputs, ref, dtype: torch.dtype, device=None,
          first_call: dict | None = None) -> dict[str, dict]:
    """Per stage: {"rel_err": max over its outputs (whole tensors), "block_err" and "block_where": the worst block
    over its outputs (impls.tolerance.blockwise_err) and where, "tol", "precision", "ok" (both within tol),
    "error"}; never raises for wrong numbers. The tolerance of a stage is the dtype's, or tf32's where the backend
    reports tf32 matmuls for it; the state dtype's where it is looser (impls.tolerance.tolerance)."""
    device = device or inputs.x.device
    resolve_tuning(backend, inputs, device, first_call)
    with poisoned_allocations():
        got = run_stages(backend, inputs, device, first_call)
    report = {}
    for stage, names in STAGE_OUTPUTS.items():
        if stage not in got:
            continue
        errs, blocks = {}, {}
        for name in names:
            expected = getattr(ref, name)
            actual = got[stage].get(name)
            if expected is None:
                continue
            if actual is None:
                errs[name], blocks[name] = math.inf, (math.inf, "missing")
                continue
            if hasattr(ref, "pick"):  # a sampled reference holds only part of each output
                actual = ref.pick(name, actual)
            errs[name] = rel_err(actual, expected)
            blocks[name] = _worst_block(name, actual, expected, inputs.chunk_size, ref)
        precision = backend.precision(stage, dtype, device)
        tol = tolerance(dtype, precision == "tf32", None if stage == "chunk_cumsum" else inputs.state_dtype)
        worst = max(errs.values()) if errs else math.nan
        worst_block = max(blocks, key=lambda k: blocks[k][0]) if blocks else None
        passes = lambda e: math.isfinite(e) and e <= tol  # noqa: E731
        ok = bool(errs) and all(passes(e) for e in errs.values()) and all(passes(b) for b, _ in blocks.values())
        bad = {k: v for k, v in errs.items() if not passes(v)}
        bad_blocks = {k: f"{b:.3g} at {at}" for k, (b, at) in blocks.items() if not passes(b)}
        report[stage] = {"rel_err": worst, "tol": tol, "precision": precision, "ok": ok, "errors": errs,
                         "block_err": blocks[worst_block][0] if blocks else math.nan,
                         "block_where": f"{worst_block}: {blocks[worst_block][1]}" if blocks else None,
                         "error": None if ok else (f"{stage}: rel_err {bad}, worst blocks {bad_blocks} > tol {tol} "
                                                   f"(NaN/inf counts as inf)")}
    return report


def _worst_block(name: str, actual, expected, chunk_size: int, ref) -> tuple[float, str]:
    """(worst block ratio, "batch b, chunk c, head h") of one output; chunk numbers are the problem's own also
    where a sampled reference holds only some chunks."""
    block, dims = tolerances.output_blocks(name, chunk_size)
    found = tolerances.blockwise_err(actual, expected, block)
    where = list(found.where)
    if hasattr(ref, "chunks") and name in ("y", "states") and where:
        where[1] = ref.chunks[where[1]]
    near = " (near-zero block: absolute bound)" if found.near_zero else ""
    return found.ratio, tolerances.describe_block(tuple(where), dims) + near


# On the GPU a backend's forward error must also be at most MAMBA_SSM_FACTOR × mamba-ssm's own on the same inputs
# and reference (impls/README.md). Skipped, with the reason recorded, where mamba-ssm cannot serve as the yardstick.
_MAMBA_SSM_ERRORS: dict = {}  # (problem, seed, reference kind, device) -> mamba-ssm's check report


def mamba_ssm_skip_reason(backend, problem, device) -> str | None:
    """Why the mamba-ssm rule cannot apply to `backend` on `problem`, or None when it can."""
    if device.type != "cuda":
        return "not on a GPU (the rule is for GPU runs)"
    if backend.name in ("mamba_ssm", "reference"):
        return f"the backend is {backend.name} itself" if backend.name == "mamba_ssm" else "the reference backend"
    upstream = get_backend("mamba_ssm")
    for ok, reason in (upstream.available(), upstream.check_device(device), upstream.supports(problem)):
        if not ok:
            return f"mamba_ssm cannot run the problem: {reason}"
    s = problem.shape
    if max(s.tokens * s.nheads * s.headdim, s.batch * s.nchunks * s.nheads * s.headdim * s.dstate) >= INT32_LIMIT:
        return ("mamba_ssm cannot run the problem: its kernels' 32-bit offsets pass 2^31 elements here (illegal "
                "memory access at 2^20 tokens, results/2026-12-03-h200-long-profile-decay/README.md; state-spaces/mamba#686)")
    return None


def mamba_ssm_rule(backend, inputs: Inputs, ref, problem, dtype: torch.dtype, device, report: dict,
                   cache_key=None) -> dict:
    """{"applied": bool, "why": str, "mamba_ssm_rel_err": float, "ok": bool, "error": str | None}: whether the
    backend's forward rel_err (report["forward"], from `check`) is within MAMBA_SSM_FACTOR × mamba-ssm's, or why
    the rule was skipped (mamba-ssm cannot run the problem, or fails its own gate)."""
    skipped = {"applied": False, "mamba_ssm_rel_err": math.nan, "ok": True, "error": None}
    reason = mamba_ssm_skip_reason(backend, problem, device)
    if reason is not None:
        return {**skipped, "why": f"mamba_ssm x{MAMBA_SSM_FACTOR:g} rule skipped: {reason}"}
    key = None if cache_key is None else (*cache_key, str(device))
    upstream = _MAMBA_SSM_ERRORS.get(key) if key is not None else None
    if upstream is None:
        try:
            upstream = check(get_backend("mamba_ssm"), inputs, ref, dtype, device)
        except Exception as exc:  # noqa: BLE001 - mamba-ssm failing is a reason to skip, not the backend's failure
            if "illegal memory access" in str(exc) or "unspecified launch failure" in str(exc):
                raise RuntimeError(f"mamba_ssm (the x{MAMBA_SSM_FACTOR:g} rule's yardstick) lost the CUDA context: "
                                   f"{exc}") from exc
            return {**skipped, "why": f"mamba_ssm x{MAMBA_SSM_FACTOR:g} rule skipped: mamba_ssm raised "
                                      f"{type(exc).__name__}: {exc}"}
        if key is not None:
            _MAMBA_SSM_ERRORS[key] = upstream
    theirs = upstream["forward"]
    rule = f"mamba_ssm x{MAMBA_SSM_FACTOR:g} rule"
    if not theirs["ok"]:
        return {**skipped, "mamba_ssm_rel_err": theirs["rel_err"],
                "why": f"{rule} skipped: mamba_ssm fails its own gate ({theirs['error']})"}
    ours = report["forward"]["rel_err"]
    bound = MAMBA_SSM_FACTOR * theirs["rel_err"]
    ok = ours <= bound
    return {"applied": True, "mamba_ssm_rel_err": theirs["rel_err"], "ok": ok,
            "why": f"{rule} applied to forward rel_err (mamba_ssm {theirs['rel_err']:.3g})",
            "error": None if ok else (f"forward: rel_err {ours:.3g} > {MAMBA_SSM_FACTOR:g} x mamba_ssm's "
                                      f"{theirs['rel_err']:.3g} on the same inputs")}


def refuse_unsafe_inputs(backend, inputs: Inputs) -> None:
    """Value checks the gate makes before running a backend: what its kernels or switches assume of the inputs
    (a non-increasing decay: the factored decay, switch decay_factor, or Backend.NON_INCREASING_DECAY; A <= 0 and
    dt >= 0 after processing). Raises ValueError naming the argument."""
    why = non_increasing_decay(backend)
    if why:
        validate.decay_factor_inputs(inputs.A, inputs.dt, inputs.dt_bias, inputs.dt_softplus, inputs.dt_limit, why)
