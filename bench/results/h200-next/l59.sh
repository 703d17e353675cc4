# the call after l54.sh on an H200 (written in session 57; ~250 s): the records committed from
# H100 leases that l54.sh does not cover, checked against float64 on the H200, as the issue asks
# of every record: the fp16 fwd_add catalog (lease 55), the fp16 bwd_add catalog (lease 56) and
# the bf16 fwd_add with fp8e4m3 output (leases 57 and 58), 72 keys, the library of their records
# alone (--tuned-only); then each timed beside its default at 16384 tokens, to see that what
# `tune accept` judged on the H100 holds here (a record slower than its default by more than 2%
# goes back to `tune accept` with this run's JSON). On an H100 it does nothing.
#   bash bench/results/h200-next/l59.sh pack   # here, before the lease: the library (nvcc, the
#                                              # same tree), packed as .device/next/h100rec.txz
LIB=/tmp/lib-h100rec
keys() {
  python - <<'PY'
from tvmnorm.key import NormKey
from tvmnorm.shapes import hidden_sizes
ks = [NormKey(norm=n, stage=s, itype=t, wtype=t, otype=o, hidden_size=h)
      for h in hidden_sizes("all") for n in ("rmsnorm", "layernorm")
      for s, t, o in (("fwd_add", "fp16", "fp16"), ("bwd_add", "fp16", "fp16"), ("fwd_add", "bf16", "fp8e4m3"))]
print(",".join(f"{k.pack():#x}" for k in ks))
PY
}
build=(python -m tvmnorm build --target cuda --tuned-only --layouts compact --out "$LIB" --keys)
if [ "${1:-}" = pack ]; then
  rm -rf "$LIB" && "${build[@]}" "$(keys)" && mkdir -p .device/next && XZ_OPT="-9 -T0" tar cJf .device/next/h100rec.txz -C /tmp lib-h100rec
  ls -la .device/next/h100rec.txz; exit
fi
source bench/lease_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { el "not an H200: nothing to do"; exit 0; }
export TVMNORM_CACHE=/tmp/tvmnorm-cache TVMNORM_LIBRARY=$LIB
if [ -f .device/next/h100rec.txz ]; then
  mkdir -p "$LIB" && tar xJf .device/next/h100rec.txz -C "$LIB" --strip-components=1; el "unpacked rc $?"
else
  timeout 240 "${build[@]}" "$(keys)" > "$X/build-h100rec.log" 2>&1; el "built rc $?"; tail -1 "$X/build-h100rec.log"
fi
timeout ${CHECK_S:-90} python bench/gpu_check.py --tuned --out "$X" > "$X/check-h100rec.log" 2>&1; el "check rc $?"
tail -3 "$X/check-h100rec.log"
for ops in "rmsnorm_fwd_add,layernorm_fwd_add fp16" "rmsnorm_bwd_add,layernorm_bwd_add fp16" \
           "rmsnorm_fwd_add_fp8,layernorm_fwd_add_fp8 bf16"; do
  set -- $ops
  timeout ${BENCH_S:-120} python -m tvmnorm.bench --target cuda --ops "$1" --dtypes "$2" --shapes all --rows train \
    --impls tvmnorm_tuned,tvmnorm_default --out "$X" --name "h200-h100rec-${1%%,*}-$2" --no-plots \
    > "$X/bench-${1%%,*}-$2.log" 2>&1; el "bench $1 $2 rc $?"
done
grep -h "^ *[0-9]\|^[a-z]" "$X"/bench-*.log | head -90
