# lease 67 (session 61), after the staging call (carry .device/b, .device/next), H100 or H200: the
# bf16 forward at 4096-8192 (rmsnorm and layernorm), where the space now offers the warps' sums
# added by shuffles (space.SHUFFLE_SUMS_WARPS; torch.compile led rmsnorm 7168 and 8192 by up to
# 2.2% on the H200), retuned seeded with the committed records (job.sh JOB=fwd, RETUNE=1), 48
# trials; then bench/lease_ab.sh: the library of the committed records ("old", built here)
# against the retune's ("new"), timed old, new, new, old at 16384 tokens, for ../h200-run51/ab_accept.py.
#   bash .device/next/l67.sh tune    # ~330 s (resumable: the state is /tmp/tvmnorm-tune-fwd)
#   bash .device/next/l67.sh bench   # the next call on the same machine, ~450 s
export JOB=fwd HIDDEN=${HIDDEN:-4096,5120,7168,8192} TRIALS=${TRIALS:-48}
if [ "${1:-}" = tune ]; then
  PHASE=tune TUNE_SECONDS=${TUNE_SECONDS:-300} bash .device/next/job.sh
  exit
fi
PHASE=bench TUNE_SECONDS=90 CHECK_SECONDS=60 BENCH_SECONDS=150 bash .device/next/job.sh
bash bench/lease_ab.sh  # (inline here when it ran; the same steps)
