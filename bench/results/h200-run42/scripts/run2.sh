# lease 42, call 3: half the GPU suite (SLICE=0/2, 15 shards) on this tree: every backward call
# through its row count's plan, the default kernels from the nvcc-compiled cache (the carried
# one, nvcc on the device for keys it lacks)
source bench/lease_env.sh || exit 1
mkdir -p /tmp/tc && tar xJf .device/l42/tc.txz -C /tmp/tc --strip-components=1
export TVMNORM_CACHE=/tmp/tc
SLICE=0/2 SHARDS=15 GPUS=1 OUT=$X/t TEST_SECONDS=${TEST_SECONDS:-500} bash bench/gpu_tests.sh > "$X/t.log" 2>&1
el "$(tail -3 "$X/t.log")"
cp "$X/t/gpu-tests/summary.txt" "$X/gpu-tests-summary.txt" 2>/dev/null
