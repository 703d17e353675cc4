# For the next H200 lease (written in session 71, named for lease 84, which came as an H100), one
# call after the staging call, ON AN H200 ONLY (carry .device/b, .device/next; ~300 s): every T
# adopted on an H100's A/B (the records that carry `chunk_rows_ab`: lease 82's layernorm bwd 2560
# at 48 and rmsnorm bwd 5120 at 40, lease 84's rmsnorm bwd_add 2560 at 32, lease 87's layernorm
# bwd_add 512 and rmsnorm bwd_add 1024 at 16, lease 88's fp16 rmsnorm bwd_add 512 at 8, layernorm
# bwd_add 512 at 16 and rmsnorm bwd_add 1024 at 24, lease 89's bf16 rmsnorm bwd_add 512 at 8 (from
# lease 87's 16)) checked against float64 and timed on the H200 against the same records at their
# former T (the T of the last A/B's from_T), whole calls at 16384 tokens in the
# records' dtypes, old new new old old new; the other bwd and bwd_add keys at those widths and
# dtypes are in both libraries unchanged (the drift's control).
source bench/lease_env.sh || exit 1
export TVMNORM_CACHE=/tmp/tvmnorm-cache
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); el "$gpu"
case "$gpu" in *H200*) ;; *) el "not an H200: nothing to do"; exit 0 ;; esac
python - > /tmp/ab-hidden <<'PY'
from tvmnorm import NormKey
from tvmnorm.tune import load_records, save_records, with_chunk_rows
recs, hidden, dtypes = load_records("cuda"), set(), set()
for k, rec in recs.items():
    if "chunk_rows_ab" in rec:
        recs[k] = with_chunk_rows(rec, rec["chunk_rows_ab"]["from_T"])
        hidden.add(NormKey.unpack(k).hidden_size)
        dtypes.add(NormKey.unpack(k).itype)
save_records("cuda", recs, "/tmp/sched-old")
print(",".join(str(h) for h in sorted(hidden)), ",".join(sorted(dtypes)))
PY
read H D < /tmp/ab-hidden; el "widths $H dtypes $D"
# the records' library first and its float64 check, so a call cut short still checks them
for n in new old; do
  s=$([ $n = old ] && echo /tmp/sched-old || echo schedules)
  timeout 200 python -m tvmnorm build --target cuda --norms rmsnorm,layernorm --hidden "$H" --stages bwd,bwd_add --dtypes "$D" \
    --tuned-only --layouts compact --schedules $s --out /tmp/lib-$n > "$X/build-$n.log" 2>&1; el "build $n $?"
  if [ $n = new ]; then
    mkdir -p "$X/check"; TVMNORM_LIBRARY=/tmp/lib-new timeout 120 python bench/gpu_check.py --tuned --out "$X/check" > "$X/check.log" 2>&1
    el "check rc $?"; tail -2 "$X/check.log"
  fi
done
i=0
for r in old new new old old new; do
  TVMNORM_LIBRARY=/tmp/lib-$r timeout 100 python -m tvmnorm.bench --target cuda --ops rmsnorm_bwd,layernorm_bwd,rmsnorm_bwd_add,layernorm_bwd_add \
    --dtypes "$D" --hidden "$H" --rows train --impls tvmnorm_tuned --out "$X/ab" --name $r-$i --no-plots > /dev/null 2>&1
  el "$r-$i $?"; i=$((i + 1))
done
python bench/ab_table.py "$X/ab"
rm -f "$X/ab"/*.csv
