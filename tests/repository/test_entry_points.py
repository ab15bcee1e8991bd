"""Every runnable module (a `python -m` module, a script under scripts/) answers --help and exits 0 before doing
anything: its `main(argv)` parses its arguments first, and nothing tracked changes (one of them used to start a
minutes-long compile that rewrote a tracked file)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("impls", "experiments", "harness", "instruments", "analysis", "models", "scripts")
HYDRA = {"experiments/bench.py": "Hydra's own entry: `python -m experiments.bench --help` is Hydra's help",
         "experiments/train_curves.py": "Hydra's own entry: `python -m experiments.train_curves --help` is Hydra's"}
# the command a runnable module is run by, where it is not `python -m <its module>`
COMMANDS = {"impls/cli.py": "python -m impls"}  # impls/__main__.py runs it


def _runnable() -> list[Path]:
    return [p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))
            if '__name__ == "__main__"' in p.read_text()]


ALLOWED = {"main", "sys.exit", "SystemExit", "sys.path.pop", "os.path.abspath", "os.path.dirname"}


def _main_block_calls_only_main(path: Path) -> bool:
    """The module's `if __name__ == "__main__":` blocks call `main` and nothing else of their own (one may set up
    sys.path first)."""
    calls = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            calls |= {ast.unparse(n.func) for n in ast.walk(node) if isinstance(n, ast.Call)}
    return "main" in calls and calls <= ALLOWED


def _load(path: Path):
    rel = path.relative_to(ROOT)
    if rel.parts[0] == "scripts":
        spec = importlib.util.spec_from_file_location(f"_script_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    return importlib.import_module(".".join(rel.with_suffix("").parts))


def _tracked_changes() -> str:
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                          text=True).stdout


@pytest.mark.parametrize("path", _runnable(), ids=lambda p: str(p.relative_to(ROOT)))
def test_help_exits_zero_before_doing_anything(path, capsys):
    rel = str(path.relative_to(ROOT))
    if rel in HYDRA:
        assert "hydra_entry" in path.read_text()
        return
    assert _main_block_calls_only_main(path), f"{rel}: its __main__ block should only call main(argv)"
    before = _tracked_changes()
    main = _load(path).main
    try:
        code = main(["--help"])
    except SystemExit as exc:
        code = exc.code
    assert code in (0, None), f"{rel} --help exited {code}"
    assert capsys.readouterr().out.strip(), f"{rel} --help printed nothing"
    assert _tracked_changes() == before, f"{rel} --help changed tracked files"


def _command(path: Path) -> str:
    rel = path.relative_to(ROOT)
    return COMMANDS.get(str(rel), "python -m " + ".".join(rel.with_suffix("").parts))


@pytest.mark.parametrize("path", [p for p in _runnable() if p.relative_to(ROOT).parts[0] != "scripts"],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_a_runnable_module_is_an_entry_point_that_says_so(path):
    """Only entry points are runnable: a module with a `__main__` block names its own command in its docstring (a
    library module has no `__main__` block)."""
    doc = " ".join((ast.get_docstring(ast.parse(path.read_text())) or "").split())
    assert _command(path) in doc, f"{path.relative_to(ROOT)}: runnable, but its docstring does not name " \
                                  f"`{_command(path)}` (an entry point says how it is run; a library is not runnable)"

