"""Typed schemas behind every config group, their registration, and the start-up checks Hydra cannot do.

Hydra type-checks each group against these dataclasses (a mistyped key or value fails at composition). What
depends on the backends — which switches exist — is checked by `validate`, which the runner calls before
anything runs (and the sweep callback calls for every job of a multirun before the first one starts).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from harness import workloads
from impls import validate as checks
from impls.defaults import Resolved
from impls.problem import DTYPES, Problem, Shape
from impls.registry import BACKEND_MODULES, BackendUnavailable, backend_class, resolve_switches, target_on
from impls.stages import FORWARD_STAGE_NAMES

# Enums make a misspelt name fail at composition, naming the allowed values.
BackendName = enum.Enum("BackendName", {name: name for name in BACKEND_MODULES})
DtypeName = enum.Enum("DtypeName", {name: name for name in DTYPES})
# what bench.stages times unless a config names others: the SSD's stages (impls/stages.py) and its whole forward
# (another workload's conf/workload/<name>.yaml names its own)
DEFAULT_STAGES = (*FORWARD_STAGE_NAMES, "forward")


class ConfigError(ValueError):
    """A configuration that cannot run: raised at start-up, never recorded as a result."""


@dataclass
class BackendConfig:
    name: BackendName = MISSING
    # Overrides of the backend's switches (defaults come from the backend: its target's defaults, impls/defaults.py,
    # or the preset named below; never from here).
    switches: dict[str, Any] = field(default_factory=dict)
    # "none", "all_off", "<switch>" (a bool switch turned off) or "<switch>:<value>" (a non-default choice), from the
    # defaults; "preset:<name>" (first, before any "+") runs that preset instead of the target's defaults.
    ablation: str = "none"
    # A named set of the backend's switches (impls/<name>/defaults.py: "published", "declared", ...) instead of
    # the defaults of the target the point runs on; null: the target's.
    preset: str | None = None


@dataclass
class ShapeConfig:
    name: str = MISSING
    batch: int = MISSING
    seqlen: int = MISSING
    nheads: int = MISSING
    headdim: int = MISSING
    ngroups: int = MISSING
    dstate: int = MISSING
    chunk_size: int = MISSING


@dataclass
class ProblemConfig:
    name: str = MISSING
    has_dt_bias: bool = True
    dt_softplus: bool = True
    dt_limit: list[float] = field(default_factory=lambda: [0.0, math.inf])
    has_D: bool = True
    D_per_channel: bool = False
    has_z: bool = False
    has_initial_states: bool = False
    initial_states_per_sequence: bool = False
    nseqs: int = 1
    varlen: bool = False
    state_dtype: DtypeName | None = None


@dataclass
class DtypeConfig:
    name: DtypeName = DtypeName.bfloat16
    # (no tf32 flag: each backend reports the matmul precision it ran per stage, Backend.precision, and the
    # tolerance follows it)


@dataclass
class BenchConfig:
    name: str = "default"
    check: bool = True  # the correctness gate; a point that fails it is recorded and not timed
    reference: str = "auto"  # auto | float64 | fp32-chunked | sampled (auto: the most exact that fits in memory)
    time: bool = True
    stages: list[str] = field(default_factory=lambda: list(DEFAULT_STAGES))
    warmup_ms: int = 25  # do_bench's warm-up and repetition budgets, in milliseconds
    rep_ms: int = 100
    statistic: str = "median"
    quantiles: list[float] = field(default_factory=lambda: [0.2, 0.8])  # recorded as p<100q>_ms besides the median
    flush_l2: bool = True  # do_bench zeroes a 256 MB buffer before every repetition; false is refused (GPU)
    cuda_graph: bool = False  # also time CUDA-graph replay, L2 flushed between replays (timing.graph_times)
    # the api_overhead experiment (harness/api_overhead.py): the forward by name vs on the built backend
    api_overhead: bool = False
    host_calls: int = 1000  # calls per host-time median
    device_rounds: int = 2  # rounds of the interleaved device-time measurement per point
    ceilings: bool = True  # measure a matmul and a copy in the same run (GPU only)
    # each kernel of the timed call (the forward, or the backward) under stage kernel:<name>, from the torch profiler
    # after the call's own timings (GPU only; forward and backward directions): a run of its own, since a profiled
    # process may launch more slowly afterwards (harness/timing.py kernel_samples)
    kernel_times: bool = False
    cpu_warmup: int = 1  # CPU: wall-clock median over a few repetitions
    cpu_reps: int = 3


@dataclass
class WorkloadConfig:
    # what is measured: a workload of harness/workloads/ (conf/workload/<name>.yaml), and its own options on
    # top of those it declares (the layer's expand, d_conv); an option it lacks fails at start-up, naming it
    name: str = "ssd"
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class LoggerConfig:
    kind: str = "auto"  # auto | wandb | local
    project: str = "ssd-kernels"
    entity: str | None = None
    mode: str = "offline"  # used only when WANDB_MODE is not set in the environment
    dir: str = "."  # W&B writes under <dir>/wandb/; relative to the directory the command was started in


@dataclass
class LaunchConfig:
    # One process per GPU (experiments.multigpu): process `shard` of `num_shards` runs the jobs whose number
    # modulo num_shards is its shard; the others are skipped.
    num_shards: int = 1
    shard: int = 0


@dataclass
class Config:
    backend: BackendConfig = MISSING
    shape: ShapeConfig = MISSING
    problem: ProblemConfig = MISSING
    dtype: DtypeConfig = MISSING
    bench: BenchConfig = MISSING
    logger: LoggerConfig = MISSING
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda
    results_dir: str = "results/scratch"
    sweep_name: str = "adhoc"
    direction: str = "forward"  # forward | backward | forward_backward: one of the workload's directions
    force: bool = False  # re-run points already stored (same config hash and code key)
    retry_failed: bool = True  # re-run points stored as failed by the same code
    verbose: bool = False  # the terminal shows W&B's banners and Hydra's launch lines too (default: bar and summary)


def register_schemas() -> None:
    ConfigStore.instance().store(name="schema", node=Config)


# --- start-up validation ------------------------------------------------------------------------------

def _plain(value):
    if isinstance(value, enum.Enum):
        return value.name
    return value


def backend_name(cfg: DictConfig) -> str:
    return _plain(cfg.backend.name)


def shape_of(cfg: DictConfig) -> Shape:
    s = cfg.shape
    return Shape(s.batch, s.seqlen, s.nheads, s.headdim, s.ngroups, s.dstate, s.chunk_size)


def problem_of(cfg: DictConfig) -> Problem:
    p = cfg.problem
    return Problem(shape=shape_of(cfg), dtype=_plain(cfg.dtype.name), has_dt_bias=p.has_dt_bias,
                   dt_softplus=p.dt_softplus, dt_limit=tuple(float(v) for v in p.dt_limit), has_D=p.has_D,
                   D_per_channel=p.D_per_channel, has_z=p.has_z, has_initial_states=p.has_initial_states,
                   initial_states_per_sequence=p.initial_states_per_sequence,
                   nseqs=p.nseqs, varlen=p.varlen, state_dtype=_plain(p.state_dtype))


def check_shape(shape: Shape, name: str = "") -> None:
    """Raises ConfigError naming the first impossible dimension."""
    where = f"shape {name!r}: " if name else "shape: "
    for key, value in dataclasses.asdict(shape).items():
        if value < 1:
            raise ConfigError(f"{where}{key} must be >= 1, got {value}")
    if shape.nheads % shape.ngroups:
        raise ConfigError(f"{where}nheads ({shape.nheads}) must be a multiple of ngroups ({shape.ngroups})")
    _as_config_error(where, checks.chunk_size, shape.chunk_size)  # the public entries' rule: 16..2048, 2^k


def check_gated(check: bool, time: bool) -> None:
    """Every timed point passes the float64 gate first (the config check and harness.plan.BenchSettings)."""
    if time and not check:
        raise ConfigError("bench.check=false with bench.time=true: every timed point passes the float64 gate "
                          "first; turn bench.time off too (a run of the stages alone)")


def _as_config_error(where: str, check, *args) -> None:
    """Runs an impls.validate check at start-up: its ValueError (naming the argument) becomes a ConfigError, so a
    config that the public entries would refuse is not run and recorded as a failed point."""
    try:
        check(*args)
    except ValueError as exc:
        raise ConfigError(f"{where}{exc}") from exc


def check_problem(problem: Problem) -> None:
    _as_config_error("problem: ", checks.dt_limit, problem.dt_limit)
    if problem.nseqs < 1:
        raise ConfigError(f"problem: nseqs must be >= 1, got {problem.nseqs}")
    if problem.varlen and problem.shape.batch != 1:
        raise ConfigError(f"problem: varlen packs sequences into batch 1, got batch {problem.shape.batch}")
    if problem.has_seq_idx and problem.nseqs > problem.shape.seqlen:
        raise ConfigError(f"problem: nseqs ({problem.nseqs}) exceeds seqlen ({problem.shape.seqlen})")


def ablation_points(switches_cls, base: dict[str, Any] | None = None) -> list[str]:
    """The ablation sweep from the defaults `base` (all switch values; default: the Switches dataclass's declared
    ones): the defaults, each bool switch on in them turned off alone, each off turned on alone ("<switch>:True",
    after the switches it needs), each switch with values they set back to its declared value ("state_pass:
    chunk_parallel" from a default of serial), then all of the bools on off.
    Non-bool switches (tile sizes, tuning mode) have no "off"; an explicit
    "<switch>:<value>" ablation still sets one of them."""
    fields = dataclasses.fields(switches_cls)
    value = {f.name: f.default for f in fields} if base is None else base
    on_by_default = [f.name for f in fields if value[f.name] is True]
    # a trick whose measured default is off (evidence in docs/perf-notes.md) is ablated by turning it on, together
    # with the switches it needs (its `needs`: "tma:True+<switch>:True")
    off_by_default = ["+".join([*(f"{k}:{v}" for k, v in f.metadata.get("needs", {}).items() if value[k] != v),
                                f"{f.name}:True"])
                      for f in fields if value[f.name] is False]
    # a switch with values that the defaults set away from its declared value: back to the declared one alone
    declared = [f"{f.name}:{f.default}" for f in fields if not isinstance(f.default, bool) and f.metadata.get("choices")
                and value[f.name] != f.default]
    points = ["none"] + on_by_default + off_by_default + declared
    if len(on_by_default) > 1:
        # all off, then each switch alone on top of all-off: the "alone" column of the ablation table
        points += ["all_off"] + [f"only:{name}" for name in on_by_default]
    return points


PRESET_POINT = "preset:"  # an ablation point running a preset of the backend instead of its target's defaults


def split_preset(ablation: str) -> tuple[str | None, str]:
    """("<name>", the rest or "none") of an ablation that starts with "preset:<name>"; (None, ablation) else."""
    first, plus, rest = ablation.partition("+")
    if not first.startswith(PRESET_POINT):
        return None, ablation
    return first[len(PRESET_POINT):], rest if plus else "none"


def apply_ablation(switches_cls, given: dict[str, Any], ablation: str,
                   base: dict[str, Any] | None = None) -> dict[str, Any]:
    """`given` switch overrides with the ablation applied on top, from the defaults `base` (all switch values;
    default: the declared ones). Points joined by "+" apply left to right ("heads_first:True+pdl:True": both on;
    "all_off+tma:True": everything off but tma; a bare "tma" turns it off)."""
    if "+" in ablation:
        out = dict(given)
        for part in ablation.split("+"):
            if not part:
                raise ConfigError(f"backend.ablation {ablation!r}: an empty point between '+' signs")
            out = apply_ablation(switches_cls, out, part, base)
        return out
    out = dict(given)
    fields = {f.name: f for f in dataclasses.fields(switches_cls)}
    current = {f.name: f.default for f in fields.values()} if base is None else base
    if ablation == "none":
        return out
    if ablation.startswith(PRESET_POINT):
        raise ConfigError(f"backend.ablation {ablation!r}: a preset point comes first (preset:<name>+...)")
    if ablation == "all_off":
        for f in fields.values():
            if current[f.name] is True:
                out[f.name] = False
        return out
    if ablation.startswith("only:"):
        keep = ablation[len("only:"):]
        if keep not in fields:
            raise ConfigError(f"backend.ablation {ablation!r}: the backend has no switch {keep!r}")
        for f in fields.values():
            if current[f.name] is True:
                out[f.name] = f.name == keep
        return out
    name, _, value = ablation.partition(":")
    if name not in fields:
        raise ConfigError(f"backend.ablation {ablation!r}: the backend has no switch {name!r}; it has "
                          f"{sorted(fields)}")
    f = fields[name]
    if not value:
        if not isinstance(f.default, bool):
            raise ConfigError(f"backend.ablation {ablation!r}: switch {name!r} is not a bool; write {name}:<value>")
        out[name] = False
        return out
    if isinstance(f.default, bool):
        if value not in ("True", "False"):
            raise ConfigError(f"backend.ablation {ablation!r}: switch {name!r} is a bool; write {name}:True or "
                              f"{name}:False")
        out[name] = value == "True"
        return out
    choices = f.metadata.get("choices") or []
    matches = [c for c in choices if str(c) == value]
    if not matches:
        raise ConfigError(f"backend.ablation {ablation!r}: {value!r} is not a choice of {name!r} ({choices})")
    out[name] = matches[0]
    return out


def resolved_switches(cfg: DictConfig):
    """The backend's Switches instance this config asks for, on the target of `cfg.device`; raises ConfigError
    naming a bad switch or preset.

    Returns None when the backend's module cannot be imported here (the point is then recorded as failed)."""
    name = backend_name(cfg)
    try:
        cls = backend_class(name)
    except BackendUnavailable:
        return None
    given = OmegaConf.to_container(cfg.backend.switches, resolve=True)
    target = target_on(cls, config_device(cfg.device))
    return resolution(cls, target, given, cfg.backend.ablation, cfg.backend.get("preset")).first.switches


def config_device(device: str) -> torch.device | None:
    """The device `cfg.device` names, for its target (None: the default device, the CPU where CUDA is absent; a
    run that asks for CUDA there fails at start-up, harness.plan.resolve_device)."""
    return torch.device("cpu") if device == "cpu" else None


def resolution(cls, target: str, given: dict[str, Any], ablation: str, preset: str | None) -> Resolved:
    """How `cls` runs a point on `target`: the defaults there (or the preset named, by `preset` or by the ablation's
    "preset:<name>"), the ablation applied from them, the given switches on top (impls.registry.resolve_switches);
    ConfigError naming what is wrong."""
    named, ablation = split_preset(ablation)
    if named is not None and preset is not None and named != preset:
        raise ConfigError(f"backend.preset={preset!r} and backend.ablation preset:{named}: name one preset")
    preset = preset if named is None else named
    try:
        base = dataclasses.asdict(resolve_switches(cls, target, preset).first.switches)
        return resolve_switches(cls, target, preset, apply_ablation(cls.Switches, given, ablation, base))
    except (ValueError, TypeError) as exc:
        raise ConfigError(str(exc)) from exc


def validate(cfg: DictConfig):
    """All start-up checks; returns (problem, switches or None)."""
    name = backend_name(cfg)
    if name not in BACKEND_MODULES:
        raise ConfigError(f"backend: expected one of {sorted(BACKEND_MODULES)}, got {name!r}")
    shape = shape_of(cfg)
    check_shape(shape, cfg.shape.name)
    problem = problem_of(cfg)
    check_problem(problem)
    if cfg.device not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"device: expected auto, cpu or cuda, got {cfg.device!r}")
    if cfg.logger.kind not in ("auto", "wandb", "local"):
        raise ConfigError(f"logger.kind: expected auto, wandb or local, got {cfg.logger.kind!r}")
    if cfg.bench.reference not in ("auto", "float64", "fp32-chunked", "sampled"):
        raise ConfigError("bench.reference: expected auto, float64, fp32-chunked or sampled, "
                          f"got {cfg.bench.reference!r}")
    if cfg.bench.reference == "sampled" and problem.has_seq_idx:
        raise ConfigError("bench.reference=sampled does not handle packed sequences (problem.nseqs > 1 or "
                          "varlen); use auto, float64 or fp32-chunked")
    check_gated(cfg.bench.check, cfg.bench.time)
    if cfg.bench.statistic != "median":
        raise ConfigError(f"bench.statistic: only 'median' is recorded, got {cfg.bench.statistic!r}")
    check_timing_knobs(cfg.bench, cfg.device)
    if cfg.bench.get("kernel_times") and cfg.direction not in workloads.DIRECTIONS:
        raise ConfigError(f"bench.kernel_times: times the kernels of a forward or a backward call; direction "
                          f"{cfg.direction!r} has none to give")
    check_workload(cfg.workload.name, OmegaConf.to_container(cfg.workload.options, resolve=True), problem,
                   cfg.direction, cfg.bench.reference, list(cfg.bench.stages))
    if not 0 <= cfg.launch.shard < cfg.launch.num_shards:
        raise ConfigError(f"launch.shard must be in [0, num_shards), got {cfg.launch.shard}/{cfg.launch.num_shards}")
    return problem, resolved_switches(cfg)


