# the next lease (written in session 57), one call after the staging call. On an H200: l54.sh
# (verify.sh, then lease 53's bwd_add records checked and timed). On an H100: the bf16
# residual add + norm forward with fp8e4m3 output (rms_norm_add_fp8 / layer_norm_add_fp8), whose
# 24 keys have no record, tuned in two calls of twelve (HIDDEN; ~15 s a key), checked against
# float64, benchmarked beside the default, torch eager and Liger and `tune accept`ed against the
# default of the same run (valid on any card). The JIT cache (.device/tc.txz) should hold their
# default kernels first:
#   python scripts/warm_cache.py --target cuda --out .device/tc --shapes all --stages fwd_add --dtypes bf16 --fp8 fp8e4m3
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  source .device/next/l54.sh
else
  JOB=fwd_add_fp8 DTYPES=bf16 PHASE=bench HIDDEN=${HIDDEN:-128,512,1024,2048,4096,7168} TUNE_SECONDS=${TUNE_S:-260} \
    CHECK_SECONDS=${CHECK_S:-60} BENCH_SECONDS=${BENCH_S:-150} bash .device/next/job.sh
fi
