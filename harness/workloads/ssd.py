"""The SSD workload: Mamba-2's SSD of impls/ (impls/README.md), its chain the three stages of impls/stages.py and its
whole forward the public entry `impls.ssd_forward`, its inputs impls/inputs.py's, its ground truth the chunked
reference (float64, fp32-chunked or sampled: harness/correctness.py), its backward `impls.ssd` through the
gradient gate of harness/gradient_gate.py, its cost harness/cost_model.py."""

from __future__ import annotations

from harness import correctness, cost_model, gradient_gate
from harness.calls import FORWARD_ARGS, forward_kwargs, public_forward
from harness.workloads import DIRECTIONS, Backward, Workload, register
from impls.autograd import ssd
from impls.inputs import make_inputs
from impls.stages import FORWARD_STAGES, Stage
from impls.tolerance import output_blocks


def _public_forward(backend, kw: dict, got: dict) -> tuple:
    out = public_forward(backend, kw)
    return out.y, out.final_states, out.varlen_states


def _inputs(point, backend):
    return make_inputs(point.problem, device=point.device, seed=point.seed, draw_device=point.draw_device)


def _arrange(backend, inputs):
    """The arrangement of the backend's defaults that takes these inputs (Backend.arranged_for), refusing inputs
    its kernels cannot take (a non-increasing decay they assume)."""
    backend = backend.arranged_for("ssd_forward", **inputs.forward_kwargs())
    correctness.refuse_unsafe_inputs(backend, inputs)
    return backend


def _reference(plan, requested: str) -> correctness.SsdTruth:
    kind = correctness.reference_kind(plan.inputs, plan.point.device, requested)
    ref = correctness.reference_forward(plan.inputs, kind)
    return correctness.SsdTruth(kind, ref, plan.backend, plan.inputs, plan.dtype, plan.point.device)


def _mamba_ssm_rule(plan, truth: correctness.SsdTruth, report: dict) -> dict:
    point = plan.point
    return correctness.mamba_ssm_rule(plan.backend, plan.inputs, truth.ref, point.problem, plan.dtype, point.device,
                                      report, cache_key=(point.problem, point.seed, truth.kind))


def _precision(backend, dtype, device) -> dict[str, str]:
    return {stage: backend.precision(stage, dtype, device) for stage in backend.STAGES}


def _chained(backend) -> bool:
    return all(stage.name in backend.STAGES for stage in FORWARD_STAGES)


def _parts(backend, kw: dict) -> dict:
    return backend.forward_parts(**{k: kw[k] for k in FORWARD_ARGS})


def _differentiable(backend, kw: dict, leaves: dict) -> dict:
    return gradient_gate.outputs_of(ssd(**{**kw, **leaves}, backend=backend))


def _check_gradients(plan) -> dict:
    point = plan.point
    kind = correctness.gradient_reference_kind(plan.inputs, point.device, point.bench.reference)
    return gradient_gate.check_gradients(plan.backend, plan.inputs, plan.dtype, point.device, point.seed,
                                         reference=kind)


def _costs(problem, options) -> dict:
    return cost_model.costs(problem)


SSD = register(Workload(
    name="ssd",
    stages=FORWARD_STAGES,
    forward=Stage("forward", ("y", "final_states", "varlen_states"), _public_forward),
    directions=DIRECTIONS,
    inputs=_inputs,
    arguments=forward_kwargs,
    reference=_reference,
    outputs={name: (lambda q, ndim, name=name: output_blocks(name, q))
             for name in ("y", "states", "final_states", "varlen_states", "dt", "dA_cumsum")},
    references=correctness.REFERENCE_KINDS,
    backward=Backward(leaves=gradient_gate.leaves_of, call=_differentiable, incoming=gradient_gate.output_gradients,
                      check=_check_gradients),
    arrange=_arrange,
    precision=_precision,
    chained=_chained,
    parts=_parts,
    cost=_costs,
    cost_model=cost_model.MODEL_VERSION,
    backward_cost_model=cost_model.BACKWARD_MODEL_VERSION,
    rule=_mamba_ssm_rule,
))
