"""The gradient gate: every gradient of `impls.ssd` against float64 autograd through the chunked reference, bounded
block by block by what the same computation at the backend's own precision achieves (impls/README.md, "The
backward"; the forward's gate is harness/correctness.py).

Gradients flow from a random, everywhere non-zero dy (and d final_states, d varlen_states); the backend's are
computed under poisoned allocations, so an unwritten gradient shows as NaN. Blocks: dx, dz per (batch, chunk,
head); ddt per (batch, chunk, head); dB, dC per (batch, chunk, group); dA, dD, ddt_bias whole and per head;
dinitial_states per (sequence, head).

Where the float64 graph of the whole problem does not fit (the gate's reference is not "float64": the 2^20-token
problem), the ground truth is streamed piece by piece (impls/reference/sampled_backward.py: dx and dz on the sampled
chunks, the rest whole) and each block is held to the dtype's flat tolerance (impls.tolerance.tolerance), as the
forward's gate holds its sampled reference: no same-precision computation of that size fits either."""

from __future__ import annotations

import dataclasses
import math

import torch

from harness.calls import forward_arguments, forward_kwargs
from harness.correctness import flat_judge, same_precision_stages
from impls import tolerance as tolerances
from impls.api import GRAD_INPUTS
from impls.autograd import ssd
from impls.inputs import Inputs
from impls.reference.backend import ReferenceBackend
from impls.reference.decay_terms import DecayTerms
from impls.reference.same_precision import SamePrecisionReference
from impls.reference.sampled import sampled_chunks
from impls.reference.sampled_backward import SAMPLED_ONLY, sampled_gradients
from impls.registry import get_backend
from impls.tolerance import poisoned_allocations

GRADIENTS = tuple(f"d{name}" for name in GRAD_INPUTS)


def gradient_blocks(name: str, chunk_size: int, ndim: int) -> tuple[tuple[int | None, ...], tuple[str, ...]]:
    """The blocks a gradient is judged by and the names of the block index's dimensions."""
    if name in ("dx", "dz"):
        return (1, chunk_size, 1, None), ("batch", "chunk", "head", "")
    if name == "ddt":
        return (1, chunk_size, 1), ("batch", "chunk", "head")
    if name in ("dB", "dC"):
        return (1, chunk_size, 1, None), ("batch", "chunk", "group", "")
    if name in ("dA", "ddt_bias") or (name == "dD" and ndim == 1):
        return (1,), ("head",)
    if name == "dD":
        return (1, None), ("head", "")
    if name == "dinitial_states":
        return (1, 1, None, None), ("sequence", "head", "", "")
    raise ValueError(f"gradient: expected one of {GRADIENTS}, got {name!r}")


def output_gradients(inputs: Inputs, seed: int = 0, on_device: bool = False) -> dict[str, torch.Tensor]:
    """Random, everywhere non-zero gradients flowing into y, the final states and (with cu_seqlens) the
    per-sequence states, rounded to the dtype each output has (y: the inputs'; states: state_dtype, else the
    inputs'), in float64 on the inputs' device; with `on_device`, drawn there in the inputs' dtype (the 2^20-token
    problem's dy would be 43 GB in float64; another stream, the same law)."""
    b, length, h, p = inputs.x.shape
    n = inputs.B.shape[-1]
    shapes = {"y": (b, length, h, p), "final_states": (b, h, p, n)}
    if inputs.cu_seqlens is not None:
        shapes["varlen_states"] = (inputs.cu_seqlens.shape[0] - 1, h, p, n)
    device, dtype = (inputs.x.device, inputs.x.dtype) if on_device else (torch.device("cpu"), torch.float64)
    gen = torch.Generator(device=device).manual_seed(10_000 + seed)
    received = {"y": inputs.x.dtype, "final_states": inputs.state_dtype or inputs.x.dtype}
    received["varlen_states"] = received["final_states"]
    grads = {}
    for name, shape in shapes.items():
        g = torch.randn(*shape, generator=gen, dtype=dtype, device=device)
        g = g + torch.where(g >= 0, 0.05, -0.05).to(dtype)  # never zero
        # in the dtype the output has (impls.ssd_forward's contract): what autograd hands a backend, and so what
        # the truth and the same-precision computation are given too
        grads[name] = g.to(received[name]).to(dtype).to(inputs.x.device)
    return grads


