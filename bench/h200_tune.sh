#!/usr/bin/env bash
# Tune the catalog on the H200, verify every tuned record against float64, then benchmark.
# Runs as the second call of a lease (after .device/a/stage.sh), e.g.
#   source .device/b/activate.sh && OUT=$OUT bash bench/h200_tune.sh
# One call is limited to 10 minutes: the tuning state lives in /tmp/tvmnorm-tune on the device
# (kept while the machine is warm), records are saved after every batch, and a rerun resumes, so
# the same command can be issued again until it reports all keys tuned. Copy
# $OUT/tuning.tgz back into the repository; with BENCH=1, $OUT/accepted-cuda-sm_90.json holds the
# records that passed the float64 check and beat (or tie) the default schedule in the library:
# that file is what goes into schedules/. A retuned record that loses, in the library, to the
# default, or does not beat the record it would replace (as PREVIOUS, benchmarks of the committed
# records' library, measured it) by more than the slack, leaves that record in place; one that
# lost to the default with no record to fall back on becomes a record of the default's schedule
# (tune.default_record).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/tvmnorm-out}
STATE=${STATE:-/tmp/tvmnorm-tune}
mkdir -p "$OUT" "$STATE/schedules"
export TVMNORM_CACHE=/tmp/tvmnorm-cache PYTHONUNBUFFERED=1
# fail in a second, not after the tune's timeout and the check's (see h200_verify.sh)
python -c "import tvm, tvm_ffi" || { echo "!! tvm does not import here (PYTHONPATH=${PYTHONPATH:-})" | tee "$OUT/tune.log"; exit 1; }
# `tune accept` needs the committed records' benchmarks (PREVIOUS) at the end: a tree carried
# without them tuned for minutes and then accepted nothing (fourteenth lease); PREVIOUS= (empty)
# judges against none
PREVIOUS=${PREVIOUS-bench/results/h200-tuned.json}
if [ -n "${BENCH:-}" ]; then
  # shellcheck disable=SC2086 - PREVIOUS is a list of files
  for f in $PREVIOUS; do
    [ -f "$f" ] || { echo "!! PREVIOUS file $f is missing: tune accept could not run" | tee "$OUT/tune.log"; exit 1; }
  done
fi
# start from the committed records: tuned keys are skipped, and the library keeps them; FRESH=1
# starts from none, so every key of the job is tuned from nothing (what tuning the catalog costs;
# `tune accept --accepted` still keeps a committed record that the new one does not beat)
if [ -n "${FRESH:-}" ] && [ ! -f "$STATE/schedules/cuda-sm_90.json" ]; then
  python -c "import sys; from tvmnorm.tune import save_records; save_records('cuda', {}, sys.argv[1])" "$STATE/schedules"
fi
# the keys of this run: HIDDEN (e.g. 128,7168) names hidden sizes instead of SHAPES, for the tune
# and the benchmark; KEYS (packed, e.g. 0x10002090,0x8002091) names the keys themselves, for the
# tune (give HIDDEN and BENCH_OPS that cover them for the benchmark); FP8 adds the fp8-output keys
# of that otype, and FP8_ONLY=1 keeps them alone
keys=(--shapes "${SHAPES:-all}" ${HIDDEN:+--hidden "$HIDDEN"} ${KEYS:+--keys "$KEYS"} --stages "${STAGES:-fwd,bwd}" --norms "${NORMS:-rmsnorm,layernorm}"
      --dtypes "${DTYPES:-bf16}" ${FP8:+--fp8 "$FP8"} ${FP8_ONLY:+--fp8-only})
if [ ! -f "$STATE/schedules/cuda-sm_90.json" ] && cp schedules/cuda-sm_90.json "$STATE/schedules/" 2>/dev/null; then
  # RETUNE=1: the committed records of the job's keys are due again (tune.due_again), each still
  # seeded as a candidate; only here, when the state is created, so a rerun resumes the job
  [ -z "${RETUNE:-}" ] || python -m tvmnorm.tune due-again "$STATE/schedules/cuda-sm_90.json" "${keys[@]}"
fi
# the databases, records and library of this run, shared by the tune and its recovery
# SEED: the search's seed (tvmnorm tune --seed, default 1): a retune seeded with its records
# draws other candidates than the tune that found them
run=(--target cuda "${keys[@]}" ${CHUNK_ROWS:+--chunk-rows "$CHUNK_ROWS"} --trials "${TRIALS:-32}" ${SEED:+--seed "$SEED"} --logs "$STATE/tuning_logs"
     --schedules "$STATE/schedules" --out "$STATE/lib" --layouts "${LAYOUTS:-compact}")  # the check and bench run compact x
