"""What is there: `python -m impls backends | switches <backend> | supports <backend> --shape S1`.

`backends` lists every declared backend (impls/declaration.py): the stages it can time and the package versions
it declares, with those installed. It imports no backend: one whose declared packages are missing or at another
version is reported unavailable from the installed metadata alone; `backends --check` imports the others and asks
each whether it can run in this process (or why not), which imports cuda.tile, mamba_ssm, fla where they are.
`switches` prints which preset of a backend's switches is the default on each target (impls/defaults.py), the
committed rows that measured it on each card (results/<folder>/<file>, and whether they compared it with other
sets), the presets, and its switch table (impls.registry.switch_table); `supports` says whether a backend can
run a problem of a shape from conf/shape/ (ok, or the backend's reason).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import sys
from pathlib import Path

from impls.declaration import Declaration, declarations
from impls.defaults import DECLARED, TARGETS
from impls.problem import Problem, Shape
from impls.registry import Backend, backend_class, list_backends, resolve_switches, switch_table

SHAPE_DIR = Path(__file__).resolve().parents[1] / "conf" / "shape"
SHAPE_FIELDS = ("batch", "seqlen", "nheads", "headdim", "ngroups", "dstate", "chunk_size")


def _release(version: str) -> tuple[int, ...]:
    """The leading numeric release of a version string: "2.13.0+cpu" -> (2, 13, 0)."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3])


def version_matches(found: str, required: str) -> bool:
    """`required` is ">=X.Y", "X.Y.*" (any release of X.Y) or an exact version."""
    if required.startswith(">="):
        return _release(found) >= _release(required[2:])
    if required.endswith(".*"):
        return found == required[:-2] or found.startswith(required[:-1])
    return found == required


