# lease 45, call 7 (a fresh machine): the first bwd_add records: rmsnorm and layernorm bwd_add at
# 7168 and 8192 (bf16) tuned from nothing (no bwd_add record exists), their library's kernels
# checked against float64 (gpu_check --tuned), benchmarked against the default schedule
# (tvmnorm bench --ops *_bwd_add) and accepted where they beat it (tune accept)
source bench/lease_env.sh || exit 1
mkdir -p /tmp/tvmnorm-cache && tar xJf .device/l45/tc.txz -C /tmp/tvmnorm-cache --strip-components=1
STAGES=bwd_add HIDDEN=7168,8192 TRIALS=24 TUNE_SECONDS=170 MIN_TRIALS=8 BENCH=1 PREVIOUS= \
  BENCH_OPS=rmsnorm_bwd_add,layernorm_bwd_add BENCH_IMPLS=tvmnorm_tuned,tvmnorm_default CHECK_SECONDS=90 \
  BENCH_SECONDS=100 OUT=$X timeout 500 bash bench/h200_tune.sh > "$X/h200-tune.log" 2>&1
el "tune rc $?"; tail -25 "$X/h200-tune.log"; ls "$X"
