"""The backend registry: one class per backend, registered by name, built with its typed switches.

A backend answers `available()` (can it run in this process at all) and `supports(problem)` (can it run this
problem), each as (ok, reason). `get_backend` raises with that reason rather than falling back to anything else:
a benchmark that silently timed another kernel would be worse than no number.

A backend asked for by name runs its target's defaults (impls/defaults.py: the presets its package declares per
target, sm_90, sm_100, the Triton interpreter, the CPU), the target read off the device it runs on, with the
switches the caller set on top; `preset=` names one set instead. Where the first arrangement refuses a call's
inputs, the call runs the next one its target declares (`Backend.arranged_for`), and describe() says which ran and
why the first refused.

`get_backend` builds a backend once per (name, resolution) and hands the same instance back afterwards, so what an
instance caches (resolved tuning configs, loaded modules) survives from one public call to the next, and each
class's `available()` answer is asked once per process: `impls.ssd_forward(..., backend="cutile")` then costs a
dictionary lookup more than a call on a backend built beforehand. A new tuning record (impls.tuning.store) makes
the registry forget its instances, so that later lookups resolve configs anew; `clear_cache()` forgets both.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from impls import defaults
from impls.declaration import ALL_STAGES, declarations
from impls.defaults import Defaults, Resolved
from impls.problem import Problem

# Where each backend lives: every impls/<name>/ folder that declares BACKEND (impls/declaration.py), found
# without importing it. Modules are imported on first use, so a missing optional dependency (cuda.tile, fla,
# tilegym, vllm) only matters to whoever asks for that backend.
BACKEND_MODULES: dict[str, str] = {name: decl.module for name, decl in declarations().items()}

_REGISTRY: dict[str, type[Backend]] = {}
_BUILT: dict[tuple, Backend] = {}  # (name, resolution), (name, device) -> the one instance get_backend hands out
_AVAILABLE: dict[str, tuple[bool, str]] = {}  # name -> the class's available() answer, asked once


def installed_files(package: str, *under: str) -> dict[str, Path]:
    """The .py files of an installed package, found without importing it, by "<package>/<path in it>" (for
    `Backend.peer_files`): those under the given files or folders of the package, or all of them; empty when it is
    not installed."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return {}
    root = Path(list(spec.submodule_search_locations)[0])
    found = {}
    for sub in under or ("",):
        paths = [root / sub] if (root / sub).is_file() else (root / sub).rglob("*.py")
        found.update({f"{package}/{p.relative_to(root).as_posix()}": p for p in paths
                      if p.is_file() and "__pycache__" not in p.parts})
    return found


class BackendUnavailable(RuntimeError):
    """The backend cannot run here, or cannot run this problem; the message says why."""


@dataclass(frozen=True)
class NoSwitches:
    """A backend without switches."""


def switch(default, help: str, sm90: str | None = None, sm100: str | None = None, choices=None,
           needs: dict | None = None):
    """Declares one switch: its default and what it means, per architecture where that differs. `needs`: the other
    switches' values it cannot run without (an ablation turns them on with it)."""
    meta = {"help": help, "sm90": sm90 or help, "sm100": sm100 or help, "choices": choices, "needs": needs or {}}
    return dataclasses.field(default=default, metadata=meta)


def switch_table(switches_cls) -> list[dict[str, Any]]:
    """One row per declared switch: name, default, meaning on sm_90 and sm_100, allowed values."""
    return [
        {
            "name": f.name,
            "default": f.default,
            "help": f.metadata.get("help", ""),
            "sm90": f.metadata.get("sm90", ""),
            "sm100": f.metadata.get("sm100", ""),
            "choices": f.metadata.get("choices"),
        }
        for f in dataclasses.fields(switches_cls)
    ]


