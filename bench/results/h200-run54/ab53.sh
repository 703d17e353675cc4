# lease 54 on an H100 (l54.sh hands over when the card is not an H200): the five rmsnorm bf16
# backward-with-add records lease 53's tune re-chose (896, 1024, 1536, 2048, 3584), not committed
# for want of an A/B, timed against the committed ones, old, new, new, old at 16384 tokens, for
# ../h200-run51/ab_accept.py. Before the lease: mkdir -p .device/next/l53acc && cp
# bench/results/h200-run53's job's accepted-cuda-sm_90.json .device/next/l53acc/cuda-sm_90.json
# (the job's x.tgz; not committed, the rejected file and the tuning databases are).
source bench/lease_env.sh || exit 1
export TVMNORM_CACHE=/tmp/tvmnorm-cache
sel=(--target cuda --norms rmsnorm --hidden 896,1024,1536,2048,3584 --stages bwd_add --dtypes bf16 --tuned-only --layouts compact)
for v in old new; do
  timeout 240 python -m tvmnorm build "${sel[@]}" --schedules "$([ $v = old ] && echo schedules || echo .device/next/l53acc)" \
    --out /tmp/lib-$v > "$X/build-$v.log" 2>&1 &
done
wait; el "built"; tail -n 1 "$X/build-old.log" "$X/build-new.log"
TVMNORM_LIBRARY=/tmp/lib-new timeout 60 python bench/gpu_check.py --tuned --out "$X" > "$X/check-new.log" 2>&1
el "check new rc $?"; tail -2 "$X/check-new.log"
for r in old-0 new-0 new-1 old-1; do
  TVMNORM_LIBRARY=/tmp/lib-${r%-*} timeout 90 python -m tvmnorm.bench --target cuda --ops rmsnorm_bwd_add --dtypes bf16 \
    --hidden 896,1024,1536,2048,3584 --rows train --impls tvmnorm_tuned --out "$X/ab" --name $r --no-plots > "$X/ab-$r.log" 2>&1
  el "$r $?"
done
grep -h "^ *[0-9]" "$X"/ab-*.log | head -40