def leaves_of(kw: dict) -> dict[str, torch.Tensor]:
    """The differentiable inputs of `kw` (impls.api.GRAD_INPUTS present), detached and requiring grad."""
    return {name: kw[name].detach().requires_grad_() for name in GRAD_INPUTS if kw.get(name) is not None}


def outputs_of(result) -> dict[str, torch.Tensor | None]:
    """The outputs of a ForwardResult that gradients flow into, by name."""
    return {name: getattr(result, name) for name in ("y", "final_states", "varlen_states")}


def incoming(out: dict, grads_in: dict) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The outputs of `out` (by name) that gradients flow into, and those gradients in their dtypes."""
    pairs = [(out[name], g) for name, g in grads_in.items() if out.get(name) is not None]
    return [o for o, _ in pairs], [g.to(o.dtype) for o, g in pairs]


def autograd_gradients(outputs: dict, leaves: dict, grads_in: dict) -> dict[str, torch.Tensor | None]:
    """{d<leaf>: gradient} of `outputs` (by name, computed from `leaves`) with `grads_in` flowing in."""
    flowing, grads = incoming(outputs, grads_in)
    found = torch.autograd.grad(flowing, list(leaves.values()), grads, allow_unused=True)
    return {f"d{name}": g for name, g in zip(leaves, found)}


def _gradients(run, kw: dict, grads_in: dict) -> dict[str, torch.Tensor | None]:
    """{d<input>: gradient} of `run(**kw)` (a function returning a ForwardResult) from `grads_in`."""
    leaves = leaves_of(kw)
    return autograd_gradients(outputs_of(run(**{**kw, **leaves})), leaves, grads_in)


# The inputs with a batch dimension first (initial_states only with one state per batch row); the others (A, D,
# dt_bias) are shared by the rows, and their gradients are the sum of the rows'.
ROW_INPUTS = ("x", "dt", "B", "C", "z", "initial_states", "seq_idx")


def _row_by_row(run, kw: dict, grads_in: dict) -> dict[str, torch.Tensor | None]:
    """`_gradients` one batch row at a time, for the references: the batch rows of the chunked reference are
    independent computations, so the same gradients come out of a graph a batch's size smaller (the float64 graph of
    S3 whole passes an H100's 80 GB). Packed sequences in one row (cu_seqlens) are run whole."""
    batch = kw["x"].shape[0]
    if batch == 1 or kw.get("cu_seqlens") is not None:
        return _gradients(run, kw, grads_in)
    rows = [_gradients(run, {**kw, **{k: kw[k][r:r + 1] for k in ROW_INPUTS if kw.get(k) is not None}},
                       {k: g[r:r + 1] for k, g in grads_in.items()}) for r in range(batch)]
    out = {}
    for name in rows[0]:
        parts = [row[name] for row in rows]
        if parts[0] is None:
            out[name] = None
        elif name[1:] in ROW_INPUTS:
            out[name] = torch.cat(parts)
        else:
            out[name] = torch.stack(parts).sum(0)
    return out


@dataclasses.dataclass(frozen=True)
class Truth:
    """Gradients by name (d<input>) and the terms of the gradients that are sums (`SUMS`), of one computation."""

    grads: dict[str, torch.Tensor | None]
    terms: dict[str, torch.Tensor]


def skip_terms(kw: dict, grads_in: dict) -> torch.Tensor | None:
    """dD's terms as the floor reads them, float64: at every position and channel the gradient of ŷ (dy, times z·σ(z)
    with z) times x, formed as the references' epilogue forms it (in float64 for float64 inputs, else in fp32 from
    the inputs as given), kept as their root sum of squares over batch and time, (1, 1, nheads, headdim) for D per
    channel, over headdim too, (1, 1, nheads), for D per head: the norm is all that `sum_floor` takes of them (their
    own rounding, one product's, stays below the roundoff floor), and the whole terms would be x-sized float64 tensors
    (1.3 GB at S1), formed here one batch row at a time. None without D."""
    if kw.get("D") is None:
        return None
    x, z = kw["x"], kw.get("z")
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    dy = grads_in["y"].to(device=x.device, dtype=x.dtype)  # dy as the backend receives it
    squares = 0
    for r in range(x.shape[0]):
        dyh = dy[r].to(work)
        if z is not None:
            zr = z[r].to(work)
            dyh = dyh * (zr * torch.sigmoid(zr))
        squares = squares + (dyh * x[r].to(work)).to(torch.float64).square().sum(dim=0)
    squares = squares if kw["D"].dim() == 2 else squares.sum(dim=-1)
    return squares.sqrt()[None, None]


