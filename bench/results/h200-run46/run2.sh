# lease 46, call 2: tune fwd_add, bf16, every catalog width, RMSNorm and LayerNorm, from nothing
# (24 keys; no fwd_add record exists), then h200_tune.sh's float64 check of each tuned key and
# its benchmark of tuned, default, torch eager (add, then the norm), torch.compile and Liger
# (fused add + RMSNorm) at 16384 tokens, and `tune accept` with no previous records
source bench/lease_env.sh || exit 1
STAGES=fwd_add BENCH=1 PREVIOUS= TRIALS=${TRIALS:-24} TUNE_SECONDS=${TUNE_SECONDS:-330} CHECK_SECONDS=100 BENCH_SECONDS=150 \
  BENCH_OPS=rmsnorm_fwd_add,layernorm_fwd_add BENCH_IMPLS=tvmnorm_tuned,tvmnorm_default,torch_eager,torch_compile,liger \
  OUT=$X bash bench/h200_tune.sh > "$X/h200-tune.log" 2>&1
el "tune rc $?"; tail -5 "$X/tune.log"; grep -c ok "$X"/*correct* 2>/dev/null; ls "$X"
grep -h "SUMMARY\|FAIL" "$X"/*.txt 2>/dev/null | head; tail -60 "$X/h200-tune.log" | cut -c1-160
