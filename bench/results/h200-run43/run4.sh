# lease 43, a third machine: the GPU tests of strided rows (kernels compiled here: new sources)
source bench/lease_env.sh || exit 1
export TVMNORM_CACHE=/tmp/tc
SHARDS=10 GPUS=1 OUT=$X/t TEST_SECONDS=150 bash bench/gpu_tests.sh tests/test_torch_gpu.py tests/test_gpu_core.py \
  -k "strided" > "$X/tests.log" 2>&1
el "strided rc $?"; tail -3 "$X/tests.log"; head -30 "$X/t/gpu-tests/summary.txt"
