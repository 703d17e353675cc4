# lease 82 (session 71), one call after the staging call, on any GPU (carry .device/b,
# .device/proof, .device/next; ~250 s): lease 81's sweep (the search's measure) and lease 80's
# probe (dx + finalize, do_bench) disagree on the best T at 2560/5120; the bench's whole call
# decides here. Two libraries of the committed records with their dx at other T
# (tune.with_chunk_rows), float64-checked, against the committed records' (the proof library),
# in turn old N1 N2 N2 N1 old old N1 N2 (separate processes, as lease_ab.sh):
#   N1: layernorm 2560 @48, layernorm 5120 @40, rmsnorm 5120 @40, rmsnorm 2560 @40 (lease 80's picks)
#   N2: layernorm 2560 @48, layernorm 5120 @64, rmsnorm 5120 @32, rmsnorm 2560 @48 (lease 81's for 5120)
source bench/lease_env.sh || exit 1
export TVMNORM_CACHE=/tmp/tvmnorm-cache OLD=/tmp/tvmnorm-lib-proof H=2560,5120
if [ ! -f "$OLD/manifest.json" ]; then
  mkdir -p "$OLD" && tar xJf .device/proof/lib.txz -C "$OLD" --strip-components=1 || exit 1
fi
el "$(nvidia-smi --query-gpu=name --format=csv,noheader)"
for n in N1 N2; do
  N=$n python - <<'PY'
import os
from tvmnorm import NormKey
from tvmnorm.tune import load_records, save_records, with_chunk_rows
picks = {"N1": (("layernorm", 2560, 48), ("layernorm", 5120, 40), ("rmsnorm", 5120, 40), ("rmsnorm", 2560, 40)),
         "N2": (("layernorm", 2560, 48), ("layernorm", 5120, 64), ("rmsnorm", 5120, 32), ("rmsnorm", 2560, 48))}
recs = load_records("cuda")
for norm, h, t in picks[os.environ["N"]]:
    k = NormKey(norm=norm, stage="bwd", hidden_size=h).pack()
    recs[k] = with_chunk_rows(recs[k], t)
save_records("cuda", recs, f"/tmp/sched-{os.environ['N']}")
PY
  timeout 120 python -m tvmnorm build --target cuda --norms rmsnorm,layernorm --hidden "$H" --stages bwd --dtypes bf16 \
    --tuned-only --layouts compact --schedules /tmp/sched-$n --out /tmp/lib-$n > "$X/build-$n.log" 2>&1; el "build $n $?"
  mkdir -p "$X/check-$n"; TVMNORM_LIBRARY=/tmp/lib-$n timeout 60 python bench/gpu_check.py --tuned --out "$X/check-$n" > "$X/check-$n.log" 2>&1
  el "check $n rc $?"; tail -2 "$X/check-$n.log"
done
i=0
for r in old N1 N2 N2 N1 old old N1 N2; do
  lib=$([ $r = old ] && echo "$OLD" || echo /tmp/lib-$r)
  TVMNORM_LIBRARY=$lib timeout 50 python -m tvmnorm.bench --target cuda --ops rmsnorm_bwd,layernorm_bwd \
    --dtypes bf16 --hidden "$H" --rows train --impls tvmnorm_tuned --out "$X/ab" --name $r-$i --no-plots > /dev/null 2>&1
  el "$r-$i $?"; i=$((i + 1))
done
python - "$X/ab" <<'PY'
import json, sys, pathlib, collections
t = collections.defaultdict(lambda: collections.defaultdict(list))
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.json"), key=lambda p: int(p.stem.split("-")[1])):
    for x in json.load(open(f))["records"]:
        t[(x["op"], x["hidden"])][f.stem.split("-")[0]].append(x["us"])
for k, v in sorted(t.items()):
    print(k, "  ".join(f"{n} " + "/".join(f"{u:.1f}" for u in us) for n, us in sorted(v.items())),
          "  N1/old %.3f N2/old %.3f" % (min(v["N1"]) / min(v["old"]), min(v["N2"]) / min(v["old"])))
PY
rm -f "$X/ab"/*.csv
