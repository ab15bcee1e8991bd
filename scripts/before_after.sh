#!/usr/bin/env bash
# One sweep run twice on the same machine in one run: by the code of a base commit, then by this tree; then
# `python -m analysis.before_after` compares them point by point (each median within max(2 %, the base run's
# p20–p80 spread)). For a refactor that must not change what the kernels do or how fast.
#   git archive BASE impls experiments conf scripts tuning pyproject.toml | gzip > before.tgz   (on the CPU machine)
#   BEFORE_COMMIT=<full sha of BASE> SWEEP_OVERRIDES="backend=cutile,triton,mamba_ssm" \
#     scripts/before_after.sh before.tgz [EXPERIMENT=headline]          (on the GPU machine, after setup.sh)
# Writes $OUT/before/ and $OUT/after/ (each gpu_session.sh's log and merged Parquet; the tuning archive of the
# after-run only) and $OUT/before_after.md. SSD_GIT_COMMIT names this tree's commit, BEFORE_COMMIT the base's; each
# run gets half of GPU_SESSION_BUDGET_S.
set -uo pipefail
archive=${1:?usage: scripts/before_after.sh ARCHIVE.tgz [EXPERIMENT]}
exp=${2:-headline}
: "${BEFORE_COMMIT:?set BEFORE_COMMIT to the base commit the archive was made from}"
OUT=${OUT:-results/scratch/gpu}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
half=$(( ${GPU_SESSION_BUDGET_S:-560} / 2 ))
base=$(mktemp -d "${TMPDIR:-/tmp}/before-XXXXXX")
tar -xzf "$archive" -C "$base" || { echo "before_after.sh: cannot unpack $archive" >&2; exit 2; }
# `python -m` puts the working directory first on sys.path, so the base tree's packages win over this tree's
(cd "$base" && OUT="$OUT/before" GPU_SESSION_BUDGET_S=$half SSD_GIT_COMMIT=$BEFORE_COMMIT SSD_GIT_DIRTY=0 \
  scripts/gpu_session.sh sweep "$exp")
OUT="$OUT/after" GPU_SESSION_BUDGET_S=$half scripts/gpu_session.sh sweep "$exp"
rm -f "$OUT/before/tuning.tar.gz"
python -m analysis.before_after "$OUT/before/$exp.parquet" "$OUT/after/$exp.parquet" --out "$OUT/before_after.md"
