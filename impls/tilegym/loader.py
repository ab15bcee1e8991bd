"""Loads TileGym's cuTile Mamba-2 module (`tilegym/ops/cutile/mamba2.py`) and nothing else of TileGym.

Why not `import tilegym.ops.cutile.mamba2`: that runs `tilegym/__init__`, which imports `tilegym.ops` (every op of
every backend; `tilegym/ops/triton/attention_variant.py` calls `torch.cuda.get_device_capability()` at import, so
the import crashes on a CPU machine) and, in tilegym 1.5.1, `transformers` (pinned to an old release; TileGym is
installed here without its dependencies). The Mamba-2 module itself only needs `cuda.tile`, torch, and two names
from TileGym: `tilegym.autotune.is_autotune_disabled` (a self-contained file: reads TILEGYM_DISABLE_AUTOTUNE) and
`tilegym.backend.register_impl` (a decorator that files the function in TileGym's op dispatcher, which this project
does not use).

So: the file is executed from its own spec under a private module name, while, for the duration of that one
exec, `sys.modules` holds a bare `tilegym` package (its `__init__` not run), TileGym's real `autotune.py` (loaded
from its file) and a stand-in `tilegym.backend` whose `register_impl` records what was registered. The stand-ins
are removed afterwards, so a later genuine `import tilegym` in the same process behaves as usual. Nothing here
touches the GPU: cuTile compiles a kernel on its first launch, not when the module defines it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import types
from pathlib import Path

from impls.declaration import declared
from impls.registry import installed_files

MODULE_NAME = "_ssd_peer_tilegym_mamba2"  # private: never collides with TileGym's own module name
VERSION_REQUIRED = declared("tilegym").pin("tilegym")  # impls/tilegym/__init__.py PACKAGES

LOADED = ("ops/cutile/mamba2.py", "autotune.py")  # the files of TileGym that load() executes

registered: dict[str, object] = {}  # what mamba2.py handed to register_impl (op name -> function)
_module = None


def tilegym_dir() -> Path:
    """TileGym's install folder, found without importing it."""
    spec = importlib.util.find_spec("tilegym")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("tilegym is not installed")
    return Path(list(spec.submodule_search_locations)[0])


def kernel_files() -> dict[str, Path]:
    """LOADED by "tilegym/<path>" where TileGym is installed (Backend.peer_files); empty where it is not."""
    return installed_files("tilegym", *LOADED)


def version() -> str | None:
    try:
        from importlib.metadata import version as _v

        return _v("tilegym")
    except Exception:
        return None


def _from_file(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _register_impl(name: str, backend: str):
    def decorator(func):
        registered[f"{name}/{backend}"] = func
        return func

    return decorator


@contextlib.contextmanager
def _stand_ins(root: Path):
    """The three `tilegym*` entries mamba2.py imports from, present only while it is executed."""
    names = ("tilegym", "tilegym.autotune", "tilegym.backend")
    saved = {n: sys.modules[n] for n in names if n in sys.modules}
    package = types.ModuleType("tilegym")
    package.__path__ = [str(root)]  # a package whose __init__ never ran
    backend = types.ModuleType("tilegym.backend")
    backend.register_impl = _register_impl
    try:
        sys.modules["tilegym"] = package
        sys.modules["tilegym.autotune"] = _from_file("tilegym.autotune", root / "autotune.py")
        sys.modules["tilegym.backend"] = backend
        yield
    finally:
        for n in names:
            sys.modules.pop(n, None)
        sys.modules.update(saved)


def load() -> types.ModuleType:
    """TileGym's mamba2 module (loaded once); ImportError with the reason when TileGym or cuda.tile is missing."""
    global _module
    if _module is not None:
        return _module
    root = tilegym_dir()
    import cuda.tile  # noqa: F401  (fail here, with cuTile's own message, rather than inside the exec)

    if sys.modules.get("tilegym.ops.cutile.mamba2") is not None:
        # the real TileGym is already imported in this process: use its module, do not load a second copy
        _module = sys.modules["tilegym.ops.cutile.mamba2"]
        return _module
    with _stand_ins(root):
        module = _from_file(MODULE_NAME, root / "ops" / "cutile" / "mamba2.py")
    sys.modules[MODULE_NAME] = module
    _module = module
    return module