def installed(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def declared_packages(decl: Declaration) -> tuple[list[str], str]:
    """("dist pin (found X)" per pinned package, the first mismatch as a reason or "")."""
    lines, reason = [], ""
    for dist, required in decl.requires.items():
        found = installed(dist)
        lines.append(f"{dist} {required} (found {found or 'none'})")
        if not reason and found is None:
            reason = f"{dist} is not installed"
        elif not reason and not version_matches(found, required):
            reason = f"{dist} {required} is declared, found {found}"
    return lines, reason


def availability(name: str) -> tuple[type[Backend] | None, bool, str]:
    """(class or None, ok, reason), importing the backend. Never raises: an import failure or a raising check is
    the reason."""
    _, reason = declared_packages(declarations()[name])
    if reason:
        return None, False, reason
    try:
        cls = backend_class(name)
    except Exception as exc:  # BackendUnavailable, or a module raising at import
        return None, False, str(exc)
    try:
        ok, reason = cls.available()
    except Exception as exc:
        return cls, False, f"available() raised {type(exc).__name__}: {exc}"
    return cls, ok, reason


def cmd_backends(args) -> int:
    for name, decl in declarations().items():
        packages, reason = declared_packages(decl)
        cls = None
        if reason:
            status = "unavailable: " + reason
        elif args.check:
            cls, ok, why = availability(name)
            status = "available" if ok else "unavailable: " + why
        else:
            status = "declared packages installed (not imported; --check asks the backend)"
        print(f"{name}: {status}")
        print(f"  stages: {', '.join(decl.stages)}")
        print(f"  requires: {'; '.join(packages)}")
        if cls is not None:  # what its backward is (impls.ssd), or why it has none
            print(f"  backward: {cls.BACKWARD or 'none: ' + cls.NO_BACKWARD}")
    return 0


def _class_or_exit(name: str) -> type[Backend]:
    try:
        return backend_class(name)
    except Exception as exc:
        raise SystemExit(f"backend {name!r}: {exc}") from exc


def cmd_switches(args) -> int:
    cls = _class_or_exit(args.backend)
    rows = switch_table(cls.Switches)
    if not rows:
        print(f"{args.backend}: no switches")
        return 0
    firsts = _print_defaults(cls)
    print("switches (default: the declared value; then each target's default where it differs):")
    for row in rows:
        choices = f" choices {row['choices']}" if row["choices"] is not None else ""
        where = "".join(f", on {t} {getattr(sw, row['name'])!r}" for t, sw in firsts.items()
                        if getattr(sw, row["name"]) != row["default"])
        print(f"{row['name']} (default {row['default']!r}{where}){choices}")
        if row["sm90"] == row["sm100"]:
            print(f"  {row['sm90']}")
        else:
            print(f"  sm_90: {row['sm90']}\n  sm_100: {row['sm100']}")
    return 0


def _print_defaults(cls: type[Backend]) -> dict:
    """Prints which preset is the default on each target (then the next ones, for inputs the first refuses), the
    committed rows that measured it on each card (Preset.chosen_by: card, rows, how many sets they compared), and
    every preset's values; returns each target's first switches."""
    print(f"{cls.name}: defaults per target (impls/defaults.py; get_backend(..., preset=<name>) or "
          "backend.preset=<name> runs one preset instead):")
    firsts = {}
    for target in cls.DEFAULTS.targets:
        resolved = resolve_switches(cls, target)
        names = [a.preset for a in resolved.arrangements]
        then = f" (then, for inputs it refuses: {', '.join(names[1:])})" if names[1:] else ""
        print(f"  {target}: {names[0]}{then}")
        chosen = cls.DEFAULTS.preset(names[0]).chosen_by
        for rows in chosen:
            print(f"    {rows.describe()}")
        if not chosen and names[0] != DECLARED:
            print("    no committed rows measured it on a card of this target")
        firsts[target] = resolved.first.switches
    others = [t for t in TARGETS if t not in firsts]
    if others:
        print(f"  {', '.join(others)}: {DECLARED}")
    print("presets:")
    for name in (DECLARED, *cls.DEFAULTS.presets):
        preset = cls.DEFAULTS.preset(name)
        values = " ".join(f"{k}={v!r}" for k, v in preset.values) or "no values"
        print(f"  {name}: {values} ({preset.source})")
    return firsts


def load_shape(name: str) -> Shape:
    """A shape of conf/shape/<name>.yaml; raises ValueError naming the known ones (a path such as ../config is
    not a shape name: it would read another group's file)."""
    known = sorted(p.stem for p in SHAPE_DIR.glob("*.yaml"))
    if name not in known:
        raise ValueError(f"--shape: expected one of {known}, got {name!r}")
    path = SHAPE_DIR / f"{name}.yaml"
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(path)
    return Shape(*(int(cfg[f]) for f in SHAPE_FIELDS))


def cmd_supports(args) -> int:
    cls = _class_or_exit(args.backend)
    try:
        shape = load_shape(args.shape)
    except ValueError as exc:
        raise SystemExit(str(exc)) from exc
    problem = Problem(shape, dtype=args.dtype)
    ok, reason = cls().supports(problem)
    print(f"{args.backend} {args.shape} {args.dtype}: {'ok' if ok else 'not supported: ' + reason}")
    _, here, why = availability(args.backend)
    if not here:
        print(f"  (not available in this process: {why})")
    return 0 if ok else 1


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m impls", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    ba = sub.add_parser("backends", help="every backend: stages, declared versions, installed or why not")
    ba.add_argument("--check", action="store_true",
                    help="import each backend whose packages are installed and ask whether it can run here")
    ba.set_defaults(run=cmd_backends)
    sw = sub.add_parser("switches", help="a backend's defaults per target, presets, and switches: default, "
                                         "choices, meaning on sm_90 and sm_100")
    sw.add_argument("backend", choices=list_backends())
    sw.set_defaults(run=cmd_switches)
    su = sub.add_parser("supports", help="whether a backend can run a shape of conf/shape/ (ok, or the reason)")
    su.add_argument("backend", choices=list_backends())
    su.add_argument("--shape", required=True, help="a conf/shape/ name, e.g. S1")
    su.add_argument("--dtype", default="bfloat16", choices=["float32", "float16", "bfloat16", "float64"])
    su.set_defaults(run=cmd_supports)
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
