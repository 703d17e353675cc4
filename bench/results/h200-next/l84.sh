# lease 84 (session 71), one call after the staging call, ON AN H200 ONLY (carry .device/b,
# .device/next; ~170 s): lease 82's two adopted T (layernorm 2560 at 48, rmsnorm 5120 at 40,
# chosen on an H100) checked against float64 and timed on the H200 against the records at their
# former T (64 both), whole bf16 backward calls at 16384 tokens, old new new old old new.
source bench/lease_env.sh || exit 1
export TVMNORM_CACHE=/tmp/tvmnorm-cache H=2560,5120
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); el "$gpu"
case "$gpu" in *H200*) ;; *) el "not an H200: nothing to do"; exit 0 ;; esac
python - <<'PY'
from tvmnorm import NormKey
from tvmnorm.tune import load_records, save_records, with_chunk_rows
recs = load_records("cuda")
for norm, h in (("layernorm", 2560), ("rmsnorm", 5120)):
    k = NormKey(norm=norm, stage="bwd", hidden_size=h).pack()
    recs[k] = with_chunk_rows(recs[k], recs[k]["chunk_rows_ab"]["from_T"])
save_records("cuda", recs, "/tmp/sched-old")
PY
for n in old new; do
  s=$([ $n = old ] && echo /tmp/sched-old || echo schedules)
  timeout 100 python -m tvmnorm build --target cuda --norms rmsnorm,layernorm --hidden "$H" --stages bwd --dtypes bf16 \
    --tuned-only --layouts compact --schedules $s --out /tmp/lib-$n > "$X/build-$n.log" 2>&1; el "build $n $?"
done
mkdir -p "$X/check"; TVMNORM_LIBRARY=/tmp/lib-new timeout 60 python bench/gpu_check.py --tuned --out "$X/check" > "$X/check.log" 2>&1
el "check rc $?"; tail -2 "$X/check.log"
i=0
for r in old new new old old new; do
  TVMNORM_LIBRARY=/tmp/lib-$r timeout 40 python -m tvmnorm.bench --target cuda --ops rmsnorm_bwd,layernorm_bwd \
    --dtypes bf16 --hidden "$H" --rows train --impls tvmnorm_tuned --out "$X/ab" --name $r-$i --no-plots > /dev/null 2>&1
  el "$r-$i $?"; i=$((i + 1))
done
python bench/ab_table.py "$X/ab"
rm -f "$X/ab"/*.csv
