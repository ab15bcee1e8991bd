"""Finds vLLM 0.33.0's Mamba-2 prefill kernel files and loads them without vLLM.

Only the genuine files of `vllm/model_executor/layers/mamba/ops/` (and the distribution's METADATA) are present:
scripts/install.sh extracts them from the wheel into `.peers/vllm-0.33.0/` of the project (CPU, CI); a GPU machine
without network access gets the same files in a folder on PYTHONPATH (docs/gpu-runbook.md). The rest of vLLM is absent,
so `import vllm.model_executor...` cannot work: those modules import `vllm.triton_utils` (triton and tl),
`vllm.platforms` (`current_platform`) and, in ssd_chunk_state.py, `softplus` from the sibling `mamba_ssm.py`,
which itself imports half of vLLM (custom ops, env, logger).

So the SSD modules are executed from their files as submodules of a private package (`_ssd_peer_vllm_ops`, so
their relative imports resolve among themselves), with minimal stand-ins:
- `vllm.triton_utils`: triton, triton.language, HAS_TRITON = True;
- `vllm.platforms.current_platform`: a CUDA device answers is_cuda(), is_device_capability(cc) from torch's view
  of device 0 (ssd_chunk_scan.py drops configs Triton miscompiles on sm_90 by asking it), is_cpu() and is_xpu()
  are False (True would swap in vLLM's CPU implementation, which is not here);
- `.mamba_ssm`: impls/vllm/softplus.py, `softplus` only, the same expression as vLLM's Triton-3 branch (a CPU
  test compares the two functions' syntax trees, so a change in vLLM's file shows up);
- vLLM's own `triton_helpers.py` (genuine) under the absolute name its users import it by.
The `vllm.*` stand-ins sit in `sys.modules` only while the files execute and are removed afterwards. Loading
probes the GPU only where CUDA is available (device capability, for the config filter above), never at import.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import os
import sys
import types
from pathlib import Path

VERSION_REQUIRED = "0.33.0"
OPS = Path("vllm/model_executor/layers/mamba/ops")
OPS_PACKAGE = "vllm.model_executor.layers.mamba.ops"
PRIVATE = "_ssd_peer_vllm_ops"  # never collides with vLLM's own module names
# dependency order: each file imports only ones before it (plus the stand-ins)
SSD_FILES = ("triton_helpers", "ssd_bmm", "ssd_chunk_state", "ssd_state_passing", "ssd_chunk_scan", "ssd_combined")
REPO = Path(__file__).resolve().parents[2]
ENV_DIR = "SSD_VLLM_DIR"  # a folder holding vllm/model_executor/layers/mamba/ops/ (takes precedence)

_module: types.SimpleNamespace | None = None


def install_dir(version: str = VERSION_REQUIRED) -> Path:
    """Where scripts/install.sh extracts the files (ignored by git)."""
    return REPO / ".peers" / f"vllm-{version}"


def candidates() -> list[Path]:
    """Folders that may hold `vllm/model_executor/layers/mamba/ops/`, in the order they are tried:
    $SSD_VLLM_DIR, the install script's folder, then every sys.path entry (the GPU bundle's site folder)."""
    out = [Path(os.environ[ENV_DIR])] if os.environ.get(ENV_DIR) else []
    out.append(install_dir())
    out += [Path(p) for p in sys.path if p]
    return out


def find_root() -> Path | None:
    """The first candidate folder holding vLLM's SSD kernel files, else None."""
    for root in candidates():
        if (root / OPS / "ssd_combined.py").is_file():
            return root
    return None


def version(root: Path | None = None) -> str | None:
    """vLLM's version as its METADATA beside the kernel files states it; None when no files or no METADATA."""
    root = root or find_root()
    if root is None:
        return None
    for meta in sorted(root.glob("vllm-*.dist-info/METADATA")):
        for line in meta.read_text(errors="replace").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return None


def kernel_files(root: Path | None = None) -> dict[str, Path]:
    """The files load() executes, by their path under the folder found (Backend.peer_files); empty when none is."""
    root = root or find_root()
    if root is None:
        return {}
    return {(OPS / f"{name}.py").as_posix(): root / OPS / f"{name}.py" for name in SSD_FILES}


