"""What a result was measured with: machine, GPU, versions, source tree. Anything missing is None or "absent";
nothing here raises (a benchmark must not die because nvidia-smi is not on the PATH)."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

import torch

from impls.declaration import version_columns

REPO = Path(__file__).resolve().parent.parent
# The packages of the harness itself; every backend's own are its declaration's PACKAGES (impls/declaration.py).
HARNESS_PACKAGES = {"torch": "torch", "wandb": "wandb", "hydra": "hydra-core"}
# column key (v_<key>) -> distribution: what every result row records
PACKAGES = version_columns(HARNESS_PACKAGES)


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


@functools.cache
def tileiras_version() -> str:
    """The wheel's version, else the `tileiras` on PATH (a machine set up from the wheel's files has the binary
    without the wheel's metadata), read off `tileiras --version` ("... V13.4.92"); "absent" if neither."""
    version = _version(PACKAGES["tileiras"])
    if version != "absent":
        return version
    tool = shutil.which("tileiras")
    text = _run([tool, "--version"]) if tool else None
    match = re.search(r"\bV(\d+\.\d+\.\d+)", text or "")
    return match.group(1) if match else "absent"


def vllm_version() -> str:
    """vLLM is never installed: only its SSD kernel files and METADATA are present (scripts/install.sh, the GPU
    bundle), so its version is read where impls/vllm/loader.py finds them, not from the installed distributions."""
    try:
        from impls.vllm import loader

        return loader.version() or "absent"
    except Exception:  # noqa: BLE001 - provenance never raises
        return "absent"


def _run(args: list[str], cwd=None) -> str | None:
    try:
        out = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


@functools.cache
def git_state() -> dict:
    """Labels of the source tree: its commit and dirty flag, recorded in every row but never part of code_key (which
    hashes the content). SSD_GIT_COMMIT / SSD_GIT_DIRTY (0 or 1), set by whoever sent the tree, come first: the
    offline GPU machine gets a copy of the working tree whose own .git (where it has one) is the checkout its first
    run started from, not the commit that was sent. Else the checkout's `git rev-parse HEAD` and status, only where
    the repository's root is this tree's (a copy placed inside another repository is not that repository's
    commit); else None."""
    sent = os.environ.get("SSD_GIT_COMMIT")
    if sent:
        dirty = os.environ.get("SSD_GIT_DIRTY")
        return {"git_commit": _full_commit(sent),
                "git_dirty": None if dirty is None else dirty.strip() not in ("", "0")}
    top = _run(["git", "rev-parse", "--show-toplevel"], cwd=REPO)
    commit = _run(["git", "rev-parse", "HEAD"], cwd=REPO) if top and Path(top).resolve() == REPO.resolve() else None
    if not commit:
        return {"git_commit": None, "git_dirty": None}
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO)
    untracked = _untracked_sources()
    return {"git_commit": commit,
            "git_dirty": None if status is None or untracked is None else bool(status) or bool(untracked)}


def _untracked_sources() -> list[str] | None:
    """Untracked, not ignored source and config files of the code folders (a new kernel module not yet added):
    they make the tree dirty; None where git cannot say."""
    out = _run(["git", "ls-files", "-z", "--others", "--exclude-standard", "--", *SOURCE_DIRS], cwd=REPO)
    if out is None:
        return None
    return sorted(name for name in out.split("\0") if Path(name).suffix in SOURCE_SUFFIXES)


# What code_key hashes of the tree: the code and configs that run a point. docs/, analysis/, notebooks/, tests/ and
# results/ stay out: editing them changes no measured number.
SOURCE_DIRS = ("impls", "models", "experiments", "harness", "conf")
SOURCE_SUFFIXES = (".py", ".yaml", ".json")