def _with_terms(backend, run, kw: dict, grads_in: dict) -> Truth:
    """`_row_by_row(run, ...)`, `run` calling `backend` (a reference-stage instance of its own), dA's and dD's terms
    kept."""
    decay = DecayTerms(backend)
    grads = _row_by_row(run, kw, grads_in)
    found = {"dA": decay.terms(), "dD": skip_terms(kw, grads_in)}
    return Truth(grads, {name: t for name, t in found.items() if t is not None})


def ground_truth(inputs: Inputs, grads_in: dict) -> Truth:
    """The ground truth: float64 autograd through the chunked reference (a batch row at a time), dA's terms kept."""
    kw = forward_arguments(inputs.to(dtype=torch.float64))
    kw["state_dtype"] = torch.float64
    reference = ReferenceBackend()
    return _with_terms(reference, lambda **a: ssd(**a, backend=reference), kw, grads_in)


def reference_gradients(inputs: Inputs, grads_in: dict) -> dict[str, torch.Tensor]:
    """The ground truth's gradients (`ground_truth`)."""
    return ground_truth(inputs, grads_in).grads


def same_precision_gradients(backend, inputs: Inputs, grads_in: dict, dtype: torch.dtype, device) -> Truth:
    """Autograd through the chunked reference at the backend's own precision (impls/reference/same_precision.py),
    in the inputs' dtype (a batch row at a time): what a correct backward of that precision achieves."""
    same = SamePrecisionReference(same_precision_stages(backend, dtype, device))
    return _with_terms(same, same.ssd_forward, forward_arguments(inputs), grads_in)


def backend_gradients(backend, inputs: Inputs, grads_in: dict) -> dict[str, torch.Tensor | None]:
    """The backend's gradients through `impls.ssd`, every tensor it allocates poisoned first."""
    kw = forward_arguments(inputs)
    with poisoned_allocations():
        return _gradients(lambda **a: ssd(**a, backend=backend), kw, grads_in)


# A gradient that is a sum of terms over some dimensions: ddt_bias of a head is the sum of ddt (the gradient of the
# raw dt) over batch and time; dA of a head the sum over batch and time of dt · ∂L/∂(dt·A) (`DecayTerms`); dD of a
# head or channel the sum over batch and time (and headdim, D per head) of dŷ ⊙ x (`skip_terms`). Each term
# carries an error, so the sum's error has the size of the terms' norm times a relative error, however much the terms
# cancel: a head whose sum nearly cancels cannot be held to less. The relative error is the largest of the
# same-precision terms' own (whole tensor), the same-precision sums' errors over their terms' norms, root mean
# square over the heads (one head's draw of that computation's error can be near zero by chance where another
# computation's is not, impls/README.md, "The gate's bound"), and the unit roundoff of the accumulation (fp32; float64
# for float64 inputs): an accumulation in another order rounds partial sums of the terms' size, and dD's terms, a
# single product each, carry hardly more than their own rounding. SUMS: the sums whose terms are another gradient
# (the streamed gate has those only).
SUMS = {"ddt_bias": ("ddt", (0, 1))}
TERMS = {"dA": (0, 2, 3), "dD": (0, 1)}  # the sums whose terms the references keep (Truth.terms), the dimensions summed


def _terms(name: str, computed: Truth) -> tuple[torch.Tensor | None, tuple[int, ...]]:
    if name in SUMS:
        terms, dims = SUMS[name]
        return computed.grads.get(terms), dims
    return computed.terms.get(name), TERMS.get(name, ())


def sum_floor(name: str, truth: Truth, same: Truth) -> torch.Tensor | None:
    """Per element (head; head and channel for dD per channel) of a summed gradient: the terms' norm × the
    same-precision computation's relative error (of its terms, or of its sums over their terms' norms, root mean
    square over the elements, at least the accumulation's unit roundoff: the largest); None for a gradient that is no
    sum."""
    (exact, dims), (rounded, _) = _terms(name, truth), _terms(name, same)
    if exact is None or rounded is None:
        return None
    norm = exact.to(torch.float64).square().sum(dim=dims).sqrt()
    sums_err = (same.grads[name].to(torch.float64) - truth.grads[name].to(torch.float64)).abs() / norm.clamp(
        min=torch.finfo(torch.float64).tiny)
    return max(tolerances.rel_err(rounded, exact), sums_err.square().mean().sqrt().item(),
               roundoff(same.grads[name].dtype)) * norm


