# For a later lease, one call after the staging call, on any GPU (carry .device/b, .device/next):
# `tvmnorm tune --sweep-chunk-rows` over the committed backward records of NORMS x HIDDEN x
# DTYPES x STAGES (bwd, or bwd_add, or both; no search; ~18 s a key on an H100 in lease 86), then,
# where it moved a T (or with AB=1), the swept library float64-checked and timed against the
# committed records' (built here for the same keys: the proof library holds no bwd_add) in
# interleaved whole calls, old new new old old new (bench/ab_table.py), the unmoved keys the
# control for the card's drift: a T moves into schedules/ only where the A/B agrees (lease 83:
# one sweep alone cannot see 5-10% on an H100). Where no T moved the A/B would time the same
# kernels twice (lease 86: ~150 s of the call for new/old 0.993-0.997), so it is left out.
#   NORMS=layernorm HIDDEN=896,1024,1536,3584,7168,8192 bash .device/next/l85.sh
#   STAGES=bwd_add HIDDEN=2560,5120 bash .device/next/l85.sh
#   AGAIN=1 ...: the records that hold a sweep already are swept again (tune --sweep-again)
source bench/lease_env.sh || exit 1
export TVMNORM_CACHE=/tmp/tvmnorm-cache OLD=/tmp/lib-committed NEW=/tmp/lib-swept
norms=${NORMS:-rmsnorm,layernorm} hidden=${HIDDEN:?"HIDDEN: the widths to sweep, e.g. 896,1024"} dtypes=${DTYPES:-bf16} stages=${STAGES:-bwd}
keys=(--norms "$norms" --hidden "$hidden" --stages "$stages" --dtypes "$dtypes")
el "$(nvidia-smi --query-gpu=name --format=csv,noheader)"
mkdir -p /tmp/sched-swept && cp schedules/cuda-sm_90.json /tmp/sched-swept/
# the sweep writes each key's record as it goes (lease 85's, cut off at 300 s, wrote none and
# built no library), so the swept library is built from whatever it saved
timeout ${SWEEP_SECONDS:-300} python -m tvmnorm tune --target cuda "${keys[@]}" --trials 1 --sweep-chunk-rows \
  ${AGAIN:+--sweep-again} --schedules /tmp/sched-swept --logs /tmp/tl --no-build > "$X/sweep.log" 2>&1
el "sweep rc $?"; grep -E "chunk sweep|failed|Error" "$X/sweep.log" | cut -c1-300
moved=$(python - "$X/sweep.json" <<'PY'
import json, sys
from tvmnorm.tune import load_records, read_records
committed = load_records("cuda")
swept = {k: r for k, r in read_records("/tmp/sched-swept/cuda-sm_90.json").items() if "chunk_rows_sweep" in r}
json.dump({r["key"]: {"rows_per_partial": r["rows_per_partial"], "chunk_rows_sweep": r["chunk_rows_sweep"]}
           for r in swept.values()}, open(sys.argv[1], "w"), indent=1)
print(sum(r["rows_per_partial"] != committed[k]["rows_per_partial"] for k, r in swept.items()))
PY
)
el "$moved keys moved T"
if [ "${moved:-0}" = 0 ] && [ "${AB:-0}" != 1 ]; then el "no A/B: no T moved"; exit 0; fi
for lib in old new; do
  s=$([ $lib = old ] && echo schedules || echo /tmp/sched-swept) o=$([ $lib = old ] && echo "$OLD" || echo "$NEW")
  timeout 150 python -m tvmnorm build --target cuda "${keys[@]}" --tuned-only --layouts compact --schedules $s \
    --out "$o" > "$X/build-$lib.log" 2>&1; el "build $lib $?"
done
TVMNORM_LIBRARY=$NEW timeout 100 python bench/gpu_check.py --tuned --out "$X" > "$X/check.log" 2>&1; el "check rc $?"; tail -2 "$X/check.log"
i=0
for r in old new new old old new; do
  lib=$([ $r = old ] && echo "$OLD" || echo "$NEW")
  TVMNORM_LIBRARY=$lib timeout 50 python -m tvmnorm.bench --target cuda --ops "$(for n in ${norms//,/ }; do for s in ${stages//,/ }; do echo "${n}_$s"; done; done | paste -sd,)" \
    --dtypes "$dtypes" --hidden "$hidden" --rows train --impls tvmnorm_tuned --out "$X/ab" --name $r-$i --no-plots > /dev/null 2>&1
  el "$r-$i $?"; i=$((i + 1))
done
python bench/ab_table.py "$X/ab"; rm -f "$X/ab"/*.csv