def content_hash(files: Mapping[str, Path]) -> str:
    """A hash of (name, content) pairs, in name order; the names are relative (never where the files lie), so
    the same files in two places hash alike. A file gone since it was listed hashes as missing."""
    digest = hashlib.sha256()
    for name in sorted(files):
        try:
            data = files[name].read_bytes()
        except OSError:
            data, name = b"", f"{name} (missing)"
        digest.update(f"{name}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()[:16]


def source_files(root: Path) -> dict[str, Path]:
    """The SOURCE_SUFFIXES files under root's SOURCE_DIRS, by posix path relative to root (hidden folders and
    caches left out)."""
    found = {}
    for folder in SOURCE_DIRS:
        for path in (root / folder).rglob("*"):
            rel = path.relative_to(root)
            if path.suffix in SOURCE_SUFFIXES and path.is_file() and not any(
                    part.startswith(".") or part == "__pycache__" for part in rel.parts):
                found[rel.as_posix()] = path
    return found


@functools.cache
def _tree_hash(root: Path) -> str:
    return content_hash(source_files(root))


def source_tree_hash() -> str:
    """The `tree:` part of code_key: the content of this tree's source files, read once per process (a point's
    code is the code its process imported at start)."""
    return _tree_hash(REPO)


def tuning_records_hash(backend: str, gpu_name: str) -> str:
    """A hash of the backend's tuning records for this GPU as they stand now ("none" when it has none)."""
    from impls import tuning

    folder = tuning.tuning_dir() / tuning.gpu_slug(gpu_name)
    files = sorted(folder.glob(f"{backend}_*.json")) if folder.is_dir() else []
    return content_hash({p.name: p for p in files}) if files else "none"


def driver_major(driver: str | None) -> str:
    """The driver's major version ("570" of "570.133.20"); "none" off the GPU or where nvidia-smi did not say."""
    return driver.split(".")[0].strip() if driver else "none"


def code_key(row: dict, backend: str, gpu_name: str, peer_files: Mapping[str, Path] | None = None) -> str:
    """What code measures a point, from content alone (not git, not paths):
    `tree:<source tree hash>|v:<v_* versions hash>|tuning:<records hash>|peer:<peer files hash>|driver:<major>`,
    the versions and driver read from the point's provenance row, the tuning records those of the backend for
    the GPU at the point's start, the peer files those the backend declares (`Backend.peer_files`). The git
    columns are labels, not part of it. bench.py skips a stored point only when its config hash and this key both
    match."""
    versions = {k: v for k, v in sorted(row.items()) if k.startswith("v_")}
    v_hash = hashlib.sha256(json.dumps(versions, sort_keys=True).encode()).hexdigest()[:8]
    peers = content_hash(peer_files) if peer_files else "none"
    return (f"tree:{source_tree_hash()}|v:{v_hash}|tuning:{tuning_records_hash(backend, gpu_name)}"
            f"|peer:{peers}|driver:{driver_major(row.get('driver'))}")


def _full_commit(ref: str) -> str:
    """The full hash of an abbreviated one where this checkout knows it, else the reference as given."""
    return _run(["git", "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], cwd=REPO) or ref


def _nvidia_smi(index: int) -> dict:
    fields = ["name", "uuid", "driver_version", "clocks.sm", "clocks.mem", "clocks.max.sm", "clocks.max.mem"]
    text = _run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits", "-i", str(index)])
    if not text:
        return {}
    values = [v.strip() for v in text.splitlines()[0].split(",")]
    return dict(zip(fields, values))


def gpu_info(device: torch.device) -> dict:
    info = {"gpu_name": None, "gpu_uuid": None, "gpu_clock_sm_mhz": None, "gpu_clock_mem_mhz": None,
            "gpu_clock_max_sm_mhz": None, "gpu_clock_max_mem_mhz": None, "driver": None, "gpu_cc": None}
    if device.type != "cuda":
        return info
    index = device.index if device.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    info["gpu_name"] = props.name
    info["gpu_cc"] = f"{props.major}.{props.minor}"
    uuid = getattr(props, "uuid", None)
    info["gpu_uuid"] = str(uuid) if uuid is not None else None
    smi = _nvidia_smi(index)
    info["driver"] = smi.get("driver_version")
    info["gpu_uuid"] = smi.get("uuid") or info["gpu_uuid"]
    for key, field in (("gpu_clock_sm_mhz", "clocks.sm"), ("gpu_clock_mem_mhz", "clocks.mem"),
                       ("gpu_clock_max_sm_mhz", "clocks.max.sm"), ("gpu_clock_max_mem_mhz", "clocks.max.mem")):
        try:
            info[key] = float(smi[field])
        except (KeyError, ValueError):
            pass
    return info


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device.index or 0).name
    return f"cpu:{platform.processor() or platform.machine()}"


def collect(device: torch.device) -> dict:
    """The provenance columns shared by every row of a point."""
    row = {"python": platform.python_version(), "host": platform.node(), "cuda": torch.version.cuda or "absent"}
    row.update({f"v_{key}": VERSION_READERS.get(key, _version)(dist) for key, dist in PACKAGES.items()})
    row.update(gpu_info(device))
    row.update(git_state())
    row["slurm_job_id"] = os.environ.get("SLURM_JOB_ID")  # null outside SLURM
    return row


# Packages whose version is not (only) in the installed metadata: column key -> reader taking the distribution.
VERSION_READERS = {"tileiras": lambda _dist: tileiras_version(), "vllm": lambda _dist: vllm_version()}
