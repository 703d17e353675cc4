# rmsnorm fp16 bwd 1024 (record with trials 0) tuned; torch.compile beside the fp16 forward and backward
. .device/l38/common.sh
date +%s > "$X/t0"
STATE=/tmp/tune-r1024 RETUNE=1 STAGES=bwd DTYPES=fp16 NORMS=rmsnorm HIDDEN=1024 TRIALS=32 BENCH=1 BENCH_OPS=rmsnorm_bwd \
  TUNE_SECONDS=100 BENCH_SECONDS=60 CHECK_SECONDS=40 OUT=$X/r1024 bash bench/h200_tune.sh 2>&1 | tail -20 > "$X/r1024.log"
date +%s >> "$X/t0"
for op in rmsnorm_fwd layernorm_fwd rmsnorm_bwd; do
  timeout ${OPS_SECONDS:-135} python -m tvmnorm.bench --target cuda --ops $op --dtypes fp16 --shapes all --rows train \
    --impls torch_compile --rounds 2 --out "$X/compile" --name fp16-compile-$op --no-plots --quiet > "$X/compile-$op.log" 2>&1
  date +%s >> "$X/t0"
done
