#!/usr/bin/env bash
# The study run of one card in one call (docs/gpu-runbook.md, "The study run"): cuTile's sm_90 defaults searched where
# this card has no record of their key (tuning=resume), then one run group of scripts/arms/study.txt's arms in ROUNDS
# interleaved rounds (default 3), the candidate default sets at the shapes without records once
# (scripts/arms/study_unseen.txt) after the first round, and the slow peers (study_peers_slow.txt) if time is left.
#   source .gpu/setup.sh && SSD_GIT_COMMIT=<sha> SSD_GIT_DIRTY=0 scripts/study.sh
# SEARCH_SHAPES (default: S2,S3,S4 on an H100, whose S1 record of the set is committed, else S1,S2,S3,S4);
# GPU_SESSION_BUDGET_S (default 585) for the whole call; STUDY_ARMS: the ARMS of study.txt (default all: on a card
# other than an H100 the Triton fused arm, which no record of that card holds, is left out unless named).
# Writes $OUT/search/ (the search's rows, log and tuning.tar.gz) and $OUT/study/headline.parquet (every round's rows,
# one run group `study-<date>-<card>`) with its session.log.
set -uo pipefail
OUT=${OUT:-results/scratch/gpu}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
budget=${GPU_SESSION_BUDGET_S:-585}
start=$(date +%s)
left() { echo $(( budget - ($(date +%s) - start) )); }
here=$(dirname "$0")
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$gpu" in
  *H100*) card=h100; shapes=${SEARCH_SHAPES:-S2,S3,S4}; arms=${STUDY_ARMS:-} ;;
  *H200*) card=h200; shapes=${SEARCH_SHAPES:-S1,S2,S3,S4}; arms=${STUDY_ARMS:-1,2,3,4} ;;
  *) card=$(echo "$gpu" | tr 'A-Z ' 'a-z-'); shapes=${SEARCH_SHAPES:-S1,S2,S3,S4}; arms=${STUDY_ARMS:-1,2,3,4} ;;
esac
group=${SSD_RUN_GROUP:-study-$(date -u +%F)-$card}
root=${SWEEP_ROOT:-$(mktemp -d "${TMPDIR:-/tmp}/study-XXXXXX")}
echo "== study.sh on $gpu: search $shapes, run group $group, SWEEP_ROOT=$root" | tee -a "$OUT/study.log"
SSD_RUN_GROUP=study-search-$card SWEEP_OVERRIDES="backend=cutile shape=$shapes ++backend.switches.tuning=resume" \
  OUT="$OUT/search" GPU_SESSION_BUDGET_S=$(( $(left) * 3 / 10 )) "$here/gpu_session.sh" sweep autotune
rounds=${ROUNDS:-3}
run() {  # FILE FIRST_ROUND ROUNDS [ARMS]: rounds of one arms file into the study's run group and sweep root
  local file=$1 first=$2 n=$3 pick=${4:-}
  SSD_RUN_GROUP=$group SWEEP_ROOT=$root FIRST_ROUND=$first ROUNDS=$n ARMS=$pick OUT="$OUT/study" \
    GPU_SESSION_BUDGET_S=$(left) "$here/rounds.sh" "$here/arms/$file" headline
}
run study.txt 1 1 "$arms"
run study_unseen.txt 1 1 "$( [ "$card" = h100 ] || echo 1,2,3 )"
[ "$rounds" -gt 1 ] && run study.txt 2 $(( rounds - 1 )) "$arms"
[ "$(left)" -gt 90 ] && run study_peers_slow.txt 1 1 1
echo "== study.sh done, $(left) s of the budget left" | tee -a "$OUT/study.log"
