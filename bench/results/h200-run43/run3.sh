# lease 43, a second machine: the GPU tests the two halves of the suite did not reach in their time
source bench/lease_env.sh || exit 1
mkdir -p /tmp/tc && tar xJf .device/l43/tc.txz -C /tmp/tc --strip-components=1
export TVMNORM_CACHE=/tmp/tc
mapfile -t ids < .device/l43/rest.txt
SHARDS=15 GPUS=1 OUT=$X/t TEST_SECONDS=270 bash bench/gpu_tests.sh "${ids[@]}" > "$X/tests.log" 2>&1
el "rest rc $?"; tail -3 "$X/tests.log"; head -30 "$X/t/gpu-tests/summary.txt"
