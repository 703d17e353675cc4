# lease 68 (written in session 61), one call after the staging call (carry .device/b, .device/next
# with h100rec.txz from `bash bench/results/h200-run67/l66.sh pack`), H200 only, ~350 s: the 28 of
# the 72 H100-adopted records of leases 55-58 that lease 67's benchmark ran out of time before
# timing (../h200-run67/h100rec-bench/), each beside its default at 16384 tokens, one process a
# set so that each writes its JSON. After the lease, here:
#   python -m tvmnorm bench --merge X/h200-h100rec-*.json --out DIR --name merged   # then
#   python -m tvmnorm.tune accept schedules/cuda-sm_90.json DIR/merged.json schedules/cuda-sm_90.json \
#     --accepted schedules/cuda-sm_90.json   # a record slower than its default beyond 2% -> the default's
source bench/lease_env.sh || exit 1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); el "$GPU"
case "$GPU" in *H200*) ;; *) el "not an H200: the H100 tuned and accepted these records already"; exit 0 ;; esac
export TVMNORM_CACHE=/tmp/tvmnorm-cache TVMNORM_LIBRARY=/tmp/lib-h100rec
[ -f $TVMNORM_LIBRARY/manifest.json ] || { mkdir -p $TVMNORM_LIBRARY && tar xJf .device/next/h100rec.txz -C $TVMNORM_LIBRARY --strip-components=1; }
untimed() {  # name ops dtype widths
  timeout ${BENCH_S:-150} python -m tvmnorm.bench --target cuda --ops "$2" --dtypes "$3" --hidden "$4" --rows train \
    --impls tvmnorm_tuned,tvmnorm_default --out "$X" --name "h200-h100rec-$1" --no-plots > "$X/$1.log" 2>&1
  el "$1 rc $?"; grep "^\[" "$X/$1.log" | cut -c1-150
}
untimed ln-fwd_add-fp16 layernorm_fwd_add fp16 128,2560,3584,4096,5120,8192
untimed ln-fwd_add_fp8 layernorm_fwd_add_fp8 bf16 128,896,1024,2048,2560,3584,4096,5120,8192
untimed ln-bwd_add-fp16 layernorm_bwd_add fp16 128,512,896,1024,1536,2048,2560,3584,4096,5120,7168,8192
untimed rms-bwd_add-fp16 rmsnorm_bwd_add fp16 128
