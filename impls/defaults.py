"""Switch defaults per target: which named sets of a backend's switches run where, and in which order.

A backend declares `DEFAULTS = Defaults(presets={...}, targets={...})` (impls/<name>/defaults.py): a preset is a
named set of switch values over its Switches dataclass's declared values ("declared" always exists: no values);
a target (TARGETS: the device a backend runs on) lists the presets its defaults try, in order. A target not listed
runs "declared"; a backend that declares no target is resolved without one (the device is not asked about).
`resolve` composes them with the switches the caller set into the `Resolved` a backend is built from
(impls/registry.py `get_backend`):

- the caller's switches always win: a preset value they contradict (a combination the backend refuses) goes back
  to its declared value, and the arrangement records it as yielded, with the refusal;
- the first arrangement runs unless a call's inputs are ones it refuses (`Backend.input_refusal`: a tensor a TMA
  descriptor cannot read, ...); the call then runs the first later one that takes them, and describe() names it
  and why the earlier ones refused. The caller's switches are in every arrangement, so a refusal that is theirs
  raises as before.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

TARGETS = ("sm_90", "sm_100", "interpreter", "cpu", "other")
CUDA_TARGETS = {9: "sm_90", 10: "sm_100"}  # compute capability major -> target; other CUDA devices: "other"
DECLARED = "declared"  # the preset of no values: the Switches dataclass as declared


@dataclass(frozen=True)
class Chosen:
    """Committed rows that measured a preset on one card: the card (gpu_name, as the rows record it), the rows file
    (results/<folder>/<file>), how many sets of the backend's switches those rows ran at `shapes` in `direction`, and
    that direction and those shapes (the forward at S1–S4 unless named). With several sets, the preset is the set of
    the fastest geomean over the shapes among them; with one, the rows show the preset's times but chose it against
    no other set. A forward choice speaks for the switches the forward reads: the backward's own switches (`bwd_*`)
    are chosen by rows of the backward. tests/analysis/test_switch_defaults.py checks both against the rows."""

    card: str
    rows: str
    sets: int
    note: str = ""  # what a reader should know of the comparison (tiles that differ, rounds)
    direction: str = "forward"  # or "backward": the rows' stage compared
    shapes: tuple[str, ...] = ("S1", "S2", "S3", "S4")

    def __post_init__(self):
        if self.direction not in ("forward", "backward"):
            raise ValueError(f"direction: expected 'forward' or 'backward', got {self.direction!r}")
        if not self.shapes:
            raise ValueError("shapes: name at least one shape")

    def describe(self) -> str:
        shapes = "S1–S4" if self.shapes == ("S1", "S2", "S3", "S4") else ", ".join(self.shapes)
        where = f"{self.direction} at {shapes}"
        how = (f"the fastest {where} (geomean) of the {self.sets} sets of its switches these rows ran"
               if self.sets > 1 else f"the only set of its switches these rows ran ({where}: its times; chosen "
                                     "there against no other set)")
        return f"on {self.card}: {self.rows}: {how}" + (f"; {self.note}" if self.note else "")


@dataclass(frozen=True)
class Preset:
    """A named set of switch values, where they come from (the committed rows, a document), and the committed rows
    that measured it per card (`chosen_by`)."""

    values: tuple[tuple[str, Any], ...]
    source: str
    chosen_by: tuple[Chosen, ...] = ()

    @classmethod
    def of(cls, source: str, chosen_by: tuple[Chosen, ...] = (), **values) -> Preset:
        return cls(tuple(values.items()), source, tuple(chosen_by))


@dataclass(frozen=True)
class Defaults:
    """A backend's presets by name and, per target, the presets its defaults try in order."""

    presets: Mapping[str, Preset] = field(default_factory=dict)
    targets: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def preset(self, name: str) -> Preset:
        if name == DECLARED:
            return Preset((), "the Switches dataclass's declared values")
        if name not in self.presets:
            raise ValueError(f"preset: expected one of {sorted({DECLARED, *self.presets})}, got {name!r}")
        return self.presets[name]

    def order(self, target: str | None) -> tuple[str, ...]:
        """The presets the defaults of `target` try, in order (None: a backend without defaults per target)."""
        if target is None and not self.targets:
            return (DECLARED,)
        if target not in TARGETS:
            raise ValueError(f"target: expected one of {TARGETS}, got {target!r}")
        return self.targets.get(target, (DECLARED,))