# the tune starts no batch with less than half its time left before TUNE_SECONDS less 30 s for
# its library build, at the seconds a key has taken in this call or, before one has, KEY_SECONDS
# (e.g. 60 for the bf16 backward at 48 trials): such a batch keeps nothing of MIN_TRIALS
# (tune.batch_past_limit). OVERLAP=1: candidates compile while the search draws the next tasks'
# (tvmnorm tune --overlap-builds; no faster on the H200: 49.6 vs 49.5 s a key, thirty-third lease)
# a budget computed by the calling script can come out too small (thirty-fifth lease: a probe
# ahead of the tune took twice its planned time, leaving --time-limit -9 s): say so, not tune nothing
if [ "${TUNE_SECONDS:-420}" -lt 90 ]; then
  echo "!! TUNE_SECONDS=${TUNE_SECONDS} leaves under a minute of tuning after the 30 s kept for the library build" | tee "$OUT/tune.log"
  exit 1
fi
# SWEEP=1: after the search, each backward record's dx timed at T = 16-64 (tvmnorm tune
# --sweep-chunk-rows, ~20 s a key on an H100, not counted by --time-limit: leave it room; a sweep
# cut by the timeout keeps the searched records, and the recovery below builds them)
timeout "${TUNE_SECONDS:-420}" python -m tvmnorm tune "${run[@]}" --batch "${BATCH:-16}" \
  --time-limit $(( ${TUNE_SECONDS:-420} - 30 )) ${KEY_SECONDS:+--key-seconds "$KEY_SECONDS"} ${OVERLAP:+--overlap-builds} \
  ${SWEEP:+--sweep-chunk-rows} \
  2>&1 | grep -v "\[INFO\]\|\[DEBUG\]" | tr '\r' '\n' > "$STATE/tune-full.log"
tuned=${PIPESTATUS[0]}
# the run's own lines (preflight: which CUDA build, keys to tune, recovery) and its last screen
{ grep -E "^(preflight|seeded|tuning|tuned|recovered|stopping|no valid)" "$STATE/tune-full.log"; tail -40 "$STATE/tune-full.log"; } \
  | tee "$OUT/tune.log"
# TUNE_ONLY=1: a call that only advances a tune a later call of the same lease resumes (the
# recovery, check and benchmark below would spend its 600 s on a library the next call replaces)
if [ -n "${TUNE_ONLY:-}" ]; then
  (cd "$STATE" && tar czf "$OUT/tuning.tgz" schedules tuning_logs 2>/dev/null)
  exit 0
fi
# a tune stopped by TUNE_SECONDS (status 124) wrote no records for its unfinished batch and built
# no library: take the best candidate of every key with >= MIN_TRIALS measured (the keys stay
# due for more) and build it, so that the float64 check, the benchmark and `tune accept` run
[ "$tuned" -eq 0 ] || python -m tvmnorm tune "${run[@]}" --min-trials "${MIN_TRIALS:-8}" --recover-only \
  2>&1 | grep -v "\[INFO\]\|\[DEBUG\]" | tail -3 | tee -a "$OUT/tune.log"
(cd "$STATE" && tar czf "$OUT/tuning.tgz" schedules tuning_logs 2>/dev/null)
if [ -f "$STATE/lib/manifest.json" ]; then
  TVMNORM_LIBRARY="$STATE/lib" timeout "${CHECK_SECONDS:-120}" python bench/gpu_check.py --tuned --out "$OUT" | tail -5
  checked=${PIPESTATUS[0]}
  if [ -n "${BENCH:-}" ]; then
    TVMNORM_LIBRARY="$STATE/lib" timeout "${BENCH_SECONDS:-300}" python -m tvmnorm.bench --target cuda \
      --ops "${BENCH_OPS:-rmsnorm_fwd,rmsnorm_bwd,layernorm_fwd,layernorm_bwd}" --dtypes "${DTYPES:-bf16}" \
      --shapes "${SHAPES:-all}" ${HIDDEN:+--hidden "$HIDDEN"} --rows train --impls "${BENCH_IMPLS:-tvmnorm_tuned,tvmnorm_default,torch_eager,liger}" \
      --out "$OUT" --name h200-tuned --no-plots
    # the records that go into schedules/: float64-checked, and no slower than the default in
    # the library (tuning timed a static-row candidate; the library runs the symbolic-row kernel)
    if [ "$checked" -eq 0 ] && [ -f "$OUT/h200-tuned.json" ]; then
      # shellcheck disable=SC2086 - PREVIOUS is a list of files
      python -m tvmnorm.tune accept "$STATE/schedules/cuda-sm_90.json" "$OUT/h200-tuned.json" \
        "$OUT/accepted-cuda-sm_90.json" --accepted schedules/cuda-sm_90.json --rejected "$OUT/rejected" \
        --previous $PREVIOUS \
        && cp "$OUT/accepted-cuda-sm_90.json" "$STATE/"  # for bench/h200_verify.sh on the same machine
    fi
  fi
fi
