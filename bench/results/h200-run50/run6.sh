# lease 50, call 3 (a fresh machine): the shared_sums A/B at the widths the probe pointed at (bf16
# backward 5120, 7168, 8192; the whole catalog's two libraries did not build in 200 s each):
# libraries of the records as committed (off) and with the knob (on: .device/ss/on), timed off,
# on, on, off (tvmnorm_tuned, 16384 tokens, float64 check first), then knob_ab.py adopt (report)
source bench/lease_env.sh || exit 1
export TVMNORM_CACHE=/tmp/tvmnorm-cache
sel=(--target cuda --hidden 5120,7168,8192 --norms rmsnorm,layernorm --stages bwd --dtypes bf16 --tuned-only --layouts compact)
timeout 150 python -m tvmnorm build "${sel[@]}" --out /tmp/lib-off > "$X/build-off.log" 2>&1; el "build off rc $?"; tail -1 "$X/build-off.log"
timeout 150 python -m tvmnorm build "${sel[@]}" --schedules .device/ss/on --out /tmp/lib-on > "$X/build-on.log" 2>&1; el "build on rc $?"; tail -1 "$X/build-on.log"
mkdir -p "$X/ab"
for run in off-0 on-0 on-1 off-1; do
  TVMNORM_LIBRARY=/tmp/lib-${run%-*} timeout 60 python -m tvmnorm.bench --target cuda \
    --ops rmsnorm_bwd,layernorm_bwd --dtypes bf16 --hidden 5120,7168,8192 --rows train \
    --impls tvmnorm_tuned --rounds 2 --out "$X/ab" --name "$run" --no-plots > "$X/ab/$run.log" 2>&1
  el "bench $run rc $?"
done
python scripts/knob_ab.py adopt --knob shared_sums --off "$X/ab/off-0.json" "$X/ab/off-1.json" \
  --on "$X/ab/on-0.json" "$X/ab/on-1.json" 2>&1 | tee "$X/ab/adopt.txt"
