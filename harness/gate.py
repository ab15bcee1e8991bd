"""Step 2 of a point's life: the correctness gate of a Plan → `GateReport`, over the point's workload
(harness/workloads/): its ground truth (the SSD's: float64, fp32-chunked or sampled, harness.correctness),
tuning resolved in one plain pass, each of its stages and its whole forward checked (whole-tensor and block-wise),
its rule where it declares one (the SSD's mamba-ssm x2 rule), and for the backward directions every gradient
(harness/gradient_gate.py), for a step of the workload's own (train_step) that step's check too; the first call
of each stage timed (compile_s). With bench.check off, the stages are only run once (their first calls still
timed). A failed gate is a report with `failures`, never an exception:
the runner records it and times nothing."""

from __future__ import annotations

from dataclasses import dataclass, field

from harness import correctness, gradient_gate
from harness.plan import Plan


@dataclass(frozen=True)
class GateReport:
    reference: str | None  # the ground truth's kind (SSD: float64 | fp32-chunked | sampled); None without the gate
    stages: dict[str, dict] = field(default_factory=dict, hash=False)  # correctness.check_stages' report per stage
    rule: dict | None = field(default=None, hash=False)  # the workload's rule (correctness.mamba_ssm_rule), if any
    first_call: dict[str, float] = field(default_factory=dict, hash=False)  # stage -> seconds of its first call

    @property
    def description(self) -> str | None:
        """The gate column: the worst block per stage (where) and the workload's rule (the mamba-ssm rule), applied
        or skipped and why."""
        if self.reference is None:
            return None
        bounds = sorted({r["bound"] for r in self.stages.values()})
        blocks = "; ".join(f"{stage} worst block {r['block_err']:.3g} at {r['block_where']}, nearest its bound "
                           f"{r['bound_ratio']:.3g} of it at {r['bound_where']}" for stage, r in self.stages.items())
        rule = f"; {self.rule['why']}" if self.rule is not None else ""
        return f"whole-tensor and block-wise rel_err within the bound ({'; '.join(bounds)}) ({blocks}){rule}"

    @property
    def failures(self) -> list[str]:
        if self.reference is None:
            return []
        return [r["error"] for r in self.stages.values() if not r["ok"]] + (
            [] if self.rule is None or self.rule["ok"] else [self.rule["error"]])

    def metrics(self) -> list[tuple[str, str, float]]:
        """(stage, metric, value) rows: rel_err, block_err, tol, bound_ratio, ok per stage, the rule, compile_s."""
        out = []
        for stage, r in self.stages.items():
            out += [(stage, "rel_err", r["rel_err"]), (stage, "block_err", r["block_err"]), (stage, "tol", r["tol"]),
                    (stage, "bound_ratio", r["bound_ratio"]), (stage, "ok", 1.0 if r["ok"] else 0.0)]
        if self.rule is not None:
            out += [("forward", "mamba_ssm_rel_err", self.rule["mamba_ssm_rel_err"]),
                    ("forward", "mamba_ssm_rule", 1.0 if self.rule["applied"] else 0.0)]
        out += [(stage, "compile_s", seconds) for stage, seconds in self.first_call.items()]
        return out


def run(plan: Plan) -> GateReport:
    """The gate of `plan` (or, with bench.check off, one run of its stages); raises only on exceptions."""
    point, workload, first_call = plan.point, plan.workload, {}
    if not point.bench.check:
        correctness.run_stages(plan.backend, plan.inputs, point.device, first_call, workload)
        return GateReport(reference=None, first_call=first_call)
    truth = workload.reference(plan, point.bench.reference)
    report = correctness.check_stages(workload, plan.backend, plan.inputs, truth, point.device, first_call)
    rule = workload.rule(plan, truth, report) if workload.rule is not None else None
    if point.direction != "forward":  # the gradients too, against float64 autograd (harness/gradient_gate.py)
        report.update(gradient_gate.gate(plan))
    if point.direction in workload.steps:  # a step of the workload's own (train_step): its own check too
        report.update(workload.steps[point.direction].check(plan))
    return GateReport(reference=truth.kind, stages=report, rule=rule, first_call=first_call)
