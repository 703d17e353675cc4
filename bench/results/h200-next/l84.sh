# For the next H200 lease (written in session 71, named for lease 84, which came as an H100), one
# call after the staging call, ON AN H200 ONLY (carry .device/b, .device/next; ~250 s): the three
# T adopted on H100s (lease 82: layernorm bwd 2560 at 48, rmsnorm bwd 5120 at 40; lease 84:
# rmsnorm bwd_add 2560 at 32) checked against float64 and timed on the H200 against the records at
# their former T (64 each), whole bf16 calls at 16384 tokens, old new new old old new; the other
# bwd and bwd_add keys at 2560/5120 are in both libraries unchanged (the drift's control).
source bench/lease_env.sh || exit 1
export TVMNORM_CACHE=/tmp/tvmnorm-cache H=2560,5120
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); el "$gpu"
case "$gpu" in *H200*) ;; *) el "not an H200: nothing to do"; exit 0 ;; esac
python - <<'PY'
from tvmnorm import NormKey
from tvmnorm.tune import load_records, save_records, with_chunk_rows
recs = load_records("cuda")
for norm, stage, h in (("layernorm", "bwd", 2560), ("rmsnorm", "bwd", 5120), ("rmsnorm", "bwd_add", 2560)):
    k = NormKey(norm=norm, stage=stage, hidden_size=h).pack()
    recs[k] = with_chunk_rows(recs[k], recs[k]["chunk_rows_ab"]["from_T"])
save_records("cuda", recs, "/tmp/sched-old")
PY
for n in old new; do
  s=$([ $n = old ] && echo /tmp/sched-old || echo schedules)
  timeout 100 python -m tvmnorm build --target cuda --norms rmsnorm,layernorm --hidden "$H" --stages bwd,bwd_add --dtypes bf16 \
    --tuned-only --layouts compact --schedules $s --out /tmp/lib-$n > "$X/build-$n.log" 2>&1; el "build $n $?"
done
mkdir -p "$X/check"; TVMNORM_LIBRARY=/tmp/lib-new timeout 60 python bench/gpu_check.py --tuned --out "$X/check" > "$X/check.log" 2>&1
el "check rc $?"; tail -2 "$X/check.log"
i=0
for r in old new new old old new; do
  TVMNORM_LIBRARY=/tmp/lib-$r timeout 60 python -m tvmnorm.bench --target cuda --ops rmsnorm_bwd,layernorm_bwd,rmsnorm_bwd_add,layernorm_bwd_add \
    --dtypes bf16 --hidden "$H" --rows train --impls tvmnorm_tuned --out "$X/ab" --name $r-$i --no-plots > /dev/null 2>&1
  el "$r-$i $?"; i=$((i + 1))
done
python bench/ab_table.py "$X/ab"
rm -f "$X/ab"/*.csv
