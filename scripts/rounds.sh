#!/usr/bin/env bash
# One experiment run as several arms (a backend and its switches each), repeated in ROUNDS rounds interleaved arm by
# arm (round 1: arm A, B, C...; round 2: A, B, C...), so that a drift of the machine over the run falls on every arm
# alike. For targets that must hold "in three interleaved repeats, one run".
#   scripts/rounds.sh ARMS_FILE [EXPERIMENT=headline]       (on the GPU machine, after setup.sh)
# ARMS_FILE: one arm per line, the SWEEP_OVERRIDES of that arm (blank lines and #-comments skipped), e.g.
# scripts/arms/fair_fight.txt. ROUNDS (default 3). Every arm of every round stores into one results folder (rounds
# after the first with force=true, so each round is a run of its own: its own run_id), merged into
# $OUT/<experiment>.parquet; one log, $OUT/session.log. Each sweep gets what is left of GPU_SESSION_BUDGET_S; a cut-off
# run keeps what it measured. ARMS (default: all): the arms to run, by their 1-based order in ARMS_FILE, e.g. ARMS=1,2,4.
# FIRST_ROUND (default 1): the number of this invocation's first round, to continue a run group in a later call on the
# same warm machine (SSD_RUN_GROUP given again, e.g. round 1 in one call, FIRST_ROUND=2 ROUNDS=2 in the next).
# Every arm of every round is one run group (SSD_RUN_GROUP, made here unless given) and each row records its round
# (SSD_ROUND): the analysis reads the rounds of one run together and refuses rows of several runs in one table.
set -uo pipefail
arms_file=${1:?usage: scripts/rounds.sh ARMS_FILE [EXPERIMENT]}
exp=${2:-headline}
rounds=${ROUNDS:-3}
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "rounds.sh: ROUNDS must be a positive integer, got $rounds" >&2; exit 2; }
first=${FIRST_ROUND:-1}
[[ "$first" =~ ^[1-9][0-9]*$ ]] || { echo "rounds.sh: FIRST_ROUND must be a positive integer, got $first" >&2; exit 2; }
[ -f "$arms_file" ] && [ -r "$arms_file" ] || { echo "rounds.sh: cannot read $arms_file" >&2; exit 2; }
mapfile -t arms < <(tr -d '\r' < "$arms_file" | grep -v '^[[:space:]]*\(#\|$\)')
[ "${#arms[@]}" -gt 0 ] || { echo "rounds.sh: no arm in $arms_file" >&2; exit 2; }
if [ -n "${ARMS:-}" ]; then
  picked=()
  IFS=, read -ra wanted <<< "$ARMS"
  for i in "${wanted[@]}"; do
    [[ "$i" =~ ^[1-9][0-9]*$ ]] && [ "$i" -le "${#arms[@]}" ] \
      || { echo "rounds.sh: ARMS=$ARMS: '$i' is not an arm of $arms_file (1..${#arms[@]})" >&2; exit 2; }
    picked+=("${arms[i - 1]}")
  done
  arms=("${picked[@]}")
fi
OUT=${OUT:-results/scratch/gpu}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
budget=${GPU_SESSION_BUDGET_S:-560}
start=$(date +%s)
root=${SWEEP_ROOT:-$(mktemp -d "${TMPDIR:-/tmp}/rounds-XXXXXX")}
group=${SSD_RUN_GROUP:-rounds-$(date -u +%Y-%m-%dT%H-%M-%SZ)-$$}
echo "== rounds.sh: rounds $first..$((first + rounds - 1)) x ${#arms[@]} arms of $exp, SWEEP_ROOT=$root" \
  "SSD_RUN_GROUP=$group" | tee -a "$OUT/session.log"
for ((r = first; r < first + rounds; r++)); do
  extra=""
  [ "$r" -gt 1 ] && extra="force=true"
  for arm in "${arms[@]}"; do
    left=$(( budget - ($(date +%s) - start) ))
    [ "$left" -gt 30 ] || { echo "== round $r, arm '$arm': skipped, out of time" | tee -a "$OUT/session.log"; continue; }
    echo "== round $r, arm '$arm' ($left s left)" | tee -a "$OUT/session.log"
    OUT="$OUT" GPU_SESSION_BUDGET_S=$left SWEEP_ROOT="$root" SWEEP_OVERRIDES="$arm $extra" \
      SSD_RUN_GROUP="$group" SSD_ROUND=$r \
      "$(dirname "$0")/gpu_session.sh" sweep "$exp"
  done
done
# once more at the end, after removing the last merge: with no arm run (out of time) there is nothing to merge, and
# the merged Parquet would otherwise be an earlier call's (experiments.merge refuses an empty or missing folder)
rm -f "$OUT/$exp.parquet"
if ! python -m experiments.merge "$root/$exp" "$OUT/$exp.parquet" 2>&1 | tee -a "$OUT/session.log"; then
  echo "== rounds.sh: nothing merged, no arm stored a point; no $exp.parquet written" | tee -a "$OUT/session.log"
fi
