# s a key of the bf16 backward tune with threaded design spaces (17.3 s before, lease 37), at the
# rule's T, from the records; BENCH=1 so that a better record is accepted
. .device/l38/common.sh
date +%s > "$X/t0"
STATE=/tmp/tune-bwdspeed RETUNE=1 STAGES=bwd DTYPES=bf16 HIDDEN=${HID:-3584,4096,5120} TRIALS=32 BENCH=1 BENCH_OPS=rmsnorm_bwd,layernorm_bwd \
  TUNE_SECONDS=${TUS:-240} BENCH_SECONDS=${BS:-150} CHECK_SECONDS=90 OUT=$X bash bench/h200_tune.sh 2>&1 | tail -30 > "$X/bwdspeed.log"
date +%s >> "$X/t0"
cp /tmp/tune-bwdspeed/tune-full.log "$X/" 2>/dev/null
