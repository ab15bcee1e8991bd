"""The folders keep the architecture: experiments/ holds entry points only, and what is measured (the backends in
impls/, the model in models/, the pipeline in harness/ and its entry points) never imports the instruments package,
so an instrument can change without changing a measured number (and without the tree hashed into code_key)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("impls", "models", "harness", "experiments")
pytestmark = pytest.mark.quick
DYNAMIC_IMPORTS = ("import_module", "__import__", "run_module", "find_spec")


def _modules(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


def instruments_imports(source: str) -> list[str]:
    """The imports of the instruments package in a module's source: import statements anywhere in it (top level or
    inside a function), and importlib/runpy calls naming it."""
    def named(module) -> bool:
        return isinstance(module, str) and module.split(".")[0] == "instruments"

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if named(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and named(node.module):
            found.append(node.module)
        elif isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] in DYNAMIC_IMPORTS:
            found += [a.value for a in node.args if isinstance(a, ast.Constant) and named(a.value)]
    return found


@pytest.mark.parametrize("folder", PRODUCT)
def test_what_is_measured_never_imports_the_instruments(folder):
    offending = {str(p.relative_to(ROOT)): names for p in _modules(folder)
                 if (names := instruments_imports(p.read_text()))}
    assert not offending, f"{folder}/ imports the instruments package (split the run-time part into {folder}/): " \
                          f"{offending}"


@pytest.mark.parametrize("source", [
    "from instruments.cutile import aot",
    "def f():\n    import instruments.sass as s\n",
    "import importlib\nimportlib.import_module('instruments.profile')",
])
def test_the_check_sees_every_form_of_import(source):
    assert instruments_imports(source)


def test_experiments_holds_entry_points_only():
    """Every module of experiments/ but its __init__ is a `python -m` entry point; library code lives in harness/."""
    library = [p.name for p in _modules("experiments")
               if p.name != "__init__.py" and '__name__ == "__main__"' not in p.read_text()]
    assert not library, f"experiments/ holds library modules {library}: move them to harness/ (or instruments/)"