class Backend:
    """Base class. Subclasses implement the three stages; `ssd_forward` composes them unless overridden."""

    name: ClassVar[str]
    Switches: ClassVar[type] = NoSwitches
    # Switches that other backends have and this one cannot express: name -> why.
    CANNOT_EXPRESS: ClassVar[dict[str, str]] = {}
    # Both filled in by @register from the package's declaration (impls/<name>/__init__.py STAGES, PACKAGES):
    # what can be called (and timed) on its own (a forward-only peer: just ("forward",)), and the pinned packages
    # it runs on, distribution -> pin ("3.6.*": any 3.6 release).
    STAGES: ClassVar[tuple[str, ...]] = ALL_STAGES
    REQUIRES: ClassVar[dict[str, str]] = {}
    # Resolves configs on a stage's first call (a search, a tuning record, an autotuner): the harness then makes
    # one plain pass before the correctness gate (harness/correctness.py `resolve_tuning`).
    TUNED: ClassVar[bool] = False
    # Where its tiles come from for every stage (impls/tuning.py TILE_PROTOCOLS; describe() reports it): "untuned", a
    # peer's "peer-autotune", or None where each stage's tuning resolution says (describe()'s per-stage entries)
    TILE_PROTOCOL: ClassVar[str | None] = "untuned"
    # Why the kernels need dA_cumsum non-increasing inside every chunk (A <= 0 and dt >= 0 after processing),
    # where they assume it whatever the switches; "" where they do not. check_values and the harness's gate refuse
    # inputs that break it, naming the argument (impls/api.py `non_increasing_decay`).
    NON_INCREASING_DECAY: ClassVar[str] = ""
    # Whether autograd can differentiate through the forward (plain torch ops): the model-level modules
    # (models/) refuse to run with gradients required on a backend without it, since no kernel has a backward.
    DIFFERENTIABLE: ClassVar[bool] = False
    # The switch defaults per target (impls/defaults.py): none declared, every target runs the declared values.
    DEFAULTS: ClassVar[Defaults] = Defaults()
    # How get_backend resolved this instance (None: built directly, on the declared values and the given switches),
    # and the instance the last public call ran on (another arrangement where this one refused its inputs).
    resolved: Resolved | None = None
    ran: Backend | None = None
    # The backward (impls.ssd): what the forward keeps for it and what it recomputes, in a line the rows record; ""
    # for a backend without one (impls.ssd then raises, naming the backend and NO_BACKWARD's reason).
    BACKWARD: ClassVar[str] = ""
    # Why the backend cannot take one initial state per packed sequence (initial_states (nseqs, ...) with
    # cu_seqlens); "" where it can (its compute_out and varlen_states then take `initial_states=` as well)
    NO_PER_SEQUENCE_INITIAL_STATES: ClassVar[str] = "its kernels take one initial state per batch row"
    NO_BACKWARD: ClassVar[str] = "its kernels are forward only"

    def __init__(self, switches=None, **overrides):
        self.switches = make_switches(self.name, self.Switches, self.CANNOT_EXPRESS, switches, overrides)

    # --- capability -------------------------------------------------------------------------------------
    @classmethod
    def available(cls) -> tuple[bool, str]:
        return True, ""

    @classmethod
    def tuning_device(cls, device: torch.device) -> str | None:
        """The device name whose tuning records (tuning/<slug of it>/<backend>_*.json) this backend reads on
        `device`; None: the harness's own name for the device (harness/provenance.py `device_name`). The
        harness's code_key hashes those records, so a new record invalidates the points it would change."""
        return None

    @classmethod
    def peer_files(cls) -> dict[str, Path]:
        """The files outside the repository's source folders whose code this backend runs (a peer's kernels, loaded
        from where they are installed), by a name relative to the peer's own folder, never an absolute path. The
        harness's code_key hashes their content under those names, so an edited peer file re-measures the points
        that ran it. Empty where there are none, or where the peer is not found (the backend is then unavailable)."""
        return {}

    def supports(self, problem: Problem) -> tuple[bool, str]:
        return True, ""

    @classmethod
    def target(cls, device: torch.device) -> str:
        """Which of impls.defaults.TARGETS `device` is for this backend (its DEFAULTS are declared per target)."""
        return defaults.device_target(device)

    @classmethod
    def switch_refusal(cls, switches) -> str | None:
        """Why the backend refuses this combination of switches wherever it runs (the text its constructor raises),
        or None; checks of the Switches dataclass's own (__post_init__) raise when it is built."""
        return None

    # --- which arrangement runs a call ----------------------------------------------------------------------
    def input_refusal(self, entry: str, args: dict[str, Any]) -> str | None:
        """Why these switches cannot run the public entry `entry` on `args` (its tensors by argument name, and
        state_dtype) though the contract accepts them (a tensor a TMA descriptor cannot read, ...), or None.
        Asked only where the target's defaults declare a next arrangement; the stage's own check stays the guard."""
        return None

    @property
    def falls_back(self) -> bool:
        """Whether a call may run another arrangement: its target's defaults declare one after this one (the public
        entries then ask `arranged_for`)."""
        return self.resolved is not None and len(self.resolved.arrangements) > 1

    def arranged_for(self, entry: str, **args) -> Backend:
        """The backend that runs a call of `entry` on `args`: this one, or where its arrangement refuses them, the
        first later arrangement of its target's defaults that takes them (built once per refusal text). That one's
        describe() names it and why the earlier ones refused, and so does this one's until the next call. Where
        every arrangement refuses (the caller's own switches are in all of them), this one: its stage raises."""
        chosen = (self._first_taking(entry, args) or self) if self.falls_back else self
        self.ran = chosen.ran = chosen
        return chosen

    def _first_taking(self, entry: str, args: dict[str, Any]) -> Backend | None:
        """This arrangement if it takes the inputs, else the first later one that does; None when none does."""
        why = self.input_refusal(entry, args)
        if not why:
            return self
        if len(self.resolved.arrangements) == 1:
            return None
        return get_backend(self.name, self.resolved.following(why))._first_taking(entry, args)

    def check_device(self, device: torch.device) -> tuple[bool, str]:
        """Whether tensors on `device` can be handled (e.g. GPU-only kernels refuse CPU tensors)."""
        return True, ""

    # --- what precision the matmuls run at ----------------------------------------------------------------
    def precision(self, stage: str, dtype: torch.dtype, device=None) -> str:
        """The precision of `stage`'s matmuls on `dtype` inputs: "tf32" where float32 operands go through tf32
        tensor cores, else the input dtype's name; "none" for a stage without a matmul (chunk_cumsum). The
        correctness gate, the tests and the result rows take the tolerance from it."""
        if stage == "chunk_cumsum":
            return "none"
        if dtype == torch.float32 and self.tf32_matmuls(stage, torch.device(device or "cpu")):
            return "tf32"
        return str(dtype).replace("torch.", "")

    def tf32_matmuls(self, stage: str, device: torch.device) -> bool:
        """Whether `stage`'s float32 matmuls run in tf32 on `device`; by default torch's own matmul setting
        (the reference's einsums)."""
        return device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32

    # --- the three stages (see impls/README.md for the contract) ------------------------------------------
    def chunk_cumsum(self, dt, A, chunk_size, dt_bias, dt_softplus, dt_limit):
        raise NotImplementedError

    def fwd_pass_state(self, B, x, dt, dA_cumsum, initial_states, seq_idx, state_dtype):
        raise NotImplementedError

    def compute_out(self, C, B, x, dt, dA_cumsum, states, D, z, seq_idx):
        raise NotImplementedError

    def varlen_states(self, B, x, dt, dA_cumsum, states, cu_seqlens):
        """Final state of every packed sequence; by default the vectorised PyTorch version."""
        from impls.reference.varlen import varlen_states

        return varlen_states(B, x, dt, dA_cumsum, states, cu_seqlens)

    def ssd_forward(self, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
                    dt_softplus, dt_limit, state_dtype):
        from impls.stages import own_initial_states, run_chain

        kw = dict(x=x, dt=dt, A=A, B=B, C=C, chunk_size=chunk_size, D=D, z=z, dt_bias=dt_bias,
                  initial_states=initial_states, seq_idx=seq_idx, dt_softplus=dt_softplus, dt_limit=dt_limit,
                  state_dtype=state_dtype)
        got = {name: t for outputs in run_chain(self, kw).values() for name, t in outputs.items()}
        varlen = None
        if cu_seqlens is not None:  # one initial state per packed sequence: read here too
            varlen = self.varlen_states(B, x, got["dt"], got["dA_cumsum"], got["states"], cu_seqlens,
                                        **own_initial_states(kw))
        return ForwardResult(got["y"], got["final_states"], varlen, got["dt"], got["dA_cumsum"], got["states"])

    def forward_parts(self, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
                      dt_softplus, dt_limit, state_dtype) -> dict[str, Callable[[], object]]:
        """The pieces of ssd_forward that the harness times apart, as zero-argument calls on ready inputs
        (a peer's adapter steps and its own kernels); none for a backend whose stages say it all."""
        return {}

    # --- the backward (impls.ssd) ------------------------------------------------------------------------
    def forward_for_backward(self, args: dict, needs: dict[str, bool]):
        """The forward on `args` (ssd_forward's keyword arguments) keeping what its backward needs: an object with
        `outputs` (a ForwardResult) and `backward({output: incoming grad}) -> {input: grad}`; `needs` says which
        inputs want a gradient (impls.api.GRAD_INPUTS). Raises for a backend without a backward."""
        raise BackendUnavailable(f"backend {self.name!r} has no backward: {self.NO_BACKWARD}")

    # --- what ran -------------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """What the last call ran: the backend, its switches, its tile protocol where the class declares one and,
        when built by name, its arrangement (impls.defaults.Resolved.record). A subclass adds its own keys; @register
        makes every describe() answer for the arrangement the last public call ran on."""
        if self.ran is not None and self.ran is not self:
            return self.ran.describe()
        out = {"backend": self.name, "switches": dataclasses.asdict(self.switches)}
        if self.TILE_PROTOCOL is not None:
            out["tile_protocol"] = self.TILE_PROTOCOL
        if self.resolved is not None:
            out["arrangement"] = self.resolved.record()
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.switches})"


class ForwardOnlyBackend(Backend):
    """A peer whose kernels have no stage split matching the contract: only `ssd_forward` (and `forward_parts`);
    the stage methods raise NotImplementedError with the subclass's NO_STAGES reason."""

    NO_STAGES: ClassVar[str] = "only the whole forward is available"

    def chunk_cumsum(self, dt, A, chunk_size, dt_bias, dt_softplus, dt_limit):
        raise NotImplementedError(self.NO_STAGES)

    def fwd_pass_state(self, B, x, dt, dA_cumsum, initial_states, seq_idx, state_dtype):
        raise NotImplementedError(self.NO_STAGES)

    def compute_out(self, C, B, x, dt, dA_cumsum, states, D, z, seq_idx):
        raise NotImplementedError(self.NO_STAGES)

    def varlen_states(self, B, x, dt, dA_cumsum, states, cu_seqlens):
        raise NotImplementedError(self.NO_STAGES + " (ssd_forward returns the per-sequence states with cu_seqlens)")


