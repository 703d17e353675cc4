# lease 46, call 1: the GPU tests of fwd_add (the residual add fused into the forward: every
# stage x dtype x width of the matrix, odd widths, mixed dtypes, zero rows, 65536 wide, two
# million rows, points of the tuned space) and the torch layer's residual add + norm, whose
# forward is now one fwd_add kernel; default kernels, JIT-compiled (the kernel sources changed)
source bench/lease_env.sh || exit 1
export TVMNORM_CACHE=/tmp/tc; mkdir -p /tmp/tc
SHARDS=14 GPUS=1 OUT=$X/t TEST_SECONDS=480 bash bench/gpu_tests.sh tests/test_gpu_core.py tests/test_torch_gpu.py \
  -k "fwd_add or add_norm" > "$X/tests.log" 2>&1
el "tests rc $?"; tail -2 "$X/tests.log"; head -30 "$X/t/gpu-tests/summary.txt"
