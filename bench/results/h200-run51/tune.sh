# lease 51, calls 2-3 (after .device/a/stage.sh and bench/h200_proof.sh cache): retune the bf16
# (or $DTYPES) backward of the whole catalog with the search fixed in session 52 (no
# RewriteReductionBlock: a candidate is the kernel the library builds), seeded with the committed
# records. PHASE=tune advances the tune (resumable; run again until every key is tuned);
# PHASE=bench builds the library, checks every record against float64, benchmarks tuned, default,
# torch eager and Liger at 16384 tokens and runs `tune accept` against the committed records'
# benchmarks (bench/results/h200-tuned.json).
source bench/lease_env.sh || exit 1
export STAGES=bwd DTYPES=${DTYPES:-bf16} RETUNE=1 TRIALS=${TRIALS:-32}
if [ "$PHASE" = tune ]; then
  TUNE_ONLY=1 TUNE_SECONDS=${TUNE_SECONDS:-540} OUT=$X bash bench/h200_tune.sh > "$X/h200-tune.log" 2>&1
  el "tune rc $?"; grep "^tuned\|^tuning\|stopping" "$X/h200-tune.log" | tail -40 | cut -c1-200
else
  BENCH=1 TUNE_SECONDS=${TUNE_SECONDS:-200} CHECK_SECONDS=${CHECK_SECONDS:-100} BENCH_SECONDS=${BENCH_SECONDS:-240} \
    BENCH_OPS=rmsnorm_bwd,layernorm_bwd OUT=$X bash bench/h200_tune.sh > "$X/h200-tune.log" 2>&1
  el "bench rc $?"; tail -30 "$X/h200-tune.log" | cut -c1-200; ls "$X"
fi
