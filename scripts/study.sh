#!/usr/bin/env bash
# The study run of one card (docs/gpu-runbook.md, "The study run"), in steps that fit the device's calls of 10 minutes
# on one warm machine: one run group (SSD_RUN_GROUP, default study-<UTC date>-<card>: pass it again to a call after
# midnight) and one sweep root on the machine (SWEEP_ROOT, default /tmp/<run group>), so each call's merged Parquet
# holds every round the machine has run so far.
#   source .gpu/setup.sh && SSD_GIT_COMMIT=<sha> SSD_GIT_DIRTY=0 scripts/study.sh STEP [STEP ...]
# Steps, in the order a study takes them (seen on an H100 on 2026-12-06: the peers' arm 219 s in a cold process with
# vLLM's first compile, 70 s after; each of our arms 40-70 s):
#   search   cuTile's sm_90 defaults searched where the card has no record of their key (tuning=resume; SEARCH_SHAPES,
#            default S2,S3,S4 on an H100, whose S1 record is committed, else S1-S4); about 100-150 s
#   unseen   the candidate default sets at three shapes without records (scripts/arms/study_unseen.txt), round 1
#   round1 round2 round3
#            one round of scripts/arms/study.txt each (the peers at S1-S4, each of our backends at its defaults and at
#            the other set that could be the default)
#   slow     fla and TileGym at chunk 128 once (scripts/arms/study_peers_slow.txt), round 1
# e.g. three calls: `search unseen`, `round1`, `round2 round3 slow`. GPU_SESSION_BUDGET_S (default 585) is the call's;
# a step that finds less than 30 s left is skipped and says so. STUDY_ARMS: the ARMS of study.txt (default all; on a
# card other than an H100 the Triton fused arm, which no record of that card holds, is left out unless named).
# Writes $OUT/search/ (the search's rows, log and tuning.tar.gz) and $OUT/study/headline.parquet with session.log.
set -uo pipefail
[ "$#" -gt 0 ] || { echo "usage: scripts/study.sh STEP [STEP ...] (search unseen round1 round2 round3 slow)" >&2; exit 2; }
for step in "$@"; do
  case "$step" in search|unseen|round1|round2|round3|slow) ;;
    *) echo "study.sh: unknown step '$step' (search unseen round1 round2 round3 slow)" >&2; exit 2 ;; esac
done
OUT=${OUT:-results/scratch/gpu}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
budget=${GPU_SESSION_BUDGET_S:-585}
start=$(date +%s)
left() { echo $(( budget - ($(date +%s) - start) )); }
here=$(dirname "$0")
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$gpu" in
  *H100*) card=h100; shapes=${SEARCH_SHAPES:-S2,S3,S4}; arms=${STUDY_ARMS:-}; unseen="" ;;
  *H200*) card=h200; shapes=${SEARCH_SHAPES:-S1,S2,S3,S4}; arms=${STUDY_ARMS:-1,2,3,4}; unseen=1,2,3 ;;
  *) card=$(echo "$gpu" | tr 'A-Z ' 'a-z-'); shapes=${SEARCH_SHAPES:-S1,S2,S3,S4}; arms=${STUDY_ARMS:-1,2,3,4}
     unseen=1,2,3 ;;
esac
group=${SSD_RUN_GROUP:-study-$(date -u +%F)-$card}
root=${SWEEP_ROOT:-${TMPDIR:-/tmp}/$group}
mkdir -p "$root"
echo "== study.sh on $gpu: steps $*, run group $group, SWEEP_ROOT=$root" | tee -a "$OUT/study.log"
rounds() {  # FILE ROUND [ARMS]: one round of an arms file into the study's run group and sweep root
  SSD_RUN_GROUP=$group SWEEP_ROOT=$root FIRST_ROUND=$2 ROUNDS=1 ARMS=${3:-} OUT="$OUT/study" \
    GPU_SESSION_BUDGET_S=$(left) "$here/rounds.sh" "$here/arms/$1" headline
}
for step in "$@"; do
  if [ "$(left)" -le 30 ]; then echo "== step $step: skipped, out of time" | tee -a "$OUT/study.log"; continue; fi
  case "$step" in
    search) SSD_RUN_GROUP=study-search-$card SWEEP_OVERRIDES="backend=cutile shape=$shapes ++backend.switches.tuning=resume" \
              OUT="$OUT/search" GPU_SESSION_BUDGET_S=$(left) "$here/gpu_session.sh" sweep autotune ;;
    unseen) rounds study_unseen.txt 1 "$unseen" ;;
    round1|round2|round3) rounds study.txt "${step#round}" "$arms" ;;
    slow) rounds study_peers_slow.txt 1 ;;
  esac
done
echo "== study.sh done, $(left) s of the budget left" | tee -a "$OUT/study.log"
