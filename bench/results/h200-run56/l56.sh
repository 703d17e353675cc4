# the next lease (written in session 56), one call after the staging call. On an H200: l54.sh
# (verify.sh, then lease 53's bwd_add records checked and timed). On an H100: the fp16
# backward-with-add keys, which have no record, tuned (HIDDEN narrows them: the whole catalog is
# 24 keys, ~15 s a key, more than one call's tune holds; what the time limit cuts is recovered at
# >= 8 trials and stays due), checked against float64, benchmarked beside the default and torch
# eager, and `tune accept`ed against the default of the same run (valid on any card). The JIT
# cache (.device/tc.txz) should hold the fp16 bwd_add default kernels first:
#   python scripts/warm_cache.py --target cuda --out .device/tc --shapes all --stages bwd_add --dtypes fp16
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  source .device/next/l54.sh
else
  JOB=bwd_add DTYPES=fp16 PHASE=bench HIDDEN=${HIDDEN:-128,512,1024,2048,4096,7168} TUNE_SECONDS=${TUNE_S:-260} \
    CHECK_SECONDS=${CHECK_S:-60} BENCH_SECONDS=${BENCH_S:-150} bash .device/next/job.sh
fi
