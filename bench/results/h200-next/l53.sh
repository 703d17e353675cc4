# lease 53 (session 55): PHASE=tune: on an H200, lease 51's five backward records against the
# records before them (verify.sh, OLD=.device/next/old) first; then the tune of the bf16
# backward-with-add keys that have no record (job.sh JOB=bwd_add). PHASE=bench, the next call on
# the same machine: their library, float64 check, bench beside the default, torch eager and Liger,
# and `tune accept` (keys without a record are judged against the default of the same run)
export JOB=bwd_add
if [ "$PHASE" = tune ] && nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  PHASE=verify TUNE_SECONDS=240 bash .device/next/job.sh
else
  TUNE_SECONDS=${TUNE_SECONDS:-120} CHECK_SECONDS=90 BENCH_SECONDS=200 bash .device/next/job.sh
fi
