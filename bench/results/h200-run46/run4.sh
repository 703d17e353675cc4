# lease 46, call 4 (a fresh machine): tune bwd_add, bf16, the catalog widths without a record
# (all but 7168 and 8192), RMSNorm and LayerNorm, from nothing, then the float64 check of each
# tuned key, the benchmark of tuned against default at 16384 tokens and `tune accept` with no
# previous records (the backward of rms_norm_add / layer_norm_add runs these kernels)
source bench/lease_env.sh || exit 1
STAGES=bwd_add HIDDEN=128,512,896,1024,1536,2048,2560,3584,4096,5120 BENCH=1 PREVIOUS= TRIALS=24 TUNE_SECONDS=280 \
  CHECK_SECONDS=100 BENCH_SECONDS=140 BENCH_OPS=rmsnorm_bwd_add,layernorm_bwd_add BENCH_IMPLS=tvmnorm_tuned,tvmnorm_default \
  OUT=$X bash bench/h200_tune.sh > "$X/h200-tune.log" 2>&1
el "tune rc $?"; grep -h "SUMMARY\|FAIL" "$X"/*correct* 2>/dev/null | head; ls "$X"
grep "^\[" "$X/h200-tune.log" | cut -c1-200; tail -8 "$X/h200-tune.log" | cut -c1-200
(cd /tmp/tvmnorm-tune && tar czf "$X/tuning2.tgz" schedules tuning_logs)