def check_workload(name: str, options: dict | None, problem: Problem, direction: str, reference: str,
                   stages) -> dict[str, Any]:
    """The workload's own checks of a point (harness/workloads/: its options, direction, reference kinds, shape
    and problem) and bench.stages against its stages; -> its options with the declared defaults. ConfigError naming
    what it refuses."""
    try:
        workload = workloads.get(name)
        resolved = workload.resolve_options(options)
        workload.check(problem, resolved, direction, reference)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    bad = [s for s in stages if s not in workload.stage_names]
    if bad:
        raise ConfigError(f"bench.stages: {bad} are not stages of workload {name!r}; expected some of "
                          f"{list(workload.stage_names)}")
    return resolved


def _cuda_device(device: str) -> bool:
    """Whether points of `device` (cpu | cuda | auto) run on a CUDA device."""
    if device == "auto":
        import torch

        return torch.cuda.is_available()
    return device == "cuda"


def check_timing_knobs(bench, device: str) -> None:
    """bench.quantiles and bench.flush_l2 are honoured or refused here, never ignored."""
    for q in bench.quantiles:
        if not 0 < q < 1 or abs(q * 100 - round(q * 100)) > 1e-9 or round(q * 100) == 50:
            raise ConfigError(f"bench.quantiles: each must be a whole percent in (0, 1) other than the median "
                              f"0.5 (recorded as p<percent>_ms), got {q!r}")
    if not bench.flush_l2 and device != "cpu":
        raise ConfigError("bench.flush_l2=false: triton.testing.do_bench (triton 3.6) flushes L2 before every "
                          "repetition and cannot be told not to; timing without the flush is not implemented")
    if bench.host_calls < 1:
        raise ConfigError(f"bench.host_calls must be >= 1, got {bench.host_calls}")
    if bench.device_rounds < 1:
        raise ConfigError(f"bench.device_rounds must be >= 1, got {bench.device_rounds}")
    if getattr(bench, "kernel_times", False) and not _cuda_device(device):
        raise ConfigError("bench.kernel_times: each kernel's device time comes from the torch profiler on a CUDA "
                          "device; this point runs on the CPU")


