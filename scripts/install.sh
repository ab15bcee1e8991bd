#!/usr/bin/env bash
# Creates .venv (or $VENV) with everything the project and its tests need, in the one order that works:
#   1. torch first (TORCH_SPEC, default the CPU build 2.13.0; on a CUDA machine pass the build you want,
#      or VENV_SYSTEM_SITE=1 to reuse an installed torch),
#   2. the project with its extras,
#   3. mamba-ssm's pure-Python build (its SSD kernels are Triton; the CUDA extension is skipped), which must see
#      torch at build time and so cannot be a plain dependency.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
EXTRAS=${EXTRAS:-cutile,mamba,tracking,analysis,dev,slurm}
if [ ! -x "$VENV/bin/python" ]; then
  if [ "${VENV_SYSTEM_SITE:-0}" = 1 ]; then python3 -m venv --system-site-packages "$VENV"; else python3 -m venv "$VENV"; fi
fi
py="$VENV/bin/python"
"$py" -m pip install -q --upgrade pip
"$py" -c "import torch" 2>/dev/null || "$py" -m pip install -q "$TORCH_SPEC"
"$py" -m pip install -q -e ".[$EXTRAS]"
MAMBA_FORCE_BUILD=TRUE MAMBA_SKIP_CUDA_BUILD=TRUE "$py" -m pip install -q --no-build-isolation --no-deps \
  mamba-ssm==2.3.2.post1
# the external peers, without their dependencies: TileGym pins an old transformers and brings its whole op
# library; the adapters load only what they use (impls/tilegym/loader.py, impls/fla/peer.py)
"$py" -m pip install -q --no-deps tilegym==1.5.1 fla-core==0.6.0
# vLLM's Mamba-2 prefill SSD kernels (backend "vllm"): only its ops/*.py and METADATA, extracted from the wheel
# (downloaded once into ~/.cache/ssd-peers) into .peers/vllm-<version>; vLLM itself is never installed here.
# VLLM_SSD= (empty) skips it.
if [ -n "${VLLM_SSD-0.33.0}" ]; then
  "$py" -m impls.vllm.extract --version "${VLLM_SSD-0.33.0}"
fi
"$py" - <<'PY'
import importlib.metadata as m
for name in ("torch", "triton", "cuda-tile", "mamba_ssm", "hydra-core", "tilegym", "fla-core"):
    try:
        print(f"{name} {m.version(name)}")
    except m.PackageNotFoundError:
        print(f"{name} absent")
PY
