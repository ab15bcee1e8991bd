#!/usr/bin/env bash
# Creates .venv (or $VENV) with everything the project and its tests need, in the one order that works:
#   1. torch first, fitted to the machine (below): on a CPU machine TORCH_SPEC (default torch==2.13.0); on a CUDA
#      machine (nvidia-smi lists a GPU) a CUDA torch: the one python3 already imports (the venv then sees the
#      system's site packages), or TORCH_SPEC given explicitly; otherwise it stops, naming TORCH_SPEC. A CPU torch
#      is never installed on a GPU machine. DETECT_ONLY=1 prints the decision and exits before touching anything.
#   2. the project with its extras,
#   3. mamba-ssm's pure-Python build (its SSD kernels are Triton; the CUDA extension is skipped), which must see
#      torch at build time and so cannot be a plain dependency.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
TORCH_SPEC_GIVEN=${TORCH_SPEC:+1}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
PYTHON3=${PYTHON3:-python3}
EXTRAS=${EXTRAS:-cutile,mamba,tracking,analysis,dev,slurm}

# --- step 1's decision: which torch fits this machine ------------------------------------------------------------
gpu_listed() {  # the first GPU nvidia-smi lists, or nothing
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -m1 '^GPU ' || true
}
cuda_torch() {  # "<version> (CUDA <cuda>)" when $1 imports a CUDA build of torch, else fails
  "$1" -c 'import torch; assert torch.version.cuda; print(f"{torch.__version__} (CUDA {torch.version.cuda})")' \
    2>/dev/null
}
plan_torch() {  # sets TORCH_PLAN: keep (the venv's torch), system (python3's, via system site packages), spec
  local gpu found
  gpu=$(gpu_listed)
  if [ -z "$gpu" ]; then
    TORCH_PLAN=spec; echo "[install] no GPU listed by nvidia-smi: torch from TORCH_SPEC ($TORCH_SPEC)"; return
  fi
  echo "[install] CUDA machine: $gpu"
  if [ -x "$VENV/bin/python" ] && found=$(cuda_torch "$VENV/bin/python"); then
    TORCH_PLAN=keep; echo "[install] $VENV already has torch $found"
  elif [ -n "$TORCH_SPEC_GIVEN" ]; then
    TORCH_PLAN=spec; echo "[install] torch from the TORCH_SPEC given ($TORCH_SPEC)"
  elif [ ! -x "$VENV/bin/python" ] && found=$(cuda_torch "$PYTHON3"); then
    TORCH_PLAN=system; echo "[install] reusing $PYTHON3's torch $found (venv with system site packages)"
  else
    echo "[install] stop: this machine has a GPU but no CUDA torch to reuse ($PYTHON3 has none${VENV:+, nor $VENV})," \
      "and the default TORCH_SPEC would install a build that may not match its CUDA." >&2
    echo "[install] Install a CUDA torch for $PYTHON3, or name one: TORCH_SPEC='torch==<version>' with the pip" \
      "index of your CUDA (PIP_INDEX_URL), then run scripts/install.sh again." >&2
    return 1
  fi
}
plan_torch
if [ "${DETECT_ONLY:-0}" = 1 ]; then echo "[install] torch plan: $TORCH_PLAN"; exit 0; fi

if [ ! -x "$VENV/bin/python" ]; then
  if [ "${VENV_SYSTEM_SITE:-0}" = 1 ] || [ "$TORCH_PLAN" = system ]; then
    "$PYTHON3" -m venv --system-site-packages "$VENV"
  else
    "$PYTHON3" -m venv "$VENV"
  fi
fi
py="$VENV/bin/python"
"$py" -m pip install -q --upgrade pip
"$py" -c "import torch" 2>/dev/null || "$py" -m pip install -q "$TORCH_SPEC"
if [ -n "$(gpu_listed)" ] && ! cuda_torch "$py" >/dev/null; then
  echo "[install] stop: $VENV's torch is not a CUDA build on a machine with a GPU; remove $VENV or pass a CUDA" \
    "build as TORCH_SPEC" >&2
  exit 1
fi
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
