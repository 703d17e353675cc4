# lease 42, third machine: the final tree (the default cache's nvcc fallback added after the whole
# suite ran): the PDL chains and CUDA graphs on the default cache and a library, the decode
# backward, the torch ops in graphs, the forward's small and int64 calls
source bench/lease_env.sh || exit 1
mkdir -p /tmp/tc && tar xJf .device/l42/tc.txz -C /tmp/tc --strip-components=1
export TVMNORM_CACHE=/tmp/tc
SHARDS=15 GPUS=1 OUT=$X/t TEST_SECONDS=150 bash bench/gpu_tests.sh tests/test_gpu_core.py tests/test_torch_gpu.py \
  -k "jit or programmatic or graph or small_calls or past_int32 or (decode_backward and 1000)" > "$X/t.log" 2>&1
el "$(tail -2 "$X/t.log")"
cp "$X/t/gpu-tests/summary.txt" "$X/gpu-tests-summary.txt" 2>/dev/null
