# lease 45, call 6 (a fresh machine): the rest of tests/test_torch_gpu.py (call 1 ran its layout
# and residual-add tests): the host functions' backward now takes the bwd_add operand
source bench/lease_env.sh || exit 1
mkdir -p /tmp/tc && tar xJf .device/l45/tc.txz -C /tmp/tc --strip-components=1; export TVMNORM_CACHE=/tmp/tc
SHARDS=15 GPUS=1 OUT=$X/t TEST_SECONDS=420 bash bench/gpu_tests.sh tests/test_torch_gpu.py \
  -k "not add_norm and not strided and not per_head and not x_layout and not aligned and not alignment" > "$X/tests.log" 2>&1
el "torch gpu tests rc $?"; tail -3 "$X/tests.log"; head -30 "$X/t/gpu-tests/summary.txt"
