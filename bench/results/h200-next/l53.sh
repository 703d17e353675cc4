# lease 53 (session 55), one call after the staging call. On an H200: lease 51's five backward
# records against the records before them (verify.sh, OLD=.device/next/old), then the tune of the
# bf16 backward-with-add keys that have no record (job.sh JOB=bwd_add), whose bench is the next
# call's (PHASE=bench). On an H100 (verify.sh means nothing there): the tune, then at once its
# library, float64 check, bench beside the default, torch eager and Liger, and `tune accept` (keys
# without a record are judged against the default of the same run).
export JOB=bwd_add
if [ "${PHASE:-}" = bench ]; then
  TUNE_SECONDS=120 CHECK_SECONDS=90 BENCH_SECONDS=200 bash .device/next/job.sh
elif nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  PHASE=verify TUNE_SECONDS=160 bash .device/next/job.sh
else
  PHASE=tune TUNE_SECONDS=200 bash .device/next/job.sh
  PHASE=bench TUNE_SECONDS=100 CHECK_SECONDS=80 BENCH_SECONDS=170 bash .device/next/job.sh
fi