def where() -> str:
    """What to tell a user when the files are missing."""
    return (f"vLLM {VERSION_REQUIRED}'s SSD kernel files ({OPS}/*.py) were not found under ${ENV_DIR}, "
            f"{install_dir()} (scripts/install.sh puts them there) or sys.path (the GPU bundle's setup.sh)")


# --- the stand-ins ------------------------------------------------------------------------------------------
class _Platform:
    """The four questions the SSD files ask `vllm.platforms.current_platform`."""

    @staticmethod
    def is_cuda() -> bool:
        import torch

        return torch.cuda.is_available() and torch.version.hip is None

    @staticmethod
    def is_cpu() -> bool:
        return False

    @staticmethod
    def is_xpu() -> bool:
        return False

    @classmethod
    def is_device_capability(cls, capability, device_id: int = 0) -> bool:
        import torch

        if not cls.is_cuda():
            return False
        major, minor = torch.cuda.get_device_capability(device_id)
        if isinstance(capability, tuple):
            return (major, minor) == tuple(capability)
        return major * 10 + minor == capability


def _triton_utils() -> types.ModuleType:
    import triton
    import triton.language as tl

    mod = types.ModuleType("vllm.triton_utils")
    mod.triton, mod.tl, mod.HAS_TRITON = triton, tl, True
    return mod


def _platforms() -> types.ModuleType:
    mod = types.ModuleType("vllm.platforms")
    mod.current_platform = _Platform()
    return mod


def genuine_softplus_tree(root: Path) -> str | None:
    """ast.dump of vLLM's own Triton-3 `softplus` (the `if TRITON3:` branch of ops/mamba_ssm.py), for the test
    that the stand-in computes the same expression; None when the file has no such function."""
    tree = ast.parse((root / OPS / "mamba_ssm.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TRITON3":
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == "softplus":
                    return ast.dump(fn)
    return None


def stand_in_softplus_tree() -> str:
    tree = ast.parse((Path(__file__).parent / "softplus.py").read_text())
    return next(ast.dump(fn) for fn in tree.body if isinstance(fn, ast.FunctionDef) and fn.name == "softplus")


# --- loading ------------------------------------------------------------------------------------------------
def _from_file(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


@contextlib.contextmanager
def _stand_ins(helpers: dict[str, types.ModuleType]):
    """The `vllm.*` names the SSD files import by absolute name, present only while they execute."""
    entries = {"vllm.triton_utils": _triton_utils(), "vllm.platforms": _platforms(), **helpers}
    saved = {n: sys.modules[n] for n in entries if n in sys.modules}
    try:
        sys.modules.update(entries)
        yield
    finally:
        for n in entries:
            sys.modules.pop(n, None)
        sys.modules.update(saved)


def loaded() -> types.SimpleNamespace | None:
    """The modules if load() has run in this process, else None (never loads)."""
    return _module


def load() -> types.SimpleNamespace:
    """vLLM's SSD modules by short name (ssd_combined, ssd_chunk_scan, ...), loaded once; ImportError with the
    reason when the files are missing or another version."""
    global _module
    if _module is not None:
        return _module
    root = find_root()
    if root is None:
        raise ImportError(where())
    found = version(root)
    if found != VERSION_REQUIRED:
        raise ImportError(f"vLLM {VERSION_REQUIRED} is pinned, found {found} at {root}")
    package = types.ModuleType(PRIVATE)
    package.__path__ = [str(root / OPS)]
    package.__package__ = PRIVATE
    sys.modules[PRIVATE] = package
    from impls.vllm import softplus  # decorates a Triton function: only now, never at import

    sys.modules[f"{PRIVATE}.mamba_ssm"] = softplus
    mods: dict[str, types.ModuleType] = {}
    try:
        with _stand_ins({}):
            mods["triton_helpers"] = _from_file(f"{PRIVATE}.triton_helpers", root / OPS / "triton_helpers.py")
        with _stand_ins({f"{OPS_PACKAGE}.triton_helpers": mods["triton_helpers"]}):
            for name in SSD_FILES[1:]:
                mods[name] = _from_file(f"{PRIVATE}.{name}", root / OPS / f"{name}.py")
    except BaseException:
        for name in [n for n in sys.modules if n == PRIVATE or n.startswith(PRIVATE + ".")]:
            sys.modules.pop(name)
        raise
    _module = types.SimpleNamespace(root=root, version=found, **mods)
    return _module