@dataclass
class ForwardResult:
    """What `ssd_forward` returns. `varlen_states` only with cu_seqlens; dt/dA_cumsum/states are the
    intermediates of the stages (the fused upstream forward returns them too)."""

    y: torch.Tensor
    final_states: torch.Tensor
    varlen_states: torch.Tensor | None = None
    dt: torch.Tensor | None = None
    dA_cumsum: torch.Tensor | None = None
    states: torch.Tensor | None = None


def make_switches(backend: str, switches_cls, cannot_express: dict[str, str], switches, overrides):
    given = dict(dataclasses.asdict(switches)) if dataclasses.is_dataclass(switches) else dict(switches or {})
    given.update(overrides)
    known = {f.name: f for f in dataclasses.fields(switches_cls)}
    for key, value in given.items():
        if key in cannot_express:
            raise ValueError(f"switch {key!r}: backend {backend!r} cannot express it ({cannot_express[key]})")
        if key not in known:
            raise ValueError(f"switch {key!r}: backend {backend!r} has no such switch; it has {sorted(known)}")
        expected = _switch_type_error(known[key], value)
        if expected:
            raise ValueError(f"switch {key!r} of backend {backend!r}: expected {expected}, got {value!r}")
    return switches_cls(**given)


def _switch_type_error(field: dataclasses.Field, value) -> str:
    """What `value` should have been for the switch `field` ("" when it fits): one of its choices, of the same type
    (True == 1 would pass `in (0, 1, 2)`), or a bool for a bool switch without choices (a string such as "no"
    would read as on)."""
    choices = field.metadata.get("choices")
    if choices is not None:
        ok = any(type(value) is type(c) and value == c for c in choices)
        return "" if ok else f"one of {choices}"
    if isinstance(field.default, bool) and not isinstance(value, bool):
        return "a bool"
    return ""


