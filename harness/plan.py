"""Step 1 of a point's life: what to measure, as typed objects. `Point` is the validated config (workload and its
options, direction, backend and its switches, Problem, seed, device, bench settings) with its identity (config hash,
code_key, sweep); `build` turns it into the `Plan` the later steps take (the built backend, the inputs the
workload's generator drew). Nothing here reads a DictConfig except
`from_config`, which the Hydra entry (experiments/bench.py) calls; `point` builds one in plain Python.

Pipeline: Point → Plan (here) → GateReport (harness/gate.py) → Timings (harness/measure_time.py) → Rows
(harness/record.py)."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
from dataclasses import dataclass, field
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from harness import config as conf
from harness import provenance
from harness import workloads as workload_registry
from impls.defaults import Resolved
from impls.inputs import DEVICE_DRAW_ELEMENTS
from impls.problem import Problem
from impls.registry import Backend, BackendUnavailable, backend_class, get_backend, require, target_on


@dataclass(frozen=True)
class BenchSettings:
    """What the gate and the timing do (conf/bench/*.yaml, typed by harness.config.BenchConfig)."""

    name: str = "default"
    check: bool = True
    reference: str = "auto"
    time: bool = True
    stages: tuple[str, ...] = conf.DEFAULT_STAGES
    warmup_ms: int = 25
    rep_ms: int = 100
    statistic: str = "median"
    quantiles: tuple[float, ...] = (0.2, 0.8)
    flush_l2: bool = True
    cuda_graph: bool = False
    api_overhead: bool = False
    host_calls: int = 1000
    device_rounds: int = 2
    ceilings: bool = True
    kernel_times: bool = False
    cpu_warmup: int = 1
    cpu_reps: int = 3

    def __post_init__(self) -> None:
        conf.check_gated(self.check, self.time)

    @classmethod
    def from_config(cls, node) -> BenchSettings:
        values = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = set(values) - fields
        if unknown:  # the schemas must stay in step: a bench key not carried here would be silently dropped
            raise conf.ConfigError(f"bench: keys {sorted(unknown)} are not in harness.plan.BenchSettings")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


@dataclass(frozen=True)
class Identity:
    """Who a point is: its config hash and code key (the skip rule's key), its sweep, its run (run_group: one per
    script invocation, the sweep's id when none was given; round: its round there), and the full config."""

    config_hash: str
    code_key: str
    sweep_id: str = "adhoc"
    run_group: str = "adhoc"
    round: int = 1
    sweep_name: str = "adhoc"
    job_num: int = 0
    timestamp: str = field(default_factory=lambda: _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"))
    hydra_choices: str = "{}"  # JSON: Hydra's runtime choices (group -> option)
    config_yaml: str = ""  # the resolved config, as the `config` column stores it
    config: dict = field(default_factory=dict, hash=False)  # the same, as the W&B run's config


@dataclass(frozen=True)
class Point:
    """One point as configured: what to measure, where, and its identity."""

    backend: str
    switches: Any  # the backend's Switches; the requested overrides (a dict) when its module cannot be imported
    ablation: str
    problem: Problem
    seed: int
    device: torch.device
    bench: BenchSettings
    identity: Identity
    provenance: dict = field(hash=False)
    shape_name: str = "custom"
    problem_name: str = "custom"
    # how the switches were resolved (the target's defaults or a preset, and the next arrangements for inputs the
    # first refuses: impls/defaults.py); None where they were given whole, or the backend cannot be imported
    resolved: Resolved | None = field(default=None, hash=False, compare=False)
    direction: str = "forward"  # one of the workload's directions (harness.workloads.DIRECTIONS)
    workload: str = "ssd"  # harness/workloads/<name>.py
    workload_options: dict = field(default_factory=dict, hash=False)  # its options, the declared defaults included

    @property
    def device_name(self) -> str:
        return provenance.device_name(self.device)

    @property
    def draw_device(self) -> str:
        return draw_device(self.problem, self.device)

    @property
    def switches_json(self) -> str:
        return json.dumps(switches_dict(self.switches), sort_keys=True, default=str)


@dataclass(frozen=True)
class Plan:
    """A point ready to run: the backend built with its switches (and able to run the problem on the device),
    the inputs drawn by the workload's generator (seeded) and checked against what the backend's switches assume, and
    each stage's matmul precision as the backend reports it."""

    point: Point
    backend: Backend
    inputs: Any  # the workload's inputs (the SSD's: impls.inputs.Inputs)
    precision: dict[str, str]

    @property
    def dtype(self) -> torch.dtype:
        return self.point.problem.torch_dtype

    @property
    def workload(self) -> workload_registry.Workload:
        return workload_registry.get(self.point.workload)


def build(point: Point) -> Plan:
    """The Plan of `point`; raises why it cannot run (backend unavailable, problem unsupported, unsafe inputs).
    Its backend is the one that runs the drawn inputs (the workload's `arrange`: for the SSD the arrangement that
    takes them, Backend.arranged_for: the first of the point's, or where that one refuses them, the next its
    target declares; its describe() says which, and why)."""
    workload = workload_registry.get(point.workload)
    backend = get_backend(point.backend, point.resolved or point.switches)
    require(backend, point.problem, point.device)
    inputs = workload.inputs(point, backend)
    backend = workload.arrange(backend, inputs)
    precision = workload.stage_precision(backend, point.problem.torch_dtype, point.device)
    return Plan(point, backend, inputs, precision)


# --- identity ---------------------------------------------------------------------------------------------

def switches_dict(switches) -> dict:
    return dataclasses.asdict(switches) if dataclasses.is_dataclass(switches) else dict(switches or {})


def semantic(backend: str, switches, ablation: str, problem: Problem, bench: BenchSettings, seed: int,
             device_name: str, direction: str = "forward", workload: str = "ssd",
             workload_options: dict | None = None) -> dict[str, Any]:
    """What defines a measurement: the workload (and its options, where it has any) and direction, backend and its
    full switches, shape, problem, dtype, bench settings, seed, and the device it runs on. Not: logging, output
    places, force, sharding, names of presets."""
    problem_fields = {k: v for k, v in dataclasses.asdict(problem).items() if k not in ("shape", "dtype")}
    problem_fields["dt_limit"] = list(problem_fields["dt_limit"])
    return {
        "backend": backend,
        "switches": switches_dict(switches),
        "ablation": None if dataclasses.is_dataclass(switches) else ablation,
        "shape": dataclasses.asdict(problem.shape),
        "problem": problem_fields,
        "dtype": {"name": problem.dtype},
        # kernel_times only where on: points without it keep their hashes
        "bench": {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(bench).items()
                  if k != "name" and not (k == "kernel_times" and not v)},
        "seed": seed,
        "device": device_name,
        "workload": workload,
        "direction": direction,
        # only where the workload has options: the SSD's points keep their hashes
        **({"workload_options": dict(sorted(workload_options.items()))} if workload_options else {}),
    }


def draw_device(problem: Problem, device: torch.device) -> str:
    """Where the inputs' random numbers are drawn: on the GPU for problems too big to draw on the CPU quickly."""
    s = problem.shape
    big = s.batch * s.seqlen * s.nheads * s.headdim > DEVICE_DRAW_ELEMENTS
    return device.type if big and device.type == "cuda" else "cpu"


def resolve_device(requested: str) -> torch.device:
    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise conf.ConfigError("device=cuda but torch.cuda.is_available() is False")
    return torch.device("cuda", torch.cuda.current_device())


def point(backend: str, problem: Problem, *, switches=None, ablation: str = "none", preset: str | None = None,
          seed: int = 0, device: str | torch.device = "cpu", bench: BenchSettings | None = None,
          sweep_id: str = "adhoc", run_group: str | None = None, round: int = 1, sweep_name: str = "adhoc",
          job_num: int = 0, shape_name: str = "custom", problem_name: str = "custom", direction: str = "forward",
          workload: str = "ssd", workload_options: dict | None = None,
          hydra_choices: str = "{}", config: dict | None = None, config_yaml: str | None = None) -> Point:
    """A Point in plain Python: `switches` a dict of overrides on top of the defaults of the device's target (or
    of `preset`), `ablation` applied from those (harness.config.resolution), or a Switches instance, taken as
    is (kept as given when the backend's module cannot be imported here); `workload` a registered one
    (harness/workloads/) with `workload_options` on top of its declared ones (`bench`, where given, names its
    stages; by default every stage it has); identity computed as the Hydra entry computes it (run_group: the
    sweep_id unless given)."""
    conf.check_shape(problem.shape, shape_name)
    conf.check_problem(problem)
    bench = bench or BenchSettings(stages=workload_registry.get(workload).stage_names)  # every stage it has
    options = conf.check_workload(workload, workload_options, problem, direction, bench.reference, bench.stages)
    device = resolve_device(device) if isinstance(device, str) else device
    resolved = None
    try:
        cls = backend_class(backend)
    except BackendUnavailable:
        cls = None
        switches = switches_dict(switches)
    else:
        if not dataclasses.is_dataclass(switches):
            resolved = conf.resolution(cls, target_on(cls, device), switches_dict(switches), ablation, preset)
            switches = resolved.first.switches
    prov = provenance.collect(device)
    device_name = provenance.device_name(device)
    sem = semantic(backend, switches, ablation, problem, bench, seed, device_name, direction, workload, options)
    if config is None:  # what the config column and the W&B run show for a point built in Python (plain values)
        config = json.loads(json.dumps({**sem, "shape": {"name": shape_name, **sem["shape"]},
                                        "problem": {"name": problem_name, **sem["problem"]},
                                        "bench": dataclasses.asdict(bench)}, default=str))
    records_device = (cls.tuning_device(device) if cls is not None else None) or device_name
    peers = cls.peer_files() if cls is not None else {}
    identity = Identity(config_hash=conf.config_hash(sem),
                        code_key=provenance.code_key(prov, backend, records_device, peers),
                        sweep_id=sweep_id, run_group=run_group or sweep_id, round=round, sweep_name=sweep_name,
                        job_num=job_num, hydra_choices=hydra_choices,
                        config_yaml=OmegaConf.to_yaml(OmegaConf.create(config)) if config_yaml is None else config_yaml,
                        config=config)
    return Point(backend=backend, switches=switches, ablation=ablation, problem=problem, seed=seed, device=device,
                 bench=bench, identity=identity, provenance=prov, shape_name=shape_name, problem_name=problem_name,
                 resolved=resolved, direction=direction, workload=workload, workload_options=options)


def from_config(cfg: DictConfig, sweep_id: str = "adhoc", job_num: int = 0, hydra_choices: dict | None = None,
                run_group: str | None = None, round: int = 1) -> Point:
    """The Point of a composed config; the start-up checks (harness.config.validate) raise ConfigError."""
    problem, _ = conf.validate(cfg)
    # resolved again by `point` on the device it resolves (the same answer): the overrides, the ablation, the preset
    switches = OmegaConf.to_container(cfg.backend.switches, resolve=True)
    return point(conf.backend_name(cfg), problem, switches=switches, ablation=cfg.backend.ablation,
                 preset=cfg.backend.get("preset"), seed=int(cfg.seed), device=cfg.device,
                 bench=BenchSettings.from_config(cfg.bench),
                 sweep_id=sweep_id, run_group=run_group, round=round, sweep_name=cfg.sweep_name, job_num=job_num,
                 shape_name=cfg.shape.name, problem_name=cfg.problem.name, direction=cfg.direction,
                 workload=cfg.workload.name,
                 workload_options=OmegaConf.to_container(cfg.workload.options, resolve=True),
                 hydra_choices=json.dumps(dict(hydra_choices or {}), sort_keys=True, default=str),
                 config=OmegaConf.to_container(cfg, resolve=True, enum_to_str=True),
                 config_yaml=OmegaConf.to_yaml(cfg, resolve=True))
