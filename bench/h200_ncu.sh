#!/usr/bin/env bash
# Nsight Compute on benchmark cases (bench/profile_case.py): one kernel of a later call of each
# case, with the sections that say what bounds a memory-bound kernel (DRAM throughput against its
# peak, achieved occupancy and its limiters, warp stall reasons, launch shape). ncu replays the
# kernel with the caches flushed, and runs with --clock-control none (the device's own clocks, as
# every other timing here).
#
#   TVMNORM_LIBRARY=/tmp/lib OUT=$OUT bash bench/h200_ncu.sh \
#       "layernorm_bwd 1024 tvmnorm_tuned dx_kernel" "rmsnorm_fwd 7168 torch_compile triton" ...
#
# Each case: op hidden impl kernel-regex [launches to skip]. GPUS=2 runs two queues, FIRST_GPU=1
# starts them at GPU 1. NCU_SET=full collects ncu's full set instead (source counters: the
# stall samples by SASS instruction, kept as the report <name>.ncu-rep and its source page, SASS
# with each instruction's samples, as <name>-sass.csv). ROWS=<tokens> profiles a decode call
# instead of the training rows (profile_case.py --rows). Writes $OUT/ncu/<op>-<hidden>-<impl>.txt
# (<op>-<hidden>-<impl>-x<tokens>.txt with ROWS).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/tvmnorm-out}
mkdir -p "$OUT/ncu"
NCU=${NCU:-$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)}
[ -n "$NCU" ] || { echo "!! no ncu here"; exit 1; }
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats
  --section SchedulerStats --section LaunchStats"
[ -n "${NCU_SET:-}" ] && SECTIONS="--set $NCU_SET --import-source no --print-details all"
STALLS="regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
profile() {  # gpu op hidden impl regex [skip]
  local gpu=$1 op=$2 h=$3 impl=$4 re=$5 skip=${6:-2}
  local name="$OUT/ncu/$op-$h-$impl${ROWS:+-x$ROWS}" rep=()
  local f="$name.txt"
  [ -n "${NCU_SET:-}" ] && rep=(-o "$name" -f)
  CUDA_VISIBLE_DEVICES=$gpu timeout 240 "$NCU" --clock-control none --target-processes all -k "regex:$re" \
    --launch-skip "$skip" --launch-count 1 $SECTIONS --metrics "$STALLS" "${rep[@]}" \
    python bench/profile_case.py --op "$op" --hidden "$h" --impl "$impl" --rows "${ROWS:-train}" > "$f" 2>&1 \
    || echo "!! $op $h $impl: rc $?" >> "$f"
  if [ -n "${NCU_SET:-}" ]; then
    "$NCU" -i "$name.ncu-rep" --print-details all >> "$f" 2>&1
    "$NCU" -i "$name.ncu-rep" --page source --print-source sass --csv > "$name-sass.csv" 2>&1
  fi
  grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Block Size|Grid Size" "$f" \
    | sed "s|^|$op $h $impl: |"
}
GPUS=${GPUS:-1}
for g in $(seq 0 $((GPUS - 1))); do
  (i=0; for c in "$@"; do
     [ $((i % GPUS)) -eq "$g" ] && profile $((${FIRST_GPU:-0} + g)) $c
     i=$((i + 1))
   done) &
done
wait