def pinned_version(dist: str, found: str | None, required: str) -> tuple[bool, str]:
    """available() of a backend built on a pinned package: (False, why) when it is missing or another version."""
    if found is None:
        return False, f"{dist} is not installed"
    if found != required:
        return False, f"{dist} {required} is pinned, found {found}"
    return True, ""


def cuda_only(device, what: str) -> tuple[bool, str]:
    """check_device() of a backend whose kernels run on CUDA devices only."""
    device = torch.device(device)
    if device.type != "cuda":
        return False, f"{what} run on CUDA devices only, got a {device.type} tensor"
    return True, ""


def register(cls: type[Backend]) -> type[Backend]:
    """Class decorator: makes a backend available by its `name`, with the STAGES and REQUIRES its package
    declares (impls/declaration.py); raises when the name has no declaration or a declared stage is missing."""
    if cls.name not in BACKEND_MODULES:
        raise ValueError(f"backend name {cls.name!r}: no impls/{cls.name}/__init__.py declares BACKEND = "
                         f"{cls.name!r} (impls/declaration.py); declared: {sorted(BACKEND_MODULES)}")
    for attr in ("STAGES", "REQUIRES"):
        if attr in vars(cls):
            raise ValueError(f"backend {cls.name!r}: {attr} is declared in impls/{cls.name}/__init__.py, "
                             f"not on the class")
    decl = declarations()[cls.name]
    missing = [s for s in decl.stages if s != "forward" and not _implements(cls, s)]
    if missing:
        raise ValueError(f"backend {cls.name!r} declares stages {missing} that {cls.__name__} does not implement")
    cls.STAGES = decl.stages
    cls.REQUIRES = decl.requires
    _check_defaults(cls)
    if "describe" in vars(cls):
        cls.describe = _describing_what_ran(vars(cls)["describe"])
    _REGISTRY[cls.name] = cls
    return cls


