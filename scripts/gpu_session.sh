#!/usr/bin/env bash
# One run on the GPU machine: the GPU test suite and/or sweeps, writing one log and merged Parquet files under $OUT.
#   scripts/gpu_session.sh tests                 tests/gpu in parallel workers (pytest-xdist, on the image)
#   scripts/gpu_session.sh tests_matching REGEX PATH...
#                                                the tests under PATH... whose node id matches REGEX (re.search;
#                                                scripts/select_tests.py), light ones in workers, then heavy ones
#   scripts/gpu_session.sh sweep EXP [EXP ...]   experiment overlays, e.g. headline ablate_cutile
#   scripts/gpu_session.sh sweep_each EXP B...   one experiment, each backend B in a process of its own (a kernel's
#                                                illegal memory access loses the whole process's CUDA context)
#   scripts/gpu_session.sh first_call            the same points in two fresh processes: cold, then with the
#                                                compile caches and tuning records the first one left
#   scripts/gpu_session.sh sanitize              compute-sanitizer over every cuTile and Triton stage
#                                                (instruments/sanitize.py), with its negative control
#   scripts/gpu_session.sh profile [args]        Nsight Compute over one call per backend (instruments/profile.py;
#                                                --direction backward profiles one backward)
#   scripts/gpu_session.sh hotspots [args]       warp-state samples per SASS line of one kernel (instruments/hotspots.py)
#   scripts/gpu_session.sh api_overhead          the public call by name vs on a prebuilt backend vs CUDA-graph
#                                                replay, with host time per call (harness/api_overhead.py)
# Run it in a tree that carries the .gpu bundle, after `source .gpu/setup.sh &&` (docs/gpu-runbook.md).
# The GPU machine gets the working tree without .git: put the commit into the command for the rows' provenance,
#   SSD_GIT_COMMIT=<git rev-parse HEAD> SSD_GIT_DIRTY=<0|1> scripts/gpu_session.sh ...
#   (labels only: which points are stored already is decided by code_key, a hash of the tree's content)
# Each invocation stores its points under a folder of its own (SWEEP_ROOT, default $TMPDIR/sweeps/call-<time>-<pid>,
# with /tmp when TMPDIR is unset), so a merged Parquet holds exactly the points this invocation ran, even on a
# machine still warm from an earlier call.
# To continue a cut-off sweep, pass the earlier SWEEP_ROOT (printed in the log): its points stored ok by the same
# code (config hash and code_key: source content, versions, tuning records, peer files, driver) are skipped; failed
# ones run again (SWEEP_OVERRIDES=retry_failed=false keeps them), and points stored by other code are measured anew.
# Every row of an invocation carries one run group (SSD_RUN_GROUP, default <UTC time>-<pid>, printed in the log) and
# its round (SSD_ROUND, default 1): scripts/rounds.sh and before_after.sh set both for each call they make, so the
# rounds of one of their runs share a group; an analysis table reads one group (analysis.load.one_run). A continued
# cut-off sweep is a run of its own unless the earlier SSD_RUN_GROUP is passed too.
set -uo pipefail
OUT=${OUT:-results/scratch/gpu}
mkdir -p "$OUT"
SWEEP_ROOT=${SWEEP_ROOT:-${TMPDIR:-/tmp}/sweeps/call-$(date +%s)-$$}
export SSD_RUN_GROUP=${SSD_RUN_GROUP:-$(date -u +%Y-%m-%dT%H-%M-%SZ)-$$} SSD_ROUND=${SSD_ROUND:-1}
case " ${SWEEP_OVERRIDES:-} " in
  *" results_dir="*)
    # the merge reads $SWEEP_ROOT/<experiment>; a results_dir of its own would leave the merged Parquet stale
    echo "gpu_session.sh: SWEEP_OVERRIDES sets results_dir; set SWEEP_ROOT instead" >&2; exit 2 ;;
esac
log="$OUT/session.log"
budget=${GPU_SESSION_BUDGET_S:-560}      # stop starting work before the device call's 600 s limit
start=$(date +%s)
# seconds left, at least 1 (`timeout 0` would mean no limit at all)
left() { local l=$(( budget - ($(date +%s) - start) )); [ "$l" -ge 1 ] || l=1; echo "$l"; }
{
  echo "== $(date -u +%FT%TZ) $(hostname) SWEEP_ROOT=$SWEEP_ROOT SSD_RUN_GROUP=$SSD_RUN_GROUP SSD_ROUND=$SSD_ROUND"
  nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} 2>&1 | tee -a "$log"
