# lease 43: the whole GPU suite, one half (SLICE given by the caller)
source bench/lease_env.sh || exit 1
mkdir -p /tmp/tc && tar xJf .device/l43/tc.txz -C /tmp/tc --strip-components=1
export TVMNORM_CACHE=/tmp/tc
SLICE=$SLICE SHARDS=15 GPUS=1 OUT=$X/t TEST_SECONDS=470 bash bench/gpu_tests.sh > "$X/tests.log" 2>&1
el "suite slice $SLICE rc $?"; tail -3 "$X/tests.log"; head -30 "$X/t/gpu-tests/summary.txt"
