# lease 49, call 3: the retune of call 2 resumed (nothing left to tune: recovery, library, float64
# check of every tuned key, benchmark of tuned, default, torch eager and Liger at 16384 tokens,
# `tune accept` against the committed records' runs)
source bench/lease_env.sh || exit 1
export TVMNORM_CACHE=/tmp/tvmnorm-cache
KEYS=0x8004125,0xa004125,0xe004125,0x10004125,0x14004125,0x1c004125,0x20004125 HIDDEN=2048,2560,3584,4096,5120,7168,8192 \
  NORMS=layernorm STAGES=bwd BENCH=1 TRIALS=${TRIALS:-32} TUNE_SECONDS=120 CHECK_SECONDS=120 BENCH_SECONDS=150 \
  BENCH_OPS=layernorm_bwd OUT=$X/tune bash bench/h200_tune.sh > "$X/h200-tune-2.log" 2>&1
el "tune/check/bench rc $?"; tail -40 "$X/h200-tune-2.log" | cut -c1-200
python - "$X/tune" <<'PY'
import json, sys, pathlib
d = pathlib.Path(sys.argv[1])
acc = d / "accepted-cuda-sm_90.json"
if acc.exists():
    from tvmnorm.tune import hoist_inits_of, shared_sums_of
    recs = json.loads(acc.read_text())["records"]
    for k, r in recs.items():
        if int(k, 16) in (0x8004125,0xa004125,0xe004125,0x10004125,0x14004125,0x1c004125,0x20004125):
            print(k, r.get("key"), r.get("run_us"), "shared_sums", shared_sums_of(r), "hoist", hoist_inits_of(r))
PY