def roundoff(dtype: torch.dtype) -> float:
    """The unit roundoff of the accumulation a gradient of `dtype` comes from: float64's for float64, else fp32's
    (every backend accumulates in fp32; a narrower gradient's own rounding shows in the same-precision error)."""
    return torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps / 2


def block_floor(floor: torch.Tensor | None, block: tuple[int | None, ...]) -> torch.Tensor | None:
    """`sum_floor`'s per-element floor as one per block of `block`'s extents (what `tolerances.judge` takes): the
    L2 norm of the block's elements' floors (dD per channel, judged per head; the others' blocks are elements)."""
    if floor is None:
        return None
    return tolerances._block_sums(floor.square(), block).sqrt()


def check_gradients(backend, inputs: Inputs, dtype: torch.dtype, device=None, seed: int = 0,
                    truth: Truth | None = None, reference: str = "float64") -> dict[str, dict]:
    """Per gradient: {"rel_err", "bound", "block_err", "bound_ratio", "where", "ok", "how", "precision"}; never
    raises for wrong numbers. Each is judged by impls.tolerance.judge against the float64 ground truth (`truth`,
    computed here unless given), bounded by the same-precision computation's gradients; with a `reference` kind
    other than "float64" (harness.correctness.gradient_reference_kind), by the flat tolerance against the streamed
    ground truth (`check_streamed`)."""
    device = device or inputs.x.device
    backend = get_backend(backend) if isinstance(backend, str) else backend
    if reference != "float64":
        return check_streamed(backend, inputs, dtype, seed)
    grads_in = output_gradients(inputs, seed)
    truth = truth if truth is not None else ground_truth(inputs, grads_in)
    same = same_precision_gradients(backend, inputs, grads_in, dtype, device)
    got = backend_gradients(backend, inputs, grads_in)
    precision = backend.precision("compute_out", dtype, device)
    how = (f"same-precision: {tolerances.SAME_PRECISION_K:g} x autograd through the chunked reference at {precision}, "
           f"dy in its output's dtype, sums floored by their terms ({', '.join((*SUMS, *TERMS))})")
    report = {}
    for name, expected in truth.grads.items():
        if expected is None:
            continue
        block, dims = gradient_blocks(name, inputs.chunk_size, expected.dim())
        actual = got.get(name)
        # at least the accumulation's unit roundoff: a gradient of a few elements (seqlen 1: one per block) can get
        # a same-precision error far below one rounding by chance, which a correct backward cannot match
        least = max(tolerances.BOUND_FLOOR, roundoff(same.grads[name].dtype))
        judged = None if actual is None else tolerances.judge(actual, expected, same.grads[name], block,
                                                                floor=block_floor(sum_floor(name, truth, same), block),
                                                                least=least)
        report[name] = _entry(judged, dims, how, precision)
    return report


def check_streamed(backend, inputs: Inputs, dtype: torch.dtype, seed: int = 0, group: int = 16) -> dict[str, dict]:
    """`check_gradients` where the float64 graph of the whole problem does not fit: the backend's gradients first
    (poisoned), then the float64 ones streamed piece by piece on the sampled chunks (module docstring); each block
    held to the dtype's flat tolerance (the state dtype's where looser, tf32's where the backend reports tf32)."""
    grads_in = output_gradients(inputs, seed, on_device=True)
    got = backend_gradients(backend, inputs, grads_in)
    b, length, h, p = inputs.x.shape
    chunks = sampled_chunks(b, length, h, p, inputs.B.shape[-1], inputs.chunk_size)
    truth = sampled_gradients(**forward_kwargs(inputs), dy=grads_in["y"], dfinal_states=grads_in["final_states"],
                              chunks=chunks, group=group)
    precision = backend.precision("compute_out", dtype, inputs.x.device)
    tol = tolerances.tolerance(dtype, precision == "tf32", inputs.state_dtype)
    how = f"flat: {tol:g} per block against float64 gradients streamed on sampled chunks"
    report = {}
    for name, expected in truth.grads.items():
        actual = got.get(name)
        block, dims = gradient_blocks(name, inputs.chunk_size, expected.dim())
        judged = None if actual is None else _streamed_judge(name, truth.pick(name, actual), expected, tol, block,
                                                             truth)
        report[name] = _entry(judged, dims, how, precision)
    return report


