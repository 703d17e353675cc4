#!/usr/bin/env bash
# After bench/h200_parallel.sh, on the same warm nvidia-h200-x2 machine: merge the records every
# tune job accepted (float64-checked, no slower than the default in its library) into
# schedules/cuda-sm_90.json, build the library from them, run the GPU tests, and benchmark with
# every implementation, one queue of bench/h200.sh parts per GPU.
#
#   source .device/b/activate.sh && OUT=$OUT bash bench/h200_verify.sh
#   PARTS0="rmsnorm_fwd_train" PARTS1="layernorm_fwd_train" TESTS= BUILD= OUT=$OUT bash bench/h200_verify.sh
#     (a second call: the library of the first is reused, no tests)
#
# The GPU tests run first, in SHARDS processes over both GPUs (bench/gpu_tests.sh, bounded by
# TEST_SECONDS), while the library builds on the host; then each GPU runs its queue of parts
# (PARTS0, PARTS1), each bounded by PART_SECONDS, so that the call ends inside the device tool's
# 10 minutes. The parts start only after the tests: many test processes on the host would slow
# the launch of the Python-launched peers being timed. $OUT gets verify.tgz (the merged records,
# the build log, the test logs and each queue's bench/h200.sh output).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/tvmnorm-out}
LIB=${LIB:-/tmp/tvmnorm-lib-verify}
# the bench parts stop by DEADLINE seconds from now (default 540: the device call's 600 s limit
# less the start-up and the final tar), so that verify.tgz is written before the call is killed
export DEADLINE_EPOCH=$(($(date +%s) + ${DEADLINE:-540}))
V=$OUT/verify
mkdir -p "$V"
export PYTHONUNBUFFERED=1 TVMNORM_CACHE=${TVMNORM_CACHE:-/tmp/tvmnorm-cache}
python -c "import tvm, tvm_ffi" || { echo "!! tvm does not import here (PYTHONPATH=${PYTHONPATH:-})"; exit 1; }
if [ -n "${BUILD-1}" ]; then
  # a committed record that a job's `tune accept` dropped stays out (tune.merge_accepted)
  python -m tvmnorm.tune merge schedules/cuda-sm_90.json $(ls /tmp/tvmnorm-tune-*/accepted-cuda-sm_90.json 2>/dev/null) \
    --out "$V/cuda-sm_90.json"
  cp "$V/cuda-sm_90.json" schedules/cuda-sm_90.json
  fp8=${FP8-fp8e4m3}
  # BUILD_STAGES=bwd FP8= builds the backward keys alone (~50 s instead of ~95 s on the host):
  # with PARTS0=rmsnorm_bwd_train PARTS1=layernorm_bwd_train TESTS= it re-benchmarks retuned
  # backward records in one short call, every result packed into verify.tgz
  (time python -m tvmnorm build --target cuda --shapes "${SHAPES:-all}" --stages "${BUILD_STAGES:-fwd,bwd}" \
     --dtypes "${DTYPES:-bf16}" ${fp8:+--fp8 "$fp8"} --out "$LIB" --layouts "${LAYOUTS:-compact}") > "$V/build.log" 2>&1 &
  build=$!
fi
PARTS0=${PARTS0-rmsnorm_fwd_fp8_train}
PARTS1=${PARTS1-rmsnorm_bwd_train layernorm_bwd_train}
if [ -n "${TESTS-1}" ]; then
  SHARDS=${SHARDS:-12} GPUS=2 OUT=$V TEST_SECONDS=${TEST_SECONDS:-300} bash bench/gpu_tests.sh > "$V/tests.log" 2>&1
fi
if [ -n "${build:-}" ] && ! wait "$build"; then
  # without the library every tvmnorm_tuned cell would be "missing": stop before the parts spend
  # the lease's minutes (the seventh lease lost a call to an environment that could not import tvm)
  tail -5 "$V/build.log"; echo "!! the library did not build; no bench parts"
  tar czf "$OUT/verify.tgz" -C "$OUT" verify && rm -rf "$V"
  exit 1
fi
for g in 0 1; do
  parts=PARTS$g
  [ -z "${!parts}" ] || PARTS="${!parts}" FIRST_GPU=$g TVMNORM_LIBRARY=$LIB OUT=$V/gpu$g \
    PART_SECONDS=${PART_SECONDS:-200} bash bench/h200.sh > "$V/gpu$g.log" 2>&1 &
done
wait
tail -3 "$V/build.log" 2>/dev/null; cat "$V/gpu-tests/summary.txt" 2>/dev/null; tail -25 "$V"/gpu*.log 2>/dev/null
tar czf "$OUT/verify.tgz" -C "$OUT" verify && rm -rf "$V"
