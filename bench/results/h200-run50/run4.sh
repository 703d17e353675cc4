# lease 50, call 2: (1) the GPU tests of the dx with its sums in shared memory (the staged point
# now at prefetch 1: prefetch 2 cannot launch, _tvm.shared_sums_problem); (2) the shared_sums A/B's
# two libraries: the bf16 backward (and bwd_add) records as committed (off) and with the knob
# (on: .device/ss/on, scripts/knob_ab.py prepare), kept in /tmp for call 3
source bench/lease_env.sh || exit 1
export TVMNORM_CACHE=/tmp/tvmnorm-cache
SHARDS=15 GPUS=1 OUT=$X/ss TEST_SECONDS=150 bash bench/gpu_tests.sh tests/test_gpu_core.py -k "sums_in_shared_memory" \
  > "$X/tests-ss.log" 2>&1
el "shared sums gpu tests rc $?"; tail -3 "$X/tests-ss.log"
sel=(--target cuda --shapes all --norms rmsnorm,layernorm --stages bwd,bwd_add --dtypes bf16 --tuned-only --layouts compact --jobs 16)
timeout 200 python -m tvmnorm build "${sel[@]}" --out /tmp/lib-off > "$X/build-off.log" 2>&1; el "build off rc $?"; tail -2 "$X/build-off.log"
timeout 200 python -m tvmnorm build "${sel[@]}" --schedules .device/ss/on --out /tmp/lib-on > "$X/build-on.log" 2>&1; el "build on rc $?"; tail -2 "$X/build-on.log"