def _streamed_judge(name: str, actual, expected, tol: float, block, truth) -> tolerances.Judged:
    """One gradient against the streamed truth, each block within `tol` (a summed gradient's block within tol × the
    norm of its terms, as `sum_floor` allows); chunks numbered as in the problem."""
    err = tolerances.rel_err(actual, expected)
    ratio, near_zero = tolerances.block_ratios(actual, expected, block)
    bound = ratio / tol
    norm = None
    if name in SUMS and SUMS[name][0] in truth.grads:
        terms, over = SUMS[name]
        norm = truth.grads[terms].square().sum(dim=over).sqrt()
    elif name in truth.terms_norm:
        norm = truth.terms_norm[name]
    if norm is not None:
        allowed = torch.maximum(expected.abs(), norm)
        diff = (actual.to(torch.float64) - expected).abs()
        bound = torch.where(torch.isfinite(diff), diff / (tol * allowed), math.inf)
    worst, binding = tolerances.worst_block(ratio, near_zero), tolerances.worst_block(bound, near_zero)
    if name in SAMPLED_ONLY:
        worst, binding = (dataclasses.replace(w, where=(w.where[0], truth.chunks[w.where[1]], *w.where[2:]))
                          if w.where else w for w in (worst, binding))
    return tolerances.Judged(err, tol, worst, binding)


def _entry(judged: tolerances.Judged | None, dims: tuple[str, ...], how: str, precision: str) -> dict:
    """One gradient's verdict (None: the backend gave no such gradient)."""
    if judged is None:
        return {"rel_err": math.inf, "bound": math.nan, "block_err": math.inf, "bound_ratio": math.inf,
                "where": "missing", "ok": False, "how": how, "precision": precision}
    return {"rel_err": judged.rel_err, "bound": judged.bound, "block_err": judged.block.ratio,
            "bound_ratio": judged.binding.ratio, "where": tolerances.describe_block(judged.binding.where, dims),
            "ok": judged.ok, "how": how, "precision": precision}


def flat_check(plan) -> dict[str, dict]:
    """The gradient gate of a workload without one of its own (`Backward.check`): the backend's gradients through
    the workload's differentiable forward (allocations poisoned) against float64 autograd of its reference, each
    within the flat tolerance (`Backward.tolerance`, else the dtype's) whole and per block of the workload's
    outputs. Per gradient the entry of `check_gradients`."""
    workload, point = plan.workload, plan.point
    backward = workload.backward
    kw = workload.arguments(plan.inputs)
    grads_in = backward.incoming(plan.inputs, point.seed)
    truth = backward.reference(plan.inputs, grads_in)
    leaves = backward.leaves(kw)
    with poisoned_allocations():
        got = autograd_gradients(backward.call(plan.backend, kw, leaves), leaves, grads_in)
    tol = backward.tolerance(plan) if backward.tolerance is not None else tolerances.tolerance(plan.dtype)
    precision = plan.precision.get("forward", "none")
    how = f"flat: the dtype's tolerance ({tol:g})"
    report = {}
    for name, expected in truth.items():
        if expected is None:
            continue
        block, dims = workload.blocks(name, point.problem.shape.chunk_size, expected.dim())
        actual = got.get(name)
        report[name] = _entry(None if actual is None else flat_judge(actual, expected, tol, block), dims, how,
                              precision)
    return report


def gate(plan) -> dict[str, dict]:
    """The gradient gate of a plan's workload (its own check, else `flat_check`) as stage reports."""
    backward = plan.workload.backward
    return stage_reports((backward.check or flat_check)(plan))


def stage_reports(report: dict[str, dict]) -> dict[str, dict]:
    """A gradient gate's report as the forward gate's stage reports (harness/gate.py): stage "grad:<name>"."""
    out = {}
    for name, r in report.items():
        out[f"grad:{name}"] = {
            "rel_err": r["rel_err"], "tol": r["bound"], "precision": r["precision"], "ok": r["ok"], "errors": {},
            "block_err": r["block_err"], "block_where": f"{name}: {r['where']}", "bound_ratio": r["bound_ratio"],
            "bound_where": f"{name}: {r['where']}", "bound": r["how"],
            "error": None if r["ok"] else (f"{name}: rel_err {r['rel_err']:.3g} (bound {r['bound']:.3g}), worst "
                                           f"block {r['bound_ratio']:.3g} of its bound at {r['where']}"),
        }
    return out
