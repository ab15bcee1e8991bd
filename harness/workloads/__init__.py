"""What the harness measures, declared once per workload: its stage chain and whole forward (impls/stages.py `Stage`
objects), input generator, shape schema, directions, ground truth and the outputs its gate judges. The pipeline
(harness/plan.py → gate.py → measure_time.py → record.py) reads a point's workload here and iterates over its
declaration. Each module of this package declares one workload under its own name (imported on first use);
`register` adds one from anywhere (a test's own); conf/workload/<name>.yaml chooses one on the command line."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from impls.problem import Problem, Shape
from impls.stages import Stage

# The directions a workload may declare, and what the timing step times of each (harness/measure_time.py):
# the forward (its stages and the whole), the backward alone (after one forward under autograd), a forward and its
# backward together
DIRECTIONS = ("forward", "backward", "forward_backward")
# Directions a workload runs through a `Step` of its own (its `steps`), gated as its backward is plus the step's own
# check: a training step (forward, backward and an optimizer step: the language model's AdamW step)
STEPPED = ("train_step",)
HERE = Path(__file__).resolve().parent

# (chunk_size, ndim) -> (the block's extent per dimension (None: the whole dimension), the dimensions' names)
Blocks = Callable[[int, int], tuple[tuple[int | None, ...], tuple[str, ...]]]


def whole(chunk_size: int, ndim: int) -> tuple[tuple[None, ...], tuple[str, ...]]:
    """One block: the whole tensor (an output the workload names no blocks for)."""
    return (None,) * ndim, ("",) * ndim


def _no_columns(shape: Shape, options: Mapping) -> dict[str, Any]:
    return {}


def _no_check(shape: Shape, options: Mapping) -> None:
    return None


@dataclass(frozen=True)
class ShapeSchema:
    """What a workload makes of the shape config (conf/shape/: the SSD's seven numbers, checked for every workload):
    a check of its own (ValueError naming the dimension or option) and the columns it adds to its rows
    (harness/store.py COLUMNS, e.g. the layer's d_model derived from nheads·headdim / expand)."""

    check: Callable[[Shape, Mapping], None] = _no_check
    columns: Callable[[Shape, Mapping], dict[str, Any]] = _no_columns


@dataclass(frozen=True)
class Backward:
    """A workload's backward (directions backward and forward_backward): its differentiable inputs, the forward on
    them under autograd, the gradients flowing in, and the float64 ground truth of the gradients.

    - `leaves(kw)`: the differentiable inputs of the arguments `kw`, by name, each a leaf requiring grad;
    - `call(backend, kw, leaves)`: the differentiable forward on those leaves -> its outputs by name;
    - `incoming(inputs, seed)`: the gradients flowing into those outputs (float64, never zero), by output name;
    - `reference(inputs, incoming)`: the ground truth, float64 autograd of the reference -> {"d<leaf>": gradient};
    - `check(plan)`: a gradient gate of the workload's own (the SSD's bound by the same-precision computation),
      else the flat one: each gradient within `tolerance(plan)` whole and per block of `Workload.outputs`."""

    leaves: Callable[[dict], dict[str, torch.Tensor]]
    call: Callable[[Any, dict, dict], dict[str, torch.Tensor | None]]
    incoming: Callable[[Any, int], dict[str, torch.Tensor]]
    reference: Callable[[Any, dict], dict[str, torch.Tensor | None]] | None = None
    check: Callable[[Any], dict[str, dict]] | None = None
    tolerance: Callable[[Any], float] | None = None


@dataclass(frozen=True)
class Step:
    """A direction a workload runs as a whole step of its own (train_step: forward, backward and an optimizer
    step), beside its gradients' gate (its `Backward`):

    - `calls(backend, inputs, seed)`: zero-argument calls to time, by stage name (e.g. {"train_step": one step});
      they run after the gate and may advance the inputs (a training loop's steps go on training);
    - `check(plan)`: the step's own gate as stage reports (harness/gradient_gate.py `stage_reports`' form, e.g. the
      parameters after one step against the same step on float64 gradients), beside the gradients';
    - `refuses(problem, options)`: what this direction cannot take of a point that the workload's other checks let
      through (a reason naming the setting, or None), checked with them before anything runs."""

    calls: Callable[[Any, Any, int], dict[str, Callable[[], Any]]]
    check: Callable[[Any], dict[str, dict]]
    refuses: Callable[[Problem, Mapping], str | None] | None = None


def _same_backend(backend, inputs):
    return backend


def _always(backend) -> bool:
    return True


def _no_parts(backend, kw: dict) -> dict:
    return {}


def _no_costs(problem: Problem, options: Mapping) -> dict[str, dict[str, float]]:
    return {}


def _accepts(problem: Problem) -> str | None:
    return None


def _accepts_options(problem: Problem, options: Mapping) -> str | None:
    return None


@dataclass(frozen=True)
class Workload:
    """One workload, as the pipeline iterates over it.

    - `stages`: the forward's chain, each stage called on the earlier stages' outputs (the gate chains them on the
      backend's own outputs, the timing times each on ready inputs); `forward`: the whole forward as a user calls
      it (a Stage named "forward", called with no earlier outputs).
    - `inputs(point, backend)`: the seeded input generator; `arguments(inputs)`: what the stages are called with.
    - `reference(plan, requested)`: the forward gate's ground truth (an harness.correctness Truth), of the kind
      bench.reference asks for (`references`: the kinds it has; auto takes the first that fits).
    - `outputs`: the gate's outputs (forward and gradients) by name, with their blocks; another is judged whole.
    - `shape`, `options` (its own settings, conf/workload/<name>.yaml `options`, with their defaults), `refuses`
      (why it cannot run a problem of the config, or None), `options_refuse(problem, options)` (why its options
      cannot take the problem, e.g. its dtype: a ValueError's text naming the option, or None), `directions`,
      `backward`, `steps` (a `Step` per direction of STEPPED it declares).
    - `tokens(problem)`: the tokens one call processes (a language model's batch·seqlen), where it counts them:
      every timed stage's rows then carry tokens_per_s.
    - `arrange(backend, inputs)`: the backend that runs these inputs (an arrangement, checked values);
      `precision(backend, dtype, device)`: each stage's matmul precision; `chained(backend)`: whether the backend
      runs the chain stage by stage (a forward-only peer does not); `parts(backend, kw)`: pieces of the forward
      timed apart ("part:<name>"); `cost(problem, options)` per stage, under the model `cost_model` (and the
      entries of a backward, on backward points only, under `backward_cost_model`); `rule(plan,
      truth, report)`: a verdict beside the stages' (the SSD's mamba-ssm x2 rule)."""

    name: str
    stages: tuple[Stage, ...]
    forward: Stage
    directions: tuple[str, ...]
    inputs: Callable[[Any, Any], Any]
    arguments: Callable[[Any], dict]
    reference: Callable[[Any, str], Any]
    outputs: Mapping[str, Blocks] = field(default_factory=dict)
    references: tuple[str, ...] = ("float64",)
    shape: ShapeSchema = ShapeSchema()
    options: Mapping[str, Any] = field(default_factory=dict)
    refuses: Callable[[Problem], str | None] = _accepts
    options_refuse: Callable[[Problem, Mapping], str | None] = _accepts_options
    backward: Backward | None = None
    arrange: Callable[[Any, Any], Any] = _same_backend
    precision: Callable[[Any, torch.dtype, torch.device], dict[str, str]] | None = None
    chained: Callable[[Any], bool] = _always
    parts: Callable[[Any, dict], dict] = _no_parts
    cost: Callable[[Problem, Mapping], dict[str, dict[str, float]]] = _no_costs
    cost_model: str | None = None
    backward_cost_model: str | None = None
    rule: Callable[[Any, Any, dict], dict] | None = None
    steps: Mapping[str, Step] = field(default_factory=dict)
    tokens: Callable[[Problem], int] | None = None

    def __post_init__(self):
        unknown = [d for d in self.directions if d not in (*DIRECTIONS, *STEPPED)]
        if "forward" not in self.directions or unknown:
            raise ValueError(f"workload {self.name!r}: directions must include forward and be some of "
                             f"{(*DIRECTIONS, *STEPPED)}, "
                             f"got {self.directions}")
        if self.forward.name != "forward":
            raise ValueError(f"workload {self.name!r}: its whole forward is the stage named 'forward', got "
                             f"{self.forward.name!r}")
        if set(self.directions) - {"forward"} and self.backward is None:
            raise ValueError(f"workload {self.name!r}: directions {self.directions} need a Backward declaration")
        unstepped = [d for d in self.directions if d in STEPPED and d not in self.steps]
        if unstepped or set(self.steps) - set(self.directions):
            raise ValueError(f"workload {self.name!r}: directions {unstepped or self.directions} need a Step each in "
                             f"`steps` (and `steps` {sorted(self.steps)} only directions it declares)")

    @property
    def stage_names(self) -> tuple[str, ...]:
        """The stages a point of this workload may time: its chain's, then the whole forward."""
        return (*(s.name for s in self.stages), self.forward.name)

    def blocks(self, name: str, chunk_size: int, ndim: int) -> tuple[tuple[int | None, ...], tuple[str, ...]]:
        return self.outputs.get(name, whole)(chunk_size, ndim)

    def stage_precision(self, backend, dtype: torch.dtype, device: torch.device) -> dict[str, str]:
        """Each stage's matmul precision as the backend reports it (the rows' `precision`)."""
        if self.precision is not None:
            return self.precision(backend, dtype, device)
        return {stage: backend.precision(stage, dtype, device) for stage in self.stage_names}

    def resolve_options(self, given: Mapping | None) -> dict[str, Any]:
        """The declared options with `given` on top; ValueError naming an option the workload does not have."""
        unknown = sorted(set(given or {}) - set(self.options))
        if unknown:
            raise ValueError(f"workload.options: {unknown} are not options of workload {self.name!r}; it has "
                             f"{sorted(self.options) or 'none'}")
        return {**self.options, **(given or {})}

    def check(self, problem: Problem, options: Mapping, direction: str, reference: str = "auto") -> None:
        """What this workload refuses of a point, before anything runs: ValueError naming the setting."""
        if direction not in self.directions:
            raise ValueError(f"direction: workload {self.name!r} has {self.directions}, got {direction!r}")
        if reference != "auto" and reference not in self.references:
            raise ValueError(f"bench.reference: workload {self.name!r} has auto or {self.references}, got "
                             f"{reference!r}")
        self.shape.check(problem.shape, options)
        why = self.options_refuse(problem, options)
        if why:
            raise ValueError(why)
        step = self.steps.get(direction)
        why = step.refuses(problem, options) if step is not None and step.refuses is not None else None
        if why:
            raise ValueError(why)
        why = self.refuses(problem)
        if why:
            raise ValueError(f"problem: workload {self.name!r} {why}")


_REGISTRY: dict[str, Workload] = {}


def register(workload: Workload) -> Workload:
    """Makes `workload` available by its name (once: a second workload of a name already taken, a built-in one's
    included, is refused)."""
    if workload.name in _modules() and workload.name not in _REGISTRY:  # the built-in one of that name first
        importlib.import_module(_modules()[workload.name])  # (during its own import: the module as it stands)
    known = _REGISTRY.get(workload.name)
    if known is not None and known is not workload:
        raise ValueError(f"workload {workload.name!r} is registered already")
    _REGISTRY[workload.name] = workload
    return workload


def unregister(name: str) -> None:
    """Forgets a workload registered from outside this package (a test's own)."""
    _REGISTRY.pop(name, None)


def _modules() -> dict[str, str]:
    """The built-in workloads: one module of this package each, named as its workload."""
    return {p.stem: f"{__name__}.{p.stem}" for p in sorted(HERE.glob("*.py")) if not p.name.startswith("_")}


def names() -> list[str]:
    """Every workload: the built-in ones and those registered since."""
    return sorted(set(_modules()) | set(_REGISTRY))


def get(name: str) -> Workload:
    """The workload `name`, its module imported on first use; ValueError naming the known ones."""
    if name not in _REGISTRY and name in _modules():
        importlib.import_module(_modules()[name])
    if name not in _REGISTRY:
        raise ValueError(f"workload: expected one of {names()}, got {name!r}")
    return _REGISTRY[name]