phase=$1; shift
case "$phase" in
  tests)
    # light tests in many workers, then the heavy ones (float64 references and 2^20-token problems of tens of GB)
    # one at a time
    timeout "$(left)" python -m pytest tests/gpu -q -n "${GPU_TEST_WORKERS:-8}" -p no:cacheprovider -m "not heavy" \
      --junitxml="$OUT/gpu-tests.xml" -ra "$@" 2>&1 | tee -a "$log"
    timeout "$(left)" python -m pytest tests/gpu -q -p no:cacheprovider -m heavy \
      --junitxml="$OUT/gpu-tests-heavy.xml" -ra "$@" 2>&1 | tee -a "$log"
    ;;
  tests_matching)
    # ids selected from the collection (the image's pytest -k over-matches); -m splits them as `tests` does
    pattern=$1; shift
    ids=$(python "$(dirname "$0")/select_tests.py" "$pattern" "$@") || { echo "no test id under $* matches $pattern" | tee -a "$log"; exit 2; }
    echo "== $(echo "$ids" | wc -l) tests match $pattern" | tee -a "$log"
    workers=()
    [ "${GPU_TEST_WORKERS:-8}" -gt 0 ] && workers=(-n "${GPU_TEST_WORKERS:-8}")
    # shellcheck disable=SC2086  # one node id per word
    timeout "$(left)" python -m pytest $ids -v "${workers[@]}" -p no:cacheprovider -m "not heavy" \
      --junitxml="$OUT/gpu-tests.xml" -ra 2>&1 | tee -a "$log"
    # shellcheck disable=SC2086
    timeout "$(left)" python -m pytest $ids -v -p no:cacheprovider -m heavy \
      --junitxml="$OUT/gpu-tests-heavy.xml" -ra 2>&1 | tee -a "$log"
    ;;
  sweep|api_overhead)
    [ "$phase" = api_overhead ] && set -- api_overhead
    for exp in "$@"; do
      echo "== sweep $exp ($(left) s left)" | tee -a "$log"
      [ "$(left)" -gt 30 ] || { echo "skipped $exp: out of time" | tee -a "$log"; continue; }
      timeout "$(left)" python -m experiments.bench -m "experiment=$exp" "results_dir=$SWEEP_ROOT/$exp" \
        logger=local ${SWEEP_OVERRIDES:-} 2>&1 | tee -a "$log"
      rm -f "$OUT/$exp.parquet"  # a sweep that stored nothing leaves no earlier call's file behind
      python -m experiments.merge "$SWEEP_ROOT/$exp" "$OUT/$exp.parquet" 2>&1 | tee -a "$log"
    done
    ;;
  sweep_each)
    exp=$1; shift
    for backend in "$@"; do
      echo "== sweep $exp backend=$backend ($(left) s left)" | tee -a "$log"
      [ "$(left)" -gt 20 ] || { echo "skipped $backend: out of time" | tee -a "$log"; continue; }
      timeout "$(left)" python -m experiments.bench -m "experiment=$exp" "backend=$backend" \
        "results_dir=$SWEEP_ROOT/$exp" logger=local ${SWEEP_OVERRIDES:-} 2>&1 | tee -a "$log"
    done
    rm -f "$OUT/$exp.parquet"
    python -m experiments.merge "$SWEEP_ROOT/$exp" "$OUT/$exp.parquet" 2>&1 | tee -a "$log"
    ;;
  first_call)
    # each backend's first point in a process pays compilation (and autotuning): compile_s of the gate's calls.
    # Both processes use compile caches of their own, emptied before the cold one, so that "cold" is cold even
    # after other phases of the same call compiled the same kernels (cuTile's and Triton's disk caches)
    caches=/tmp/first_call_caches
    rm -rf "$caches"
    export CUDA_TILE_CACHE_DIR="$caches/cutile" TRITON_CACHE_DIR="$caches/triton"
    for run in cold warm; do
      echo "== first_call $run ($(left) s left)" | tee -a "$log"
      timeout "$(left)" python -m experiments.bench -m "backend=${FIRST_CALL_BACKENDS:-mamba_ssm,triton,cutile,vllm}" \
        shape=S1 bench=check_only force=true sweep_name="first_call_$run" "results_dir=$SWEEP_ROOT/first_call" \
        logger=local 2>&1 | tee -a "$log"
    done
    rm -f "$OUT/first_call.parquet"
    python -m experiments.merge "$SWEEP_ROOT/first_call" "$OUT/first_call.parquet" 2>&1 | tee -a "$log"
    ;;
  sanitize)
    timeout "$(left)" python -m instruments.sanitize --out "$OUT" "$@" 2>&1 | tee -a "$log"
    ;;
  profile)
    timeout "$(left)" python -m instruments.profile --out "$OUT" "$@" 2>&1 | tee -a "$log"
    ;;
  hotspots)
    timeout "$(left)" python -m instruments.hotspots --out "$OUT" "$@" 2>&1 | tee -a "$log"
    ;;
  *) echo "unknown phase $phase" >&2; exit 2 ;;
esac
# the tuning records as they stand after the phase (searches store there; the GPU machine keeps nothing): one file back;
# here: python -m instruments.tuning_take <returned folder>/tuning.tar.gz, then commit what changed
tar -czf "$OUT/tuning.tar.gz" -C "${SSD_TUNING_DIR:-tuning}" .
echo "== done in $(( $(date +%s) - start )) s" | tee -a "$log"