def _check_defaults(cls: type[Backend]) -> None:
    """Raises ValueError naming what is wrong in `cls.DEFAULTS`: a target that is not one of impls.defaults.TARGETS,
    a preset a target lists that is not declared, a preset value for a switch the backend does not have."""
    unknown = sorted(set(cls.DEFAULTS.targets) - set(defaults.TARGETS))
    if unknown:
        raise ValueError(f"backend {cls.name!r}: DEFAULTS targets {unknown}: expected some of {defaults.TARGETS}")
    known = {f.name for f in dataclasses.fields(cls.Switches)}
    for names in cls.DEFAULTS.targets.values():
        for preset in names:
            cls.DEFAULTS.preset(preset)  # ValueError naming the declared ones
    for preset, declared in cls.DEFAULTS.presets.items():
        bad = sorted({key for key, _ in declared.values} - known)
        if bad:
            raise ValueError(f"backend {cls.name!r}: preset {preset!r} sets {bad}, which are not its switches")


def _describing_what_ran(describe: Callable[[Backend], dict]) -> Callable[[Backend], dict]:
    """`describe` answering for the arrangement the instance's last public call ran on (Backend.arranged_for):
    that instance's describe(), where another arrangement ran; the backend's own describe() otherwise."""
    @functools.wraps(describe)
    def what_ran(self: Backend) -> dict:
        if self.ran is not None and self.ran is not self:
            return self.ran.describe()
        return describe(self)

    return what_ran


def _implements(cls: type[Backend], stage: str) -> bool:
    """Whether `cls` has `stage` beyond the base classes' NotImplementedError (a stage the base classes do not name,
    declared since in impls/stages.py, counts where the class defines it)."""
    own = getattr(cls, stage, None)
    return own is not None and all(own is not getattr(base, stage, None) for base in (Backend, ForwardOnlyBackend))


def backend_class(name: str) -> type[Backend]:
    if name not in BACKEND_MODULES:
        raise ValueError(f"backend: expected one of {sorted(BACKEND_MODULES)}, got {name!r}")
    if name not in _REGISTRY:
        try:
            importlib.import_module(BACKEND_MODULES[name])
        except ImportError as exc:
            raise BackendUnavailable(f"backend {name!r} cannot be imported: {exc}") from exc
    if name not in _REGISTRY:
        raise BackendUnavailable(f"backend {name!r}: module {BACKEND_MODULES[name]} registered nothing")
    return _REGISTRY[name]


