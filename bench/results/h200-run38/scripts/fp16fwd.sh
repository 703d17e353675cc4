# the fp16 forward retuned from its records (second lease's: 15-16 trials, warm timing), 32 trials,
# float64 check, bench beside default/eager/liger, tune accept
. .device/l38/common.sh
date +%s > "$X/t0"
STATE=/tmp/tune-fp16fwd RETUNE=1 STAGES=fwd DTYPES=fp16 TRIALS=32 BENCH=1 BENCH_OPS=rmsnorm_fwd,layernorm_fwd \
  TUNE_SECONDS=${TUS:-360} BENCH_SECONDS=${BS:-140} CHECK_SECONDS=60 OUT=$X bash bench/h200_tune.sh 2>&1 | tail -30 > "$X/fp16fwd.log"
date +%s >> "$X/t0"
cp /tmp/tune-fp16fwd/tune-full.log "$X/" 2>/dev/null
