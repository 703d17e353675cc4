# lease 73 (session 66), the tree of branch fp8-paired-recomputed, any GPU (an H100's A/B judges
# with ../h200-run51/ab_accept.py; an H200's bench also accepts against ../h200-tuned.json):
# fp8 forwards whose y is recomputed by the store (not kept in registers, keep_y off) now cast
# it two columns at a time as the kept ones do (sched/rows.py; `bench/sass_counts.py --paired`:
# 568 -> 488 SASS instructions at layernorm 1024, 528 -> 456 and 56 -> 40 registers at rmsnorm
# 4096). No committed record's trace pairs them (records replay their traces), so the fp8
# records are retuned, seeded with themselves, and A/B'd against the committed ones.
# Calls after the staging call (carry .device/b, .device/next with copies of this and job.sh):
#   bash .device/next/l73.sh check   # ~330 s: the fp8 GPU tests (169), then gpu_probe's default
#                                    # points paired and +unpaired at 128, 1024, 4096, 7168
#   bash .device/next/l73.sh tune    # ~300 s (resumable: /tmp/tvmnorm-tune-fwd_fp8)
#   bash .device/next/l73.sh bench   # ~500 s on the same machine: library, float64 check,
#                                    # bench, accept, then the old/new/new/old A/B
# Merge the branch only after `check` passed, and the packs (scripts/lease_packs.sh) and the GPU
# suite follow any kernel-source change (../h200-next/README.md, item 2).
case "${1:-}" in
  check)
    source bench/lease_env.sh || exit 1
    export TVMNORM_CACHE=/tmp/tvmnorm-cache
    SHARDS=15 GPUS=1 OUT=$X/t TEST_SECONDS=${TEST_SECONDS:-200} CACHE_BACK=1 bash bench/gpu_tests.sh \
      tests/test_gpu_core.py tests/test_torch_gpu.py -k fp8 > "$X/tests.log" 2>&1
    el "tests rc $?"; head -20 "$X/t/gpu-tests/summary.txt"
    timeout $((${PROBE_SECONDS:-180} + 40)) python bench/gpu_probe.py --otype fp8e4m3 --no-variants \
      --hidden ${PROBE_HIDDEN:-128,1024,4096,7168} --seconds ${PROBE_SECONDS:-180} \
      --out "$X/probe" > "$X/probe.log" 2>&1
    el "probe rc $?"; grep -v "^ *$" "$X/probe.log" | tail -60 | cut -c1-170
    ;;
  tune)
    JOB=fwd_fp8 PHASE=tune TUNE_SECONDS=${TUNE_SECONDS:-280} bash .device/next/job.sh
    ;;
  bench)
    JOB=fwd_fp8 PHASE=bench TUNE_SECONDS=60 CHECK_SECONDS=80 BENCH_SECONDS=180 bash .device/next/job.sh
    FP8=fp8e4m3 HIDDEN=$(python -c "from tvmnorm.shapes import hidden_sizes; print(','.join(map(str, hidden_sizes())))") \
      NEW=/tmp/tvmnorm-tune-fwd_fp8/lib bash bench/lease_ab.sh
    ;;
  *)
    echo "usage: $0 check|tune|bench" >&2
    exit 2
    ;;
esac
