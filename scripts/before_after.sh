#!/usr/bin/env bash
# One sweep run by the code of a base commit and by this tree on the same machine in one run, then compared point by
# point by `python -m analysis.before_after` (each median within max(2 %, the base's spread)). For a refactor that
# must not change what the kernels do or how fast.
#   git archive BASE impls experiments harness conf scripts tuning pyproject.toml | gzip > before.tgz   (on the CPU machine;
#   leave harness out for a BASE older than it)
#   BEFORE_COMMIT=<full sha of BASE> SWEEP_OVERRIDES="backend=cutile,triton,mamba_ssm" [ROUNDS=2] \
#     scripts/before_after.sh before.tgz [EXPERIMENT=headline]          (on the GPU machine, after setup.sh)
# AFTER_OVERRIDES: overrides for the after side only, e.g. to run a backend whose defaults changed on purpose since the
# base at the base's switches (+backend.switches.<name>=<value>), so that the two sides run one arrangement.
# ROUNDS=1 (default): before, then after. ROUNDS=2: before, after, after, before (ABBA), so that a drift of the
# machine over the run (a host that slows, clocks) falls on both sides alike; each side's rounds share one results
# folder (the later round with force=true), so its merged Parquet holds every round.
# Writes $OUT/before/ and $OUT/after/ (each side's gpu_session.sh log and merged Parquet; the tuning archive of the
# after side only) and $OUT/before_after.md. SSD_GIT_COMMIT names this tree's commit, BEFORE_COMMIT the base's; each
# sweep gets an equal share of what is left of GPU_SESSION_BUDGET_S when it starts.
# Both sides are one run group (SSD_RUN_GROUP, made here unless given), each row with its side's round (SSD_ROUND).
set -uo pipefail
archive=${1:?usage: scripts/before_after.sh ARCHIVE.tgz [EXPERIMENT]}
exp=${2:-headline}
: "${BEFORE_COMMIT:?set BEFORE_COMMIT to the base commit the archive was made from}"
rounds=${ROUNDS:-1}
case "$rounds" in 1) order="before after" ;; 2) order="before after after before" ;;
  *) echo "before_after.sh: ROUNDS must be 1 or 2, got $rounds" >&2; exit 2 ;; esac
OUT=${OUT:-results/scratch/gpu}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
budget=${GPU_SESSION_BUDGET_S:-560}
started=$(date +%s)
left_sweeps=$(( 2 * rounds ))
base=$(mktemp -d "${TMPDIR:-/tmp}/before-XXXXXX")
tar -xzf "$archive" -C "$base" || { echo "before_after.sh: cannot unpack $archive" >&2; exit 2; }
roots=$(mktemp -d "${TMPDIR:-/tmp}/before-after-sweeps-XXXXXX")
group=${SSD_RUN_GROUP:-before-after-$(date -u +%Y-%m-%dT%H-%M-%SZ)-$$}
declare -A seen=()
for side in $order; do
  # each sweep gets an equal share of what is left, so that time a warm sweep leaves over goes to the next (the first
  # sweeps of a cold machine spend theirs compiling)
  share=$(( (budget - ($(date +%s) - started)) / left_sweeps ))
  left_sweeps=$(( left_sweeps - 1 ))
  extra=""
  [ -n "${seen[$side]:-}" ] && extra="force=true"   # the side's second round: measure again beside the first
  seen[$side]=$(( ${seen[$side]:-0} + 1 ))
  if [ "$side" = before ]; then
    # `python -m` puts the working directory first on sys.path, so the base tree's packages win over this tree's
    (cd "$base" && OUT="$OUT/before" GPU_SESSION_BUDGET_S=$share SSD_GIT_COMMIT=$BEFORE_COMMIT SSD_GIT_DIRTY=0 \
      SSD_RUN_GROUP="$group" SSD_ROUND=${seen[$side]} \
      SWEEP_ROOT="$roots/before" SWEEP_OVERRIDES="${SWEEP_OVERRIDES:-} $extra" scripts/gpu_session.sh sweep "$exp")
  else
    OUT="$OUT/after" GPU_SESSION_BUDGET_S=$share SWEEP_ROOT="$roots/after" SSD_RUN_GROUP="$group" \
      SSD_ROUND=${seen[$side]} \
      SWEEP_OVERRIDES="${SWEEP_OVERRIDES:-} ${AFTER_OVERRIDES:-} $extra" scripts/gpu_session.sh sweep "$exp"
  fi
done
rm -f "$OUT/before/tuning.tar.gz"
python -m analysis.before_after "$OUT/before/$exp.parquet" "$OUT/after/$exp.parquet" --out "$OUT/before_after.md"
