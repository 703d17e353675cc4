# lease 52, one call after the staging call: retune the bf16 forward keys where torch.compile led
# (rmsnorm and layernorm at 128, 896, 7168, 8192) with the search as of d2d314c, bench and accept
# them (job.sh), then the same-machine A/B of the committed records' library against the retune's
export JOB=fwd HIDDEN=128,896,7168,8192
PHASE=tune TUNE_SECONDS=150 bash .device/next/job.sh
PHASE=bench TUNE_SECONDS=90 CHECK_SECONDS=60 BENCH_SECONDS=150 bash .device/next/job.sh
bash .device/next/ab.sh
