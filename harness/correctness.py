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
import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from harness.calls import FORWARD_ARGS, forward_arguments, forward_kwargs
from impls import tolerance as tolerances
from impls import validate
from impls.api import needs_non_negative_dt, non_increasing_decay
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


def gradient_reference_bytes(inputs: Inputs, itemsize: int = 8) -> int:
    """What the float64 autograd graph of the chunked reference keeps for one batch row (the gradient gate runs the
    rows one at a time; packed sequences whole): per token and head about 5·headdim + 4·dstate + 4·chunk +
    2·headdim·dstate/chunk elements (the saved tensors, measured on the CPU over headdim 32–128, dstate 64–256,
    chunk 64–256: tests/harness/test_harness.py), twice that with the backward's own buffers beside it."""
    b, L, h, p = inputs.x.shape
    n, q = inputs.B.shape[-1], inputs.chunk_size
    tokens = L if b > 1 and inputs.cu_seqlens is None else b * L
    return 2 * itemsize * tokens * h * (5 * p + 4 * n + 4 * q + 2 * p * n // q + 16)


def gradient_reference_kind(inputs: Inputs, device: torch.device, requested: str) -> str:
    """The gradient gate's ground truth: `requested`, or with "auto" float64 autograd where its graph
    (`gradient_reference_bytes`) and the forward's float64 working set fit in half of the free device memory, else
    the streamed one ("sampled": harness/gradient_gate.py check_streamed). S2's float64 graph (about 81 GB kept)
    exceeds an H100."""
    if requested != "auto":
        return reference_kind(inputs, device, requested)
    if device.type != "cuda":
        return "float64"
    free, _ = torch.cuda.mem_get_info(device)
    fits = gradient_reference_bytes(inputs) + reference_bytes(inputs, 8) < 0.5 * free
    return "float64" if fits else "sampled"


def reference_forward(inputs: Inputs, kind: str):
    """The reference's ForwardResult (with its intermediates) in float64 or fp32, or a SampledReference."""
    if kind == "sampled":
        return sampled_reference(**forward_kwargs(inputs))
    dtype = torch.float64 if kind == "float64" else torch.float32
    kwargs = forward_kwargs(inputs.to(dtype=dtype))
    kwargs["state_dtype"] = dtype
    return get_backend("reference").ssd_forward(**{k: kwargs[k] for k in FORWARD_ARGS})


def _ssd():
    """The SSD's workload declaration (harness/workloads/ssd.py), what the SSD's own entries here run."""
    from harness.workloads import get

    return get("ssd")


def run_stages(backend, inputs, device=None, first_call: dict | None = None, workload=None) -> dict:
    """The workload's stages (default: the SSD's) chained on the backend's own outputs, then its whole forward:
    stage -> {name: tensor}. With `first_call`, each call's wall time (synchronised) is stored there: the first
    call of a stage pays its compilation and autotuning."""
    workload = workload or _ssd()
    kw = workload.arguments(inputs)
    timed = {} if first_call is None else first_call
    device = torch.device(device) if device is not None else _device_of(kw)

    def call(stage, fn):
        t0 = time.perf_counter()
        result = fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        timed.setdefault(stage, time.perf_counter() - t0)
        return result

    out = {}
    if workload.chained(backend):  # a forward-only peer (fla) has no stage split to chain
        out.update(run_chain(backend, kw, call, workload.stages))
    values = call("forward", functools.partial(workload.forward.call, backend, kw, {}))
    out["forward"] = dict(zip(workload.forward.outputs, values))
    return out


def _device_of(kw: dict) -> torch.device:
    """The device of the first tensor among the arguments (the CPU where there is none)."""
    return next((v.device for v in kw.values() if isinstance(v, torch.Tensor)), torch.device("cpu"))


def resolve_tuning(backend, inputs, device=None, first_call: dict | None = None, workload=None) -> None:
    """For a backend that resolves configs on its first call (`Backend.TUNED`: a search, a record read, an
    autotuner), one pass over its stages and forward with plain allocations, before the gate poisons them: a
    search then times its candidates as a plain call runs, and the first call's time (compilation and tuning) is
    measured here. Nothing for untuned backends."""
    if backend.TUNED:
        run_stages(backend, inputs, device, first_call, workload)


def same_precision_outputs(backend, inputs: Inputs, dtype: torch.dtype, device=None) -> dict:
    """The chunked reference at `backend`'s own precision (impls/reference/same_precision.py), run once: its forward
    chains the stages on its own outputs as `run_stages` chains the backend's, and returns them all: stage -> {name:
    tensor}. What the gate's bound scales."""
    device = device or inputs.x.device
    same = SamePrecisionReference(same_precision_stages(backend, dtype, device))
    result = same.ssd_forward(**forward_arguments(inputs))
    return {stage: {name: getattr(result, name, None) for name in names} for stage, names in STAGE_OUTPUTS.items()}


def same_precision_stages(backend, dtype: torch.dtype, device) -> dict[str, str]:
    """The matmul precision `backend` reports for each stage with matmuls: what the same-precision computation
    rounds its operands to."""
    return {stage: backend.precision(stage, dtype, device) for stage in ("fwd_pass_state", "compute_out")}


def judged_by_same_precision(ref) -> bool:
    """Whether the gate can bound `ref`'s comparison by the same-precision computation: the full float64 reference
    (the fp32-chunked and sampled references are judged by the flat table, impls.tolerance.REL_TOL)."""
    return not hasattr(ref, "pick") and ref.y.dtype == torch.float64


# --- the ground truth a workload's gate judges against ---------------------------------------------------------
class Truth(Protocol):
    """A point's ground truth for the forward gate: its kind (the rows' `reference`), whether it holds an output,
    how one output of a stage is judged against it, the names of an output's block dimensions, and per stage how
    the bound was set and the matmul precision it follows."""

    kind: str

    def holds(self, name: str) -> bool: ...

    def judge(self, stage: str, name: str, actual: torch.Tensor) -> tolerances.Judged: ...

    def dims(self, name: str) -> tuple[str, ...]: ...

    def bound(self, stage: str) -> str: ...

    def precision(self, stage: str) -> str: ...


def flat_judge(actual, expected, tol: float, block: tuple[int | None, ...]) -> tolerances.Judged:
    """One output against a flat tolerance `tol`, whole and block by block (impls.tolerance.block_ratios)."""
    err = rel_err(actual, expected)
    if expected.numel() == 0:
        none = tolerances.BlockErr(0.0, (), False)
        return tolerances.Judged(err, tol, none, none)
    ratio, near_zero = tolerances.block_ratios(actual, expected, block)
    return tolerances.Judged(err, tol, tolerances.worst_block(ratio, near_zero),
                             tolerances.worst_block(ratio / tol, near_zero))


@dataclass(frozen=True)
class FlatTruth:
    """Ground-truth outputs (float64) judged by a flat tolerance per stage (the dtype's, impls.tolerance), whole and
    per block of the workload's `outputs`: the gate of a workload without a same-precision computation."""

    kind: str
    expected: dict[str, torch.Tensor | None]
    tolerances: dict[str, float]  # stage -> tolerance
    precisions: dict[str, str]  # stage -> matmul precision
    workload: Any  # its blocks per output
    chunk_size: int
    # the part of an actual output the truth covers (e.g. a causal prefix of the batch's first row), else the whole
    select: Callable[[str, torch.Tensor], torch.Tensor] | None = None
    scope: str = ""  # what of the outputs the truth covers, said in the bound ("" : all of them)

    def holds(self, name: str) -> bool:
        return self.expected.get(name) is not None

    def judge(self, stage: str, name: str, actual) -> tolerances.Judged:
        expected = self.expected[name]
        block, _ = self.workload.blocks(name, self.chunk_size, expected.dim())
        if self.select is not None and actual is not None:
            actual = self.select(name, actual)
        return flat_judge(actual, expected, self.tolerances[stage], block)

    def dims(self, name: str) -> tuple[str, ...]:
        expected = self.expected[name]
        return self.workload.blocks(name, self.chunk_size, expected.dim())[1]

    def bound(self, stage: str) -> str:
        return f"flat: the dtype's tolerance ({self.tolerances[stage]:g})" + (f", {self.scope}" if self.scope else "")

    def precision(self, stage: str) -> str:
        return self.precisions.get(stage, "none")


class SsdTruth:
    """The SSD's ground truth: the reference's ForwardResult (float64, fp32-chunked) or a SampledReference. Against
    the float64 reference each output is bounded by SAME_PRECISION_K × the same-precision computation's error,
    block by block (computed once, on the first output judged); against the others by the flat tolerance of the
    dtype (tf32's where the backend reports tf32 matmuls; the state dtype's where it is looser)."""

    def __init__(self, kind: str, ref, backend, inputs: Inputs, dtype: torch.dtype, device=None):
        self.kind, self.ref, self.backend, self.inputs, self.dtype = kind, ref, backend, inputs, dtype
        self.device = device or inputs.x.device
        self.same_precision = judged_by_same_precision(ref)
        self._same: dict | None = None

    def holds(self, name: str) -> bool:
        return getattr(self.ref, name, None) is not None

    def precision(self, stage: str) -> str:
        return self.backend.precision(stage, self.dtype, self.device)

    def bound(self, stage: str) -> str:
        if self.same_precision:
            return (f"same-precision: {tolerances.SAME_PRECISION_K:g} x the chunked reference's error at "
                    f"{self.precision(stage)}")
        return "flat: the dtype's tolerance"

    def dims(self, name: str) -> tuple[str, ...]:
        return tolerances.output_blocks(name, 1)[1]

    def judge(self, stage: str, name: str, actual) -> tolerances.Judged:
        expected = getattr(self.ref, name)
        if hasattr(self.ref, "pick"):  # a sampled reference holds only part of each output
            actual = self.ref.pick(name, actual)
        block, _ = tolerances.output_blocks(name, self.inputs.chunk_size)
        if self.same_precision:
            if self._same is None:
                self._same = same_precision_outputs(self.backend, self.inputs, self.dtype, self.device)
            return tolerances.judge(actual, expected, self._same[stage][name], block)
        flat_tol = tolerance(self.dtype, self.precision(stage) == "tf32",
                             None if stage == "chunk_cumsum" else self.inputs.state_dtype)
        judged = flat_judge(actual, expected, flat_tol, block)
        return dataclasses.replace(judged, block=_problem_chunks(name, judged.block, self.ref),
                                   binding=_problem_chunks(name, judged.binding, self.ref))


def check_stages(workload, backend, inputs, truth: Truth, device=None,
                 first_call: dict | None = None) -> dict[str, dict]:
    """Per stage of `workload` and its whole forward: {"rel_err": max over its outputs (whole tensors),
    "block_err" and "block_where": the worst block over its outputs (impls.tolerance.block_ratios) and where,
    "tol": the whole-tensor bound of the output nearest its bound, "bound_ratio" and "bound_where": the worst
    block's error over its bound (≤ 1 passes), "bound": how the bound was set, "precision", "ok", "error"}; never
    raises for wrong numbers. The backend's stages run chained on its own outputs under poisoned allocations, after
    one plain pass where it resolves tuning; each output the truth holds is judged by it."""
    resolve_tuning(backend, inputs, device, first_call, workload)
    with poisoned_allocations():
        got = run_stages(backend, inputs, device, first_call, workload)
    report = {}
    for stage in (*workload.stages, workload.forward):
        if stage.name not in got:
            continue
        judged = {}
        for name in stage.outputs:
            if not truth.holds(name):
                continue
            actual = got[stage.name].get(name)
            judged[name] = None if actual is None else truth.judge(stage.name, name, actual)
        report[stage.name] = _stage_report(stage.name, judged, truth.precision(stage.name), truth.bound(stage.name),
                                           truth.dims)
    return report


def check(backend, inputs: Inputs, ref, dtype: torch.dtype, device=None,
          first_call: dict | None = None) -> dict[str, dict]:
    """The SSD's gate (`check_stages` against `SsdTruth`): per stage the report of `check_stages`. Against the
    float64 reference each output's bound is impls.tolerance.judge's: SAME_PRECISION_K × the same-precision
    computation's error, block by block (`same_precision_outputs`, at the matmul precision the backend reports per
    stage). Against the fp32-chunked or sampled reference, the flat tolerance of the dtype (tf32's where the backend
    reports tf32 matmuls; the state dtype's where it is looser: impls.tolerance.tolerance)."""
    truth = SsdTruth(getattr(ref, "kind", "given"), ref, backend, inputs, dtype, device)
    return check_stages(_ssd(), backend, inputs, truth, device or inputs.x.device, first_call)


def _problem_chunks(name: str, found: tolerances.BlockErr, ref) -> tolerances.BlockErr:
    """`found` with the problem's own chunk number where a sampled reference holds only some chunks."""
    if not hasattr(ref, "chunks") or name not in ("y", "states") or not found.where:
        return found
    where = list(found.where)
    where[1] = ref.chunks[where[1]]
    return dataclasses.replace(found, where=tuple(where))


def _stage_report(stage: str, judged: dict, precision: str, bound: str, dims) -> dict:
    """The report of one stage from its outputs' verdicts (None: the backend returned no such output)."""
    missing = [name for name, j in judged.items() if j is None]
    found = {name: j for name, j in judged.items() if j is not None}
    if not found and not missing:
        return {"rel_err": math.nan, "tol": math.nan, "precision": precision, "ok": False, "errors": {},
                "block_err": math.nan, "block_where": None, "bound_ratio": math.nan, "bound_where": None,
                "bound": bound, "error": f"{stage}: no output to check"}
    errs = {name: j.rel_err for name, j in found.items()} | {name: math.inf for name in missing}
    nearest = max(found, key=lambda n: _whole_ratio(found[n]), default=None)
    by_block = max(found, key=lambda n: found[n].block.ratio, default=None)
    binding = max(found, key=lambda n: found[n].binding.ratio, default=None)
    ok = not missing and all(j.ok for j in found.values())

    def where(name, block):
        near = " (near-zero block: absolute bound)" if block.near_zero else ""
        return tolerances.describe_block(block.where, dims(name)) + near

    bad = {n: f"rel_err {j.rel_err:.3g} (bound {j.bound:.3g}), worst block {j.binding.ratio:.3g} of its bound at "
              f"{where(n, j.binding)}" for n, j in found.items() if not j.ok}
    bad.update({n: "missing" for n in missing})
    return {"rel_err": max(errs.values()), "tol": found[nearest].bound if nearest else math.nan,
            "precision": precision, "ok": ok, "errors": errs,
            "block_err": found[by_block].block.ratio if by_block else math.inf,
            "block_where": f"{by_block}: {where(by_block, found[by_block].block)}" if by_block else "missing",
            "bound_ratio": found[binding].binding.ratio if binding else math.inf,
            "bound_where": f"{binding}: {where(binding, found[binding].binding)}" if binding else "missing",
            "bound": bound,
            "error": None if ok else f"{stage} over its bound ({bound}): {bad} (NaN/inf counts as inf)"}


def _whole_ratio(j: tolerances.Judged) -> float:
    return j.rel_err / j.bound if j.bound > 0 else math.inf


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
    dt >= 0 after processing; dt >= 0 alone for the exponent fold, switch exp_fold, and the backward's factored
    decays, switch bwd_decay_factor). Raises ValueError naming the argument."""
    why = non_increasing_decay(backend)
    if why:
        validate.decay_factor_inputs(inputs.A, inputs.dt, inputs.dt_bias, inputs.dt_softplus, inputs.dt_limit, why)
    needs = needs_non_negative_dt(backend)
    if needs:
        validate.non_negative_dt(inputs.dt, inputs.dt_bias, inputs.dt_softplus, inputs.dt_limit, needs)
