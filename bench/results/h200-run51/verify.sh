# lease 51, last call: the five records adopted from the H100 A/B, checked and timed on this
# machine against the committed ones (old/new libraries of those keys alone), old, new, new, old
# Before the lease: mkdir -p .device/l51/old && git show 80ebf40:schedules/cuda-sm_90.json > .device/l51/old/cuda-sm_90.json
# (the records before the adoption; OLD names another folder of them); carry .device/l51 with
# .device/b; "new" is schedules/ as committed
source bench/lease_env.sh || exit 1
OLD=${OLD:-.device/l51/old}
export TVMNORM_CACHE=/tmp/tvmnorm-cache
sel=(--target cuda --keys 0x6004124,0x14002095,0x2002095,0x8002095,0x802094 --tuned-only --layouts compact)
for v in old new; do timeout 240 python -m tvmnorm build "${sel[@]}" --schedules "$([ $v = old ] && echo "$OLD" || echo schedules)" --out /tmp/lib-$v > "$X/build-$v.log" 2>&1 & done
wait; el "built"; tail -1 "$X/build-old.log" "$X/build-new.log"
for r in old-0 new-0 new-1 old-1; do
  TVMNORM_LIBRARY=/tmp/lib-${r%-*} timeout 90 python -m tvmnorm.bench --target cuda --ops rmsnorm_bwd,layernorm_bwd \
    --dtypes bf16,fp16 --hidden 128,512,1536,2048,5120 --rows train --impls tvmnorm_tuned --out "$X/ab" --name $r --no-plots > "$X/ab-$r.log" 2>&1
  el "$r $?"
done
grep -h "^ *[0-9]\|^[a-z]" "$X/ab-old-0.log" "$X/ab-new-0.log" | head -60
