# lease 40, calls 3 and 4: a third of the GPU suite each (SLICE=1/3, 2/3)
. .device/l40/common.sh
SLICE=$S/3 SHARDS=15 GPUS=1 OUT=$X/s$S TEST_SECONDS=${TS:-540} bash bench/gpu_tests.sh > "$X/s$S.log" 2>&1
el "$(tail -3 "$X/s$S.log")"
