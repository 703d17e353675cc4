# lease 77 (session 70), any GPU (an H100's A/B judges with ../h200-run51/ab_accept.py; the
# job's own `tune accept` compares with the H200's ../h200-tuned.json and is not the judge there):
# the bf16 backward at 2560 and 5120, whose frac trails its neighbours' on both cards (H200:
# layernorm 0.66 / 0.68 against 0.77 at 4096; H100 lease 77: layernorm 0.68 / 0.68, rmsnorm 0.79
# / 0.77 against 0.85-0.88 at 4096), retuned seeded with the committed records (RETUNE=1), 40
# trials with another search seed than the one that found them, then A/B'd against them.
# Calls after the staging call (carry .device/b, .device/next):
#   bash .device/next/l77.sh tune    # ~280 s (resumable: /tmp/tvmnorm-tune-bwd)
#   bash .device/next/l77.sh bench   # ~400 s on the same machine: library, float64 check, bench,
#                                    # then the old/new/new/old A/B
export HIDDEN=${HIDDEN:-2560,5120} TRIALS=${TRIALS:-40} SEED=${SEED:-77}
case "${1:-}" in
  tune)
    JOB=bwd PHASE=tune TUNE_SECONDS=${TUNE_SECONDS:-280} KEY_SECONDS=${KEY_SECONDS:-55} bash .device/next/job.sh
    ;;
  bench)
    JOB=bwd PHASE=bench TUNE_SECONDS=90 CHECK_SECONDS=100 BENCH_SECONDS=150 KEY_SECONDS=${KEY_SECONDS:-55} \
      bash .device/next/job.sh
    STAGES=bwd NEW=/tmp/tvmnorm-tune-bwd/lib bash bench/lease_ab.sh
    ;;
  *)
    echo "usage: $0 tune|bench" >&2
    exit 2
    ;;
esac
