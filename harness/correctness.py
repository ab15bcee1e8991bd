"""The correctness gate's checks: each stage and the whole forward against the reference (the gate step that runs
them for a point is harness/gate.py).

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
through the public entry (harness/calls.py), so its figures include what a user's call pays.
"""

from __future__ import annotations

import dataclasses
import math
import time

import torch

from harness.calls import FORWARD_ARGS, forward_arguments, forward_kwargs, public_forward_call
from impls import tolerance as tolerances
from impls import validate
from impls.api import non_increasing_decay
from impls.inputs import Inputs
from impls.reference.compute_out import BLOCK_ELEMENTS
from impls.reference.same_precision import SamePrecisionReference
from impls.reference.sampled import INT32_LIMIT, sampled_reference
from impls.registry import get_backend
from impls.stages import FORWARD_STAGES, run_chain
from impls.tolerance import MAMBA_SSM_FACTOR, poisoned_allocations, rel_err, tolerance

STAGE_OUTPUTS = {**{stage.name: stage.outputs for stage in FORWARD_STAGES},
                 "forward": ("y", "final_states", "varlen_states")}


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
        out.update(run_chain(backend, kw, call))
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


def same_precision_outputs(backend, inputs: Inputs, dtype: torch.dtype, device=None) -> dict:
    """The chunked reference at `backend`'s own precision (impls/reference/same_precision.py), run once: its forward
    chains the stages on its own outputs as `run_stages` chains the backend's, and returns them all: stage -> {name:
    tensor}. What the gate's bound scales."""
    device = device or inputs.x.device
    same = SamePrecisionReference(same_precision_stages(backend, dtype, device))
    result = same.ssd_forward(**forward_arguments(inputs))
    return {stage: {name: getattr(result, name) for name in names} for stage, names in STAGE_OUTPUTS.items()}


def same_precision_stages(backend, dtype: torch.dtype, device) -> dict[str, str]:
    """The matmul precision `backend` reports for each stage with matmuls: what the same-precision computation
    rounds its operands to."""
    return {stage: backend.precision(stage, dtype, device) for stage in ("fwd_pass_state", "compute_out")}


def judged_by_same_precision(ref) -> bool:
    """Whether the gate can bound `ref`'s comparison by the same-precision computation: the full float64 reference
    (the fp32-chunked and sampled references are judged by the flat table, impls.tolerance.REL_TOL)."""
    return not hasattr(ref, "pick") and ref.y.dtype == torch.float64


def check(backend, inputs: Inputs, ref, dtype: torch.dtype, device=None,
          first_call: dict | None = None) -> dict[str, dict]:
    """Per stage: {"rel_err": max over its outputs (whole tensors), "block_err" and "block_where": the worst block
    over its outputs (impls.tolerance.block_ratios) and where, "tol": the whole-tensor bound of the output nearest
    its bound, "bound_ratio" and "bound_where": the worst block's error over its bound (≤ 1 passes), "bound": how
    the bound was set, "precision", "ok", "error"}; never raises for wrong numbers.
    Against the float64 reference each output's bound is impls.tolerance.judge's: SAME_PRECISION_K × the
    same-precision computation's error, block by block (`same_precision_outputs`, at the matmul precision the
    backend reports per stage). Against the fp32-chunked or sampled reference, the flat tolerance of the dtype (tf32's
    where the backend reports tf32 matmuls; the state dtype's where it is looser: impls.tolerance.tolerance)."""
    device = device or inputs.x.device
    resolve_tuning(backend, inputs, device, first_call)
    with poisoned_allocations():
        got = run_stages(backend, inputs, device, first_call)
    same = same_precision_outputs(backend, inputs, dtype, device) if judged_by_same_precision(ref) else None
    report = {}
    for stage, names in STAGE_OUTPUTS.items():
        if stage not in got:
            continue
        precision = backend.precision(stage, dtype, device)
        flat_tol = tolerance(dtype, precision == "tf32", None if stage == "chunk_cumsum" else inputs.state_dtype)
        judged = {}
        for name in names:
            expected = getattr(ref, name)
            actual = got[stage].get(name)
            if expected is None:
                continue
            if actual is None:
                judged[name] = None
                continue
            if hasattr(ref, "pick"):  # a sampled reference holds only part of each output
                actual = ref.pick(name, actual)
            judged[name] = _judge(name, actual, expected, same[stage][name] if same else None, flat_tol,
                                  inputs.chunk_size, ref)
        report[stage] = _stage_report(stage, judged, precision, same is not None)
    return report


