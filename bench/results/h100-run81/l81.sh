# lease 81 (session 71), one call after the staging call, on any GPU (carry .device/b,
# .device/proof, .device/next; ~450 s): `tvmnorm tune --sweep-chunk-rows` on the committed bf16
# backward records at 1536/2560/3584/5120 (no search: every record has its trials), i.e. each dx
# replayed at T = 16-96 and timed by the search's own measure; lease 80 (bwd_parts --record-t,
# the library's timer) had layernorm 2560 at T = 48 and rmsnorm/layernorm 5120 at 40 0.87-0.93x
# the time of their own T on an H100. Then the swept library float64-checked (gpu_check.py
# --tuned) and timed against the committed records' (the proof library), old/new/new/old.
# If the sweep fails, the three T lease 80 found are applied as they are (tune.with_chunk_rows).
source bench/lease_env.sh || exit 1
export TVMNORM_CACHE=/tmp/tvmnorm-cache OLD=/tmp/tvmnorm-lib-proof NEW=/tmp/lib-new H=${H:-2560,5120,3584,1536}
if [ ! -f "$OLD/manifest.json" ]; then
  mkdir -p "$OLD" && tar xJf .device/proof/lib.txz -C "$OLD" --strip-components=1 || exit 1
fi
el "$(nvidia-smi --query-gpu=name --format=csv,noheader)"
mkdir -p /tmp/sched-new && cp schedules/cuda-sm_90.json /tmp/sched-new/
timeout 330 python -m tvmnorm tune --target cuda --norms rmsnorm,layernorm --stages bwd --dtypes bf16 --hidden "$H" \
  --trials 1 --sweep-chunk-rows --schedules /tmp/sched-new --logs /tmp/tl --out "$NEW" --layouts compact > "$X/sweep.log" 2>&1
rc=$?; el "sweep rc $rc"; grep -E "chunk sweep|failed|Error|tuning" "$X/sweep.log" | cut -c1-400
if [ $rc -ne 0 ]; then
  python - <<'PY'
from tvmnorm import NormKey
from tvmnorm.tune import load_records, save_records, with_chunk_rows
recs = load_records("cuda")
for norm, h, t in (("layernorm", 2560, 48), ("rmsnorm", 5120, 40), ("layernorm", 5120, 40)):
    k = NormKey(norm=norm, stage="bwd", hidden_size=h).pack()
    recs[k] = with_chunk_rows(recs[k], t)
save_records("cuda", recs, "/tmp/sched-new")
PY
  H=2560,5120
  timeout 150 python -m tvmnorm build --target cuda --norms rmsnorm,layernorm --hidden "$H" --stages bwd --dtypes bf16 \
    --tuned-only --layouts compact --schedules /tmp/sched-new --out "$NEW" > "$X/build-new.log" 2>&1; el "fallback build $?"
fi
cp /tmp/sched-new/cuda-sm_90.json "$X/"
TVMNORM_LIBRARY=$NEW timeout 100 python bench/gpu_check.py --tuned --out "$X" > "$X/check.log" 2>&1; el "check rc $?"; tail -4 "$X/check.log"
for r in old-0 new-0 new-1 old-1; do
  lib=$([ "${r%-*}" = old ] && echo "$OLD" || echo "$NEW")
  TVMNORM_LIBRARY=$lib timeout 50 python -m tvmnorm.bench --target cuda --ops rmsnorm_bwd,layernorm_bwd \
    --dtypes bf16 --hidden "$H" --rows train --impls tvmnorm_tuned --out "$X/ab" --name $r --no-plots > "$X/ab-$r.log" 2>&1
  el "$r $?"
done
python - "$X/ab" <<'PY'
import json, sys, pathlib
runs = {r: {(x["op"], x["hidden"]): x for x in json.load(open(pathlib.Path(sys.argv[1]) / f"{r}.json"))["records"]}
        for r in ("old-0", "new-0", "new-1", "old-1")}
for k in sorted(runs["old-0"]):
    us = [runs[r][k]["us"] for r in runs if k in runs[r]]
    print(k, " ".join(f"{u:.1f}" for u in us), f"new/old {min(us[1:3]) / min(us[0], us[3]):.3f}")
PY