def get_backend(name: str | Backend, switches=None, *, preset: str | None = None, device=None,
                **overrides) -> Backend:
    """The backend `name` on `device` (default: the current CUDA device, else the CPU): its target's defaults, or
    the preset named, with `switches` and `overrides` on top (the same instance for the same resolution; a whole
    Switches instance sets every switch; an impls.defaults.Resolved is taken as is). Raises BackendUnavailable if
    it cannot run in this process, ValueError for a switch or preset it does not have or a combination it refuses."""
    if isinstance(name, Backend):
        if switches or overrides or preset is not None:
            raise ValueError("switches: pass them when building the backend, not with a built one")
        return name
    by_name = switches is None and not overrides and preset is None
    if by_name:  # the public entry's by-name call: one lookup
        built = _BUILT.get((name, device))
        if built is not None:
            return built
    cls = backend_class(name)
    ok, reason = availability(cls)
    if not ok:
        raise BackendUnavailable(f"backend {name!r} is not available: {reason}")
    if isinstance(switches, Resolved):
        resolved = switches
    else:
        resolved = resolve_switches(cls, target_on(cls, device), preset, switches, overrides)
    built = _BUILT.get((name, resolved))
    if built is None:
        built = _BUILT[(name, resolved)] = cls(resolved.first.switches)
        built.resolved = resolved
    if by_name:
        _BUILT[(name, device)] = built
    return built


def target_on(cls: type[Backend], device=None) -> str | None:
    """The target of `device` (default: impls.defaults.default_device()) for `cls`; None, without asking about the
    device, where the backend declares no defaults per target."""
    if not cls.DEFAULTS.targets:
        return None
    return cls.target(defaults.default_device() if device is None else torch.device(device))


def resolve_switches(cls: type[Backend], target: str | None, preset: str | None = None, switches=None,
                     overrides: dict | None = None) -> Resolved:
    """How `cls` is built on `target` (None: a backend without defaults per target): the arrangements of its
    defaults there (or of `preset`), with the switches given (`switches`, then `overrides`) on top:
    impls.defaults.resolve. Nothing is built or launched."""
    given = dict(dataclasses.asdict(switches)) if dataclasses.is_dataclass(switches) else dict(switches or {})
    given.update(overrides or {})

    def build(values: dict):
        made = make_switches(cls.name, cls.Switches, cls.CANNOT_EXPRESS, values, {})
        why = cls.switch_refusal(made)
        if why:
            raise ValueError(why)
        return made

    return defaults.resolve(cls.DEFAULTS, target, preset, given, build)


def availability(cls: type[Backend]) -> tuple[bool, str]:
    """`cls.available()`, asked once per process (mamba_ssm's and the peers' read package metadata)."""
    if cls.name not in _AVAILABLE:
        _AVAILABLE[cls.name] = cls.available()
    return _AVAILABLE[cls.name]


def forget_built() -> None:
    """Forgets the built backends: impls.tuning.store calls it, so that a backend asked for after a new tuning
    record resolves its configs again (one that is held keeps what it resolved)."""
    _BUILT.clear()


def clear_cache() -> None:
    """Forgets the built backends and the availability answers (tests that change the environment call it)."""
    forget_built()
    _AVAILABLE.clear()


def require(backend: Backend, problem: Problem, device: torch.device) -> None:
    """Raises BackendUnavailable with the backend's reason if it cannot run `problem` on `device`."""
    own_states = (not problem.initial_states_per_sequence or not backend.NO_PER_SEQUENCE_INITIAL_STATES,
                  f"one initial state per sequence: {backend.NO_PER_SEQUENCE_INITIAL_STATES}")
    for ok, reason in (backend.check_device(device), own_states, backend.supports(problem)):
        if not ok:
            raise BackendUnavailable(f"backend {backend.name!r} does not support this problem: {reason}")


def list_backends() -> list[str]:
    """Every declared backend, by name; imports none of them."""
    return list(BACKEND_MODULES)


INF = math.inf
