"""Step 2 of a point's life: the correctness gate of a Plan → `GateReport`. The reference (harness.correctness:
float64, fp32-chunked or sampled), tuning resolved in one plain pass, each stage and the whole forward checked
(whole-tensor and block-wise), the mamba-ssm x2 rule; the first call of each stage timed (compile_s). With
bench.check off, the stages are only run once (their first calls still timed). A failed gate is a report with
`failures`, never an exception: the runner records it and times nothing."""

from __future__ import annotations

from dataclasses import dataclass, field

from harness import correctness, gradient_gate
from harness.plan import Plan


@dataclass(frozen=True)
class GateReport:
    reference: str | None  # float64 | fp32-chunked | sampled; None without the gate
    stages: dict[str, dict] = field(default_factory=dict, hash=False)  # correctness.check's report per stage
    rule: dict | None = field(default=None, hash=False)  # correctness.mamba_ssm_rule's verdict
    first_call: dict[str, float] = field(default_factory=dict, hash=False)  # stage -> seconds of its first call

    @property
    def description(self) -> str | None:
        """The gate column: the worst block per stage (where) and the mamba-ssm rule, applied or skipped and why."""
        if self.rule is None:
            return None
        bounds = sorted({r["bound"] for r in self.stages.values()})
        blocks = "; ".join(f"{stage} worst block {r['block_err']:.3g} at {r['block_where']}, nearest its bound "
                           f"{r['bound_ratio']:.3g} of it at {r['bound_where']}" for stage, r in self.stages.items())
        return (f"whole-tensor and block-wise rel_err within the bound ({'; '.join(bounds)}) ({blocks}); "
                f"{self.rule['why']}")

    @property
    def failures(self) -> list[str]:
        if self.rule is None:
            return []
        return [r["error"] for r in self.stages.values() if not r["ok"]] + (
            [] if self.rule["ok"] else [self.rule["error"]])

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
    point, first_call = plan.point, {}
    if not point.bench.check:
        correctness.run_stages(plan.backend, plan.inputs, point.device, first_call)
        return GateReport(reference=None, first_call=first_call)
    kind = correctness.reference_kind(plan.inputs, point.device, point.bench.reference)
    ref = correctness.reference_forward(plan.inputs, kind)
    report = correctness.check(plan.backend, plan.inputs, ref, plan.dtype, point.device, first_call)
    rule = correctness.mamba_ssm_rule(plan.backend, plan.inputs, ref, point.problem, plan.dtype, point.device,
                                      report, cache_key=(point.problem, point.seed, kind))
    if point.direction != "forward":  # the gradients too, against float64 autograd (harness/gradient_gate.py)
        grads = gradient_gate.check_gradients(plan.backend, plan.inputs, plan.dtype, point.device, point.seed,
                                              reference=kind)
        report.update(gradient_gate.stage_reports(grads, plan.dtype,
                                                  plan.backend.precision("compute_out", plan.dtype, point.device)))
    return GateReport(reference=kind, stages=report, rule=rule, first_call=first_call)
