#!/usr/bin/env bash
# Several bench/h200_tune.sh runs at once on a multi-GPU lease (nvidia-h200-x2 / -x4), one GPU
# each, so one lease tunes several slices of the catalog in the time of one:
#   source .device/b/activate.sh && OUT=$OUT bash bench/h200_parallel.sh \
#     "bwd:STAGES=bwd DTYPES=bf16" "fp16:STAGES=fwd DTYPES=fp16"
# Job i runs on GPU i (FIRST_GPU + i) with its own STATE (/tmp/tvmnorm-tune-<name>, so a rerun
# with the same name resumes) and writes $OUT/<name>.tgz: its h200_tune.sh output folder and log
# packed into one file, because the device tool brings back at most 8 files.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/tvmnorm-out}
mkdir -p "$OUT"
i=${FIRST_GPU:-0}
# each job on its own slice of the host's cores: with every job sizing its search threads,
# build workers and TVM/OpenMP pools to the whole machine, two jobs oversubscribed it (a
# suspected cause of the 20-85 s between a bwd task's measurements and its cost-model update in
# the third lease's logs); the pools follow the affinity mask (tvmnorm.targets.usable_cores)
cores=$(nproc)
slice=$((cores / $#))
[ "$slice" -ge 1 ] || slice=1
k=0
for job in "$@"; do
  name=${job%%:*}
  vars=${job#*:}
  pin=()
  if command -v taskset > /dev/null && [ "$#" -gt 1 ]; then
    pin=(taskset -c "$((k * slice))-$((k * slice + slice - 1))")
  fi
  (
    # shellcheck disable=SC2086 - the job's VAR=value words are meant to split
    env $vars CUDA_VISIBLE_DEVICES="$i" STATE="/tmp/tvmnorm-tune-$name" OUT="$OUT/$name" \
      OMP_NUM_THREADS="$slice" "${pin[@]}" bash bench/h200_tune.sh > "$OUT/$name.log" 2>&1
    tar czf "$OUT/$name.tgz" -C "$OUT" "$name" "$name.log" && rm -rf "${OUT:?}/$name" "$OUT/$name.log"
  ) &
  i=$((i + 1))
  k=$((k + 1))
done
wait