@dataclass(frozen=True)
class Arrangement:
    """One preset composed with the caller's switches: the switches that run, and the preset's values that went
    back to their declared ones because the caller's switches refuse them, (switch, why)."""

    preset: str
    switches: Any
    yielded: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Resolved:
    """How a backend built by name was resolved: its target, its arrangements in order (the first runs unless it
    refuses a call's inputs) and the earlier ones that refused this call's inputs, (preset, why)."""

    target: str | None  # None: the backend declares no defaults per target (the device was not asked about)
    arrangements: tuple[Arrangement, ...]
    refused: tuple[tuple[str, str], ...] = ()

    @property
    def first(self) -> Arrangement:
        return self.arrangements[0]

    def following(self, why: str) -> Resolved:
        """The resolution of the next arrangement, recording that the first refused the inputs and why."""
        return Resolved(self.target, self.arrangements[1:], (*self.refused, (self.first.preset, why)))

    def record(self) -> dict[str, Any]:
        """What describe() reports: the target, the preset that ran, what yielded and what refused before it."""
        out: dict[str, Any] = {"target": self.target, "preset": self.first.preset,
                               "then": [a.preset for a in self.arrangements[1:]]}
        if self.first.yielded:
            out["yielded"] = dict(self.first.yielded)
        if self.refused:
            out["refused"] = dict(self.refused)
        return out


def resolve(defaults: Defaults, target: str | None, preset: str | None, given: Mapping[str, Any],
            build: Callable[[dict], Any]) -> Resolved:
    """The arrangements of `target`'s defaults (or of `preset` alone, when the caller names one) with the caller's
    switches `given` on top; `build(values)` makes the Switches or raises ValueError with the backend's refusal.
    A later arrangement is dropped where it changes, from the first, a switch the caller set to another value (it
    would replace the caller's switch: their refusal raises instead), or where it comes out equal to an earlier one."""
    names = (preset,) if preset is not None else defaults.order(target)
    declared = build({})
    arrangements: list[Arrangement] = []
    for name in names:
        if arrangements and overrides_caller(declared, defaults.preset(names[0]), defaults.preset(name), given):
            continue
        arrangement = compose(name, defaults.preset(name), given, build)
        if all(a.switches != arrangement.switches for a in arrangements):
            arrangements.append(arrangement)
    return Resolved(target, tuple(arrangements))


def overrides_caller(declared, first: Preset, later: Preset, given: Mapping[str, Any]) -> bool:
    """Whether `later` sets differently from `first` (both over the `declared` Switches) a switch the caller set,
    to a value other than theirs."""
    a, b = dict(first.values), dict(later.values)
    return any(a.get(k, getattr(declared, k)) != b.get(k, getattr(declared, k)) != given[k]
               for k in given if k in a or k in b)


def compose(name: str, preset: Preset, given: Mapping[str, Any], build: Callable[[dict], Any]) -> Arrangement:
    """The caller's switches `given` over the declared values, then each of `preset`'s values the caller did not
    set, kept where what is set so far with it is a combination the backend takes; passes repeat while one is kept
    (a value refused first may go with one kept after it). The rest yield, recorded with the refusal. Where what the
    caller set is refused with every value, it raises, as it always did."""
    values, yielded = dict(given), {}
    pending = [(key, value) for key, value in preset.values if key not in given]
    kept = True
    while kept:
        kept = False
        for key, value in pending:
            if key in values:
                continue
            why = _refusal(build, {**values, key: value})
            if why:
                yielded[key] = why
            else:
                values[key] = value
                yielded.pop(key, None)
                kept = True
    return Arrangement(name, build(values), tuple(yielded.items()))


def _refusal(build: Callable[[dict], Any], values: dict) -> str:
    try:
        build(values)
    except ValueError as exc:
        return str(exc)
    return ""


def device_target(device: torch.device | str) -> str:
    """The target of a device: "cpu" off CUDA, else by compute capability (asked once per device index)."""
    device = torch.device(device)
    if device.type != "cuda":
        return "cpu"
    return _cuda_target(torch.cuda.current_device() if device.index is None else device.index)


@functools.cache
def _cuda_target(index: int) -> str:
    major, _ = torch.cuda.get_device_capability(index)
    return CUDA_TARGETS.get(major, "other")


def default_device() -> torch.device:
    """Where a backend built without a device runs: the current CUDA device, or the CPU where CUDA is absent."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