def _judge(name: str, actual, expected, same, flat_tol: float, chunk_size: int, ref) -> tolerances.Judged:
    """One output judged: by the same-precision bound where `same` is given, else by the flat tolerance."""
    block, _ = tolerances.output_blocks(name, chunk_size)
    if same is not None:
        return tolerances.judge(actual, expected, same, block)
    err = rel_err(actual, expected)
    if expected.numel() == 0:
        none = tolerances.BlockErr(0.0, (), False)
        return tolerances.Judged(err, flat_tol, none, none)
    ratio, near_zero = tolerances.block_ratios(actual, expected, block)
    worst, binding = (_problem_chunks(name, tolerances.worst_block(r, near_zero), ref)
                      for r in (ratio, ratio / flat_tol))
    return tolerances.Judged(err, flat_tol, worst, binding)


def _problem_chunks(name: str, found: tolerances.BlockErr, ref) -> tolerances.BlockErr:
    """`found` with the problem's own chunk number where a sampled reference holds only some chunks."""
    if not hasattr(ref, "chunks") or name not in ("y", "states") or not found.where:
        return found
    where = list(found.where)
    where[1] = ref.chunks[where[1]]
    return dataclasses.replace(found, where=tuple(where))


def _stage_report(stage: str, judged: dict, precision: str, same_precision: bool) -> dict:
    """The report of one stage from its outputs' verdicts (None: the backend returned no such output)."""
    missing = [name for name, j in judged.items() if j is None]
    found = {name: j for name, j in judged.items() if j is not None}
    bound = (f"same-precision: {tolerances.SAME_PRECISION_K:g} x the chunked reference's error at {precision}"
             if same_precision else "flat: the dtype's tolerance")
    if not found and not missing:
        return {"rel_err": math.nan, "tol": math.nan, "precision": precision, "ok": False, "errors": {},
                "block_err": math.nan, "block_where": None, "bound_ratio": math.nan, "bound_where": None,
                "bound": bound, "error": f"{stage}: no output to check"}
    errs = {name: j.rel_err for name, j in found.items()} | {name: math.inf for name in missing}
    nearest = max(found, key=lambda n: _whole_ratio(found[n]), default=None)
    by_block = max(found, key=lambda n: found[n].block.ratio, default=None)
    binding = max(found, key=lambda n: found[n].binding.ratio, default=None)
    ok = not missing and all(j.ok for j in found.values())
    bad = {n: f"rel_err {j.rel_err:.3g} (bound {j.bound:.3g}), worst block {j.binding.ratio:.3g} of its bound at "
              f"{_where(n, j.binding)}" for n, j in found.items() if not j.ok}
    bad.update({n: "missing" for n in missing})
    return {"rel_err": max(errs.values()), "tol": found[nearest].bound if nearest else math.nan,
            "precision": precision, "ok": ok, "errors": errs,
            "block_err": found[by_block].block.ratio if by_block else math.inf,
            "block_where": f"{by_block}: {_where(by_block, found[by_block].block)}" if by_block else "missing",
            "bound_ratio": found[binding].binding.ratio if binding else math.inf,
            "bound_where": f"{binding}: {_where(binding, found[binding].binding)}" if binding else "missing",
            "bound": bound,
            "error": None if ok else f"{stage} over its bound ({bound}): {bad} (NaN/inf counts as inf)"}


def _whole_ratio(j: tolerances.Judged) -> float:
    return j.rel_err / j.bound if j.bound > 0 else math.inf


def _where(name: str, found: tolerances.BlockErr) -> str:
    _, dims = tolerances.output_blocks(name, 1)
    near = " (near-zero block: absolute bound)" if found.near_zero else ""
    return tolerances.describe_block(found.where, dims) + near


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
                "memory access at 2^20 tokens, results/2026-12-03-h200-long-profile-decay/README.md; "
                "state-spaces/mamba#686)")
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
