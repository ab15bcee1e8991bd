"""`python -m impls.vllm.extract`: puts vLLM's SSD kernel files where impls/vllm/loader.py looks (scripts/install.sh
runs it). vLLM is never installed: its wheel (~340 MB) is downloaded once with `pip download --no-deps` into a cache
(~/.cache/ssd-peers/wheels, or $XDG_CACHE_HOME), and only `vllm/model_executor/layers/mamba/ops/*.py` and the
dist-info METADATA are extracted, into `.peers/vllm-<version>/` of the project (ignored by git): the same files and
layout as the GPU bundle's `vllm-ssd-<version>.tar.gz`. The folder appears complete or not at all (extracted beside
it, then renamed).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from impls.vllm import loader

# One wheel for every machine, whatever this machine is: only its pure-Python files are used, so the platform of
# the wheel does not matter, and pinning it gives every machine the same files.
WHEEL_TAGS = ("--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
              "--platform", "manylinux_2_28_x86_64")


def wanted(name: str) -> bool:
    """The wheel members that travel: the ops folder's own .py files (not its subfolders) and METADATA."""
    ops = f"{loader.OPS.as_posix()}/"
    in_ops = name.startswith(ops) and name.endswith(".py") and "/" not in name[len(ops):]
    return in_ops or (".dist-info/" in name and name.endswith("/METADATA") and name.count("/") == 1)


def extract(wheel: Path, dest: Path) -> list[str]:
    """Extracts the wanted members of `wheel` into `dest` (replaced as a whole); returns their names."""
    with zipfile.ZipFile(wheel) as z:
        members = sorted(n for n in z.namelist() if wanted(n))
        if not any(n.endswith("/ssd_combined.py") for n in members):
            raise ValueError(f"{wheel}: no {loader.OPS}/ssd_combined.py in this wheel")
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
        try:
            z.extractall(tmp, members=members)
            if dest.exists():
                shutil.rmtree(dest)
            os.replace(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return members


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ssd-peers" / "wheels"


def wheel_path(version: str, cache: Path) -> Path:
    """The cached wheel of `version`, downloaded with `pip download --no-deps` when absent."""
    found = sorted(cache.glob(f"vllm-{version}-*.whl"))
    if not found:
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", *WHEEL_TAGS, "-d", str(cache),
                        f"vllm=={version}"], check=True)
        found = sorted(cache.glob(f"vllm-{version}-*.whl"))
    if not found:
        raise FileNotFoundError(f"pip download left no vllm-{version}-*.whl in {cache}")
    return found[0]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--version", default=loader.VERSION_REQUIRED)
    p.add_argument("--wheel", type=Path, help="a wheel already on disk (default: the cached download)")
    p.add_argument("--dest", type=Path, help="default: .peers/vllm-<version> of the project")
    args = p.parse_args(argv)
    dest = args.dest or loader.install_dir(args.version)
    if (dest / loader.OPS / "ssd_combined.py").is_file() and loader.version(dest) == args.version:
        print(f"vllm {args.version} SSD files already in {dest}")
        return 0
    members = extract(args.wheel or wheel_path(args.version, cache_dir()), dest)
    print(f"vllm {loader.version(dest)}: {len(members)} files into {dest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
