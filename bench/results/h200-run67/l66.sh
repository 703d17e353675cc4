# lease 66 (session 60), one call after the staging call (carry .device/b, .device/next,
# .device/proof). On an H200: every record adopted from H100 leases checked against float64 here
# (the issue asks it of every record): the 72 of leases 55-58 (fp16 fwd_add and bwd_add, bf16
# fwd_add with fp8 output), the bf16 bwd_add at 896-5120 (lease 53's ten and the six before them)
# and lease 51's five backward records, one library of their records alone (built here,
# .device/next/h100rec.txz); then the proof's decode forward parts with the small-call rule of
# this tree. On an H100: bench/profile_case.py --gaps at the decode cells where Liger's layernorm
# led in ../h100-run65/ (where a do_bench figure goes between the flush and the call's end).
#   bash .device/next/l66.sh pack   # here, first
#   bash .device/next/l66.sh bench  # a later call on the same H200 (was l59.sh's, ~360 s): the
#                                   # 72 records of leases 55-58 timed beside their defaults at
#                                   # 16384 tokens; one slower than its default by more than 2%
#                                   # goes back to `tune accept` with this run's JSON
LIB=/tmp/lib-h100rec
keys() {
  python - <<'PY'
from tvmnorm.key import NormKey
from tvmnorm.shapes import hidden_sizes
ks = [NormKey(norm=n, stage=s, itype=t, wtype=t, otype=o, hidden_size=h)
      for h in hidden_sizes("all") for n in ("rmsnorm", "layernorm")
      for s, t, o in (("fwd_add", "fp16", "fp16"), ("bwd_add", "fp16", "fp16"), ("fwd_add", "bf16", "fp8e4m3"))]
ks += [NormKey(norm=n, stage="bwd_add", hidden_size=h) for n in ("rmsnorm", "layernorm")
       for h in (896, 1024, 1536, 2048, 2560, 3584, 4096, 5120)]
print(",".join([f"{k.pack():#x}" for k in ks] + "0x6004124,0x14002095,0x2002095,0x8002095,0x802094".split(",")))
PY
}
if [ "${1:-}" = pack ]; then
  rm -rf "$LIB" && python -m tvmnorm build --target cuda --tuned-only --layouts compact --out "$LIB" --keys "$(keys)" \
    && XZ_OPT="-9 -T0" tar cJf .device/next/h100rec.txz -C /tmp lib-h100rec
  ls -la .device/next/h100rec.txz; exit
fi
source bench/lease_env.sh || exit 1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); el "$GPU"
if [ "${1:-}" = bench ]; then
  case "$GPU" in *H200*) ;; *) el "not an H200: nothing to time"; exit 0 ;; esac
  export TVMNORM_CACHE=/tmp/tvmnorm-cache TVMNORM_LIBRARY=$LIB
  [ -f $LIB/manifest.json ] || { mkdir -p "$LIB" && tar xJf .device/next/h100rec.txz -C "$LIB" --strip-components=1; }
  for ops in "rmsnorm_fwd_add,layernorm_fwd_add fp16" "rmsnorm_bwd_add,layernorm_bwd_add fp16" \
             "rmsnorm_fwd_add_fp8,layernorm_fwd_add_fp8 bf16"; do
    set -- $ops
    timeout ${BENCH_S:-120} python -m tvmnorm.bench --target cuda --ops "$1" --dtypes "$2" --shapes all --rows train \
      --impls tvmnorm_tuned,tvmnorm_default --out "$X" --name "h200-h100rec-${1%%,*}-$2" --no-plots \
      > "$X/bench-${1%%,*}-$2.log" 2>&1; el "bench $1 $2 rc $?"
  done
  grep -h "^ *[0-9]\|^[a-z]" "$X"/bench-*.log | head -90
  exit 0
fi
case "$GPU" in
  *H200*)
    mkdir -p "$LIB" && tar xJf .device/next/h100rec.txz -C "$LIB" --strip-components=1; el "unpacked rc $?"
    TVMNORM_CACHE=/tmp/tvmnorm-cache TVMNORM_LIBRARY=$LIB timeout ${CHECK_S:-200} python bench/gpu_check.py --tuned \
      --out "$X" > "$X/check-h100rec.log" 2>&1; el "check rc $?"; tail -4 "$X/check-h100rec.log"
    DECODE_PARTS="rmsnorm_fwd_decode layernorm_fwd_decode rmsnorm_fwd_fp8_decode layernorm_fwd_fp8_decode" \
      DECODE_S=${DECODE_S:-290} bash bench/h200_proof.sh decode 2>&1 | tail -12
    el "decode done" ;;
  *)
    TVMNORM_CACHE=/tmp/tvmnorm-cache TVMNORM_LIBRARY=/tmp/tvmnorm-lib-proof
    export TVMNORM_CACHE TVMNORM_LIBRARY
    [ -f $TVMNORM_LIBRARY/manifest.json ] || { mkdir -p $TVMNORM_LIBRARY && tar xJf .device/proof/lib.txz -C $TVMNORM_LIBRARY --strip-components=1; }
    for op in layernorm_fwd rmsnorm_fwd; do
      timeout 150 python bench/profile_case.py --op $op --hidden 512,3584,4096,8192 --impl tvmnorm_tuned,liger,torch_eager \
        --rows 1 --calls 100 --gaps > "$X/gaps-$op-x1.log" 2>&1; el "$op gaps rc $?"; grep -v "warn\|Warn" "$X/gaps-$op-x1.log" | cut -c1-150
    done ;;
esac
