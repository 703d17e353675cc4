# lease 44, call 2: every GPU test of the torch layer (x_operand/check_x on every call now),
# the three layout tests fixed after call 1 among them
source bench/lease_env.sh || exit 1
mkdir -p /tmp/tc && tar xJf .device/l44/tc.txz -C /tmp/tc --strip-components=1; export TVMNORM_CACHE=/tmp/tc
SHARDS=15 GPUS=1 OUT=$X/t TEST_SECONDS=420 bash bench/gpu_tests.sh tests/test_torch_gpu.py > "$X/tests.log" 2>&1
el "torch gpu tests rc $?"; tail -3 "$X/tests.log"; head -30 "$X/t/gpu-tests/summary.txt"
