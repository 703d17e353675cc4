# lease 53 (session 55), one call after the staging call, sized to the device time the session
# has left (one call; TUNE_S, CHECK_S, BENCH_S shrink it). On an H200: lease 51's five backward
# records against the records before them (verify.sh, OLD=.device/next/old), then the bf16
# backward-with-add keys that have no record (job.sh JOB=bwd_add) tuned, their library checked
# against float64, benchmarked beside the default, torch eager and Liger, and `tune accept`ed (a
# key without a record is judged against the default of the same run). On an H100, where
# verify.sh means nothing: the same without it. HIDDEN: the widths of the keys without a record
# (rmsnorm 4096, 5120; layernorm 896-5120), so that the bench times those cases alone (rmsnorm
# 896-3584 ride along, their records not due).
export JOB=bwd_add HIDDEN=${HIDDEN:-896,1024,1536,2048,2560,3584,4096,5120}
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  AFTER=bench PHASE=verify TUNE_SECONDS=${TUNE_S:-150} CHECK_SECONDS=${CHECK_S:-60} BENCH_SECONDS=${BENCH_S:-120} \
    bash .device/next/job.sh
else
  PHASE=bench TUNE_SECONDS=${TUNE_S:-200} CHECK_SECONDS=${CHECK_S:-80} BENCH_SECONDS=${BENCH_S:-170} \
    bash .device/next/job.sh
fi