# --- identity of a point ------------------------------------------------------------------------------

def config_hash(semantic: dict[str, Any]) -> str:
    """sha256[:16] of a point's semantic config (harness.plan.semantic)."""
    text = json.dumps(semantic, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def register_resolvers() -> None:
    """`${ssd_ablations:<backend>}`: the comma list of ablation points, read off the backend's Switches and its
    defaults on the target the sweep starts on (so the ablate_<backend> overlays follow the backend's code, not a
    copy of it)."""
    def ablations(name: str) -> str:
        try:
            cls = backend_class(name)
        except BackendUnavailable:
            return "none"
        # from the defaults of the target the sweep starts on (its points run there)
        defaults = resolve_switches(cls, target_on(cls)).first.switches
        return ",".join(ablation_points(cls.Switches, dataclasses.asdict(defaults)))

    def cutile_tile(shape_name: str, stage: str, field: str):
        from harness import cutile_tiles

        try:
            return cutile_tiles.tile(shape_name, stage, field)
        except cutile_tiles.MissingRecord as exc:
            raise ConfigError(f"${{ssd_cutile_tile:{shape_name},{stage},{field}}}: {exc}") from exc

    if not OmegaConf.has_resolver("ssd_ablations"):
        OmegaConf.register_new_resolver("ssd_ablations", ablations)
    if not OmegaConf.has_resolver("ssd_log_level"):  # Hydra's own lines: shown with verbose=true (conf/config.yaml)
        OmegaConf.register_new_resolver("ssd_log_level", lambda verbose: "INFO" if verbose else "WARNING")
    if not OmegaConf.has_resolver("ssd_cutile_tile"):  # cuTile's tuned tiles as pins (harness/cutile_tiles.py)
        OmegaConf.register_new_resolver("ssd_cutile_tile", cutile_tile)
