# the next lease (written in session 57), one call after the staging call. On an H200: l54.sh
# (verify.sh, then lease 53's bwd_add records checked and timed). On an H100: the last eight
# bf16 fwd_add keys with fp8e4m3 output without a record (rmsnorm and layernorm 2560, 3584, 5120,
# 8192; lease 57 tuned the other sixteen), tuned alone (job.sh names them as KEYS; ~15 s a key),
# checked against float64, benchmarked beside the default and torch eager and `tune accept`ed
# against the default of the same run (valid on any card). The JIT cache (.device/tc.txz) holds
# their default kernels:
#   python scripts/warm_cache.py --target cuda --out .device/tc --shapes all --stages fwd_add --dtypes bf16 --fp8 fp8e4m3
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  source .device/next/l54.sh
else
  JOB=fwd_add_fp8 DTYPES=bf16 PHASE=bench HIDDEN=${HIDDEN:-2560,3584,5120,8192} TUNE_SECONDS=${TUNE_S:-230} \
    CHECK_SECONDS=${CHECK_S:-60} BENCH_SECONDS=${BENCH_S:-120} bash .device/next/job.sh
fi
