"""What each backend folder declares, read without importing it.

A backend is a folder `impls/<name>/` whose `__init__.py` assigns, at its top level and as plain literals:

    BACKEND = "<name>"                      # the folder's name
    STAGES = ("chunk_cumsum", "fwd_pass_state", "compute_out", "forward")   # what can be called and timed alone
    PACKAGES = {"torch": ("torch", ">=2.11"), "cuda_tile": ("cuda-tile", "1.7.0"), ...}

`PACKAGES` maps the result column `v_<key>` to (distribution, pin): the pin (">=X.Y", "X.Y.*" for any X.Y release,
or an exact version) is checked against the installed metadata before the backend is imported; a package pinned
`None` is only recorded. The registry lists backends from here, `python -m impls backends` prints it, the backend
class takes its STAGES and REQUIRES from it, harness/provenance.py records every declared package in each
result row and harness/store.py has a `v_<key>` column for each. docs/add-a-backend.md walks through it.

This module is parsed with `ast` only: listing the backends imports no backend, so neither cuda.tile, mamba_ssm,
fla, TileGym nor vLLM.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

from impls.stages import FORWARD_STAGE_NAMES

IMPLS = Path(__file__).resolve().parent
ALL_STAGES = (*FORWARD_STAGE_NAMES, "forward")  # the forward's stages (impls/stages.py) and the whole forward
FIELDS = ("BACKEND", "STAGES", "PACKAGES")


@dataclass(frozen=True)
class Declaration:
    """One backend folder's declaration."""

    name: str
    module: str  # impls.<name>, imported on first use
    stages: tuple[str, ...]
    packages: dict[str, tuple[str, str | None]]  # column key (v_<key>) -> (distribution, pin or None)

    @property
    def requires(self) -> dict[str, str]:
        """distribution -> pin, for the pinned packages."""
        return {dist: pin for dist, pin in self.packages.values() if pin is not None}

    def pin(self, dist: str) -> str:
        """The version `dist` is pinned to; KeyError naming the backend when it declares none."""
        if dist not in self.requires:
            raise KeyError(f"backend {self.name!r} declares no pin for {dist!r} (impls/{self.name}/__init__.py)")
        return self.requires[dist]


class DeclarationError(ValueError):
    """A backend folder's declaration is missing or malformed; the message names the file and the field."""


def _literals(path: Path) -> dict[str, object]:
    """The top-level `NAME = <literal>` assignments of FIELDS in `path`."""
    found: dict[str, object] = {}
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            key = node.targets[0].id
            if key in FIELDS:
                try:
                    found[key] = ast.literal_eval(node.value)
                except ValueError as exc:
                    raise DeclarationError(f"{path}: {key} must be a plain literal ({exc})") from exc
    return found


def _packages(path: Path, value) -> dict[str, tuple[str, str | None]]:
    if not isinstance(value, dict):
        raise DeclarationError(f"{path}: PACKAGES must be a dict column -> (distribution, pin or None)")
    out = {}
    for key, entry in value.items():
        ok = (isinstance(key, str) and key.isidentifier() and isinstance(entry, tuple) and len(entry) == 2
              and isinstance(entry[0], str) and (entry[1] is None or isinstance(entry[1], str)))
        if not ok:
            raise DeclarationError(f"{path}: PACKAGES[{key!r}] must be (distribution, pin or None), got {entry!r}")
        out[key] = entry
    return out


def read(folder: Path) -> Declaration | None:
    """The declaration of `folder`, None when its `__init__.py` declares no BACKEND (not a backend)."""
    init = folder / "__init__.py"
    if not init.is_file():
        return None
    found = _literals(init)
    if "BACKEND" not in found:
        return None
    name = found["BACKEND"]
    if name != folder.name:
        raise DeclarationError(f"{init}: BACKEND must be the folder's name {folder.name!r}, got {name!r}")
    stages = tuple(found.get("STAGES", ALL_STAGES))
    unknown = [s for s in stages if s not in ALL_STAGES]
    if unknown or not stages:
        raise DeclarationError(f"{init}: STAGES must be a non-empty subset of {ALL_STAGES}, got {stages}")
    if "PACKAGES" not in found:
        raise DeclarationError(f"{init}: PACKAGES is missing (column -> (distribution, pin or None))")
    return Declaration(name, f"impls.{name}", stages, _packages(init, found["PACKAGES"]))


@functools.cache
def declarations(root: Path = IMPLS) -> dict[str, Declaration]:
    """Every backend folder under `root`, by name (sorted)."""
    found = {}
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))):
        declared = read(folder)
        if declared is not None:
            found[declared.name] = declared
    return found


def declared(name: str) -> Declaration:
    """The declaration of backend `name`; ValueError naming the known ones."""
    known = declarations()
    if name not in known:
        raise ValueError(f"backend: expected one of {sorted(known)}, got {name!r}")
    return known[name]


def version_columns(harness: dict[str, str] | None = None) -> dict[str, str]:
    """Column key -> distribution over `harness` (packages of the harness itself) and every backend's PACKAGES;
    ValueError when two declare one column for different distributions."""
    columns = dict(harness or {})
    for decl in declarations().values():
        for key, (dist, _) in decl.packages.items():
            if columns.setdefault(key, dist) != dist:
                raise ValueError(f"v_{key}: backend {decl.name!r} declares {dist!r}, another {columns[key]!r}")
    return columns
