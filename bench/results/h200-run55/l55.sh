# lease 55 (session 56), one call after the staging call. On an H200: l54.sh (verify.sh, then lease
# 53's bwd_add records checked and timed). On an H100: the fp16 residual add + norm forward
# (fwd_add), which has no record at any width, tuned over the catalog (24 keys), its library
# checked against float64, benchmarked beside the default, torch eager and Liger, and `tune
# accept`ed: a key without a record is judged against the default of the same run, valid on any
# card (TUNE_S, CHECK_S, BENCH_S shrink it; ~500 s).
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  source .device/next/l54.sh
else
  JOB=fwd_add DTYPES=fp16 PHASE=bench TUNE_SECONDS=${TUNE_S:-260} CHECK_SECONDS=${CHECK_S:-60} \
    BENCH_SECONDS=${BENCH_S:-150} bash .device/next/job.sh
fi
