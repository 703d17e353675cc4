#!/usr/bin/env bash
# H200 numbers: the full shape catalog, all six ops, bf16 (DTYPES=bf16,fp16 for fp16 too), every
# implementation (tvmnorm tuned and default, torch eager, torch.compile, Liger), refchecked
# against float64 and timed with triton.testing.do_bench against a 2 GiB copy roofline.
#
#   OUT=/path bash bench/h200.sh      # or: bash bench/h200.sh /path   (default bench/results/h200)
#   GPUS=2 OUT=$OUT bash bench/h200.sh   # on nvidia-h200-x2
#   PARTS="rmsnorm_bwd_train layernorm_bwd_train" FIRST_GPU=1 PART_SECONDS=240 bash bench/h200.sh
#     (only these parts, on GPU 1 onwards, each stopped after 240 s: what it timed is kept;
#     DEADLINE_EPOCH=<unix time> also stops every part by then and skips those it cannot start)
#
# Needs torch with CUDA, triton, liger-kernel and TVM importable (PYTHONPATH is fine), and the
# tuned CUDA library (tvmnorm/_lib/cuda or $TVMNORM_LIBRARY; without it tvmnorm_tuned is "missing").
# Each op runs in its own process (GPUS=2 runs two queues of them, one per GPU), so a CUDA fault
# in one op cannot take the others down; a failing implementation inside an op is recorded as
# "error"/"wrong" and the run goes on. The parts are merged into $OUT/h200.json (+ .csv, plots).
# Training rows (16384 tokens) and decode rows (1/8/64/256 tokens) for every op (the backward at
# decode rows: a small fine-tuning step's latency). Expect torch.compile to dominate the run time
# (one Inductor compile per shape and op).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-bench/results/h200}}
DTYPES=${DTYPES:-bf16}
SHAPES=${SHAPES:-all}
IMPLS=${IMPLS:-tvmnorm_tuned,tvmnorm_default,torch_eager,torch_compile,liger}
# decode rows compile one graph per row count (48 per forward op): DECODE_IMPLS can leave
# torch_compile out there
DECODE_IMPLS=${DECODE_IMPLS:-$IMPLS}
# ROUNDS=3 times every impl of a case three times in turn (tvmnorm bench --rounds): the peers'
# medians moved up to 2x between runs
mkdir -p "$OUT/parts"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv \
  > "$OUT/nvidia-smi.csv" 2>&1 || true
# one lock for every bench process on this machine (both queues, and h200_verify.sh's two
# h200.sh runs): a part times only while no other process compiles or times (see HostLock)
export TVMNORM_BENCH_LOCK=${TVMNORM_BENCH_LOCK:-/tmp/tvmnorm-bench.lock}
run_part() {  # name ops rows: one op in its own process; a failure is reported and the run goes on
  local impls=$IMPLS limit=${PART_SECONDS:-}
  [ "$3" = decode ] && impls=$DECODE_IMPLS
  if [ -n "${DEADLINE_EPOCH:-}" ]; then  # a caller's hard stop (the device call's limit)
    local left=$((DEADLINE_EPOCH - $(date +%s)))
    if [ "$left" -lt 20 ]; then echo "!! part $1 skipped: the deadline is near"; return; fi
    [ -z "$limit" ] || [ "$left" -lt "$limit" ] && limit=$left
  fi
  # shellcheck disable=SC2086 - an empty limit runs the part without one
  ${limit:+timeout --signal=INT $limit} python -m tvmnorm.bench --target cuda --ops "$2" \
    --dtypes "$DTYPES" --shapes "$SHAPES" --rows "$3" --impls "$impls" --out "$OUT/parts/$1" --name "$1" \
    ${ROUNDS:+--rounds "$ROUNDS"} --no-plots > "$OUT/parts/$1.log" 2>&1
  local rc=$?
  tail -n 40 "$OUT/parts/$1.log"
  if [ "$rc" -ne 0 ]; then echo "!! part $1 exited with $rc (see $OUT/parts/$1.log)"; touch "$OUT/parts/FAILED"; fi
}
queue=()
for op in rmsnorm_fwd layernorm_fwd rmsnorm_fwd_fp8 layernorm_fwd_fp8; do
  queue+=("${op}_train $op train" "${op}_decode $op decode")
done
for op in rmsnorm_bwd layernorm_bwd; do
  queue+=("${op}_train $op train" "${op}_decode $op decode")
done
if [ -n "${PARTS:-}" ]; then  # only the named parts, in the order given
  picked=()
  for name in $PARTS; do
    for part in "${queue[@]}"; do
      [ "${part%% *}" = "$name" ] && picked+=("$part")
    done
  done
  queue=("${picked[@]}")
fi
# GPUS=n spreads the parts over n GPUs of the machine (part i on GPU i mod n), one queue each:
# torch.compile's per-shape Inductor compiles dominate, so two GPUs halve the wall time
GPUS=${GPUS:-1}
rm -f "$OUT/parts/FAILED"
for ((g = 0; g < GPUS; g++)); do
  (
    export CUDA_VISIBLE_DEVICES=$((g + ${FIRST_GPU:-0}))
    for ((i = g; i < ${#queue[@]}; i += GPUS)); do
      # shellcheck disable=SC2086 - "name op rows" splits into run_part's three arguments
      run_part ${queue[$i]}
    done
  ) &
done
wait
status=0
[ -f "$OUT/parts/FAILED" ] && status=1
parts=$(ls "$OUT"/parts/*/*.json 2>/dev/null)
if [ -n "$parts" ]; then
  python -m tvmnorm.bench --merge $parts --out "$OUT" --name h200 | tee "$OUT/h200.txt"
fi
exit $status
