"""scripts/install.sh's first decision, which torch fits the machine, run alone (DETECT_ONLY=1) with stand-ins for
nvidia-smi and python3 on a CPU machine: on a GPU machine it reuses a CUDA torch or stops naming TORCH_SPEC, and
never plans a CPU build there."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "install.sh"
H200 = "GPU 0: NVIDIA H200 (UUID: GPU-00000000-0000-0000-0000-000000000000)"


def stand_in(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def detect(tmp_path, gpu: bool, python3_cuda: bool, venv_cuda: bool | None = None, **env):
    """Runs the detection with a stand-in nvidia-smi (listing an H200 or nothing) and python3 (importing a CUDA
    torch or failing); `venv_cuda` not None creates the venv's python too."""
    bin_dir = tmp_path / "bin"
    stand_in(bin_dir / "nvidia-smi", f"echo '{H200}'" if gpu else "echo 'No devices were found'; exit 6")
    cuda_torch = "echo '2.11.0+cu130 (CUDA 13.0)'"
    python3 = stand_in(tmp_path / "python3", cuda_torch if python3_cuda else "exit 1")
    venv = tmp_path / "venv"
    if venv_cuda is not None:
        stand_in(venv / "bin" / "python", cuda_torch if venv_cuda else "exit 1")
    inherited = {k: v for k, v in os.environ.items() if k != "TORCH_SPEC"}
    full_env = {**inherited, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "DETECT_ONLY": "1",
                "PYTHON3": str(python3), "VENV": str(venv), **env}
    return subprocess.run(["bash", str(SCRIPT)], env=full_env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("gpu,python3_cuda,venv_cuda,env,plan", [
    pytest.param(False, False, None, {}, "spec", id="cpu-machine-default-spec"),
    pytest.param(True, True, None, {}, "system", id="gpu-reuses-python3-cuda-torch"),
    pytest.param(True, False, None, {"TORCH_SPEC": "torch==2.13.0"}, "spec", id="gpu-explicit-spec"),
    pytest.param(True, False, True, {}, "keep", id="gpu-venv-has-cuda-torch"),
])
def test_plan(tmp_path, gpu, python3_cuda, venv_cuda, env, plan):
    out = detect(tmp_path, gpu, python3_cuda, venv_cuda, **env)
    assert out.returncode == 0, out.stderr
    assert f"torch plan: {plan}" in out.stdout
    assert ("NVIDIA H200" in out.stdout) == gpu
    assert not (tmp_path / "venv").exists() or venv_cuda is not None  # detection creates nothing


@pytest.mark.parametrize("venv_cuda", [pytest.param(None, id="no-venv"), pytest.param(False, id="venv-cpu-torch")])
def test_gpu_without_cuda_torch_stops_naming_torch_spec(tmp_path, venv_cuda):
    out = detect(tmp_path, gpu=True, python3_cuda=False, venv_cuda=venv_cuda)
    assert out.returncode == 1
    assert "TORCH_SPEC" in out.stderr and "torch plan" not in out.stdout
