# lease 52, after PHASE=bench of JOB=fwd on the same machine: the library of the committed bf16
# forward records ("old", built here) against the retune's ($STATE/lib, "new"), timed old, new,
# new, old at 16384 tokens (tuned impl only), for ab_accept.py's same-machine accept
source bench/lease_env.sh || exit 1
export TVMNORM_CACHE=/tmp/tvmnorm-cache
hidden=${HIDDEN:-128,896,7168,8192}
timeout 200 python -m tvmnorm build --target cuda --hidden "$hidden" --stages fwd --dtypes bf16 --tuned-only --layouts compact \
  --schedules schedules --out /tmp/lib-old > "$X/build-old.log" 2>&1; el "built old $?"; tail -1 "$X/build-old.log"
for r in old-0 new-0 new-1 old-1; do
  lib=$([ "${r%-*}" = old ] && echo /tmp/lib-old || echo /tmp/tvmnorm-tune-fwd/lib)
  TVMNORM_LIBRARY=$lib timeout 60 python -m tvmnorm.bench --target cuda --ops rmsnorm_fwd,layernorm_fwd \
    --dtypes bf16 --hidden "$hidden" --rows train --impls tvmnorm_tuned --out "$X/ab" --name $r --no-plots > "$X/ab-$r.log" 2>&1
  el "$r $?"
done
grep -h "^ *[0-9]\|^[a-z]" "$X/ab-old-0.log" "$X/ab-new-0.log" | head -60
