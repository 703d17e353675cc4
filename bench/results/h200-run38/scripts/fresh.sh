# the 24 bf16 backward keys tuned from nothing (FRESH=1), 32 trials, one task a key at the rule's T:
# s a key for the whole backward catalog; TUNE_ONLY (the records are judged on the CPU against
# the committed ones' tuned times, from the databases)
. .device/l38/common.sh
date +%s > "$X/t0"
STATE=/tmp/tune-fresh FRESH=1 STAGES=bwd DTYPES=bf16 TRIALS=32 TUNE_ONLY=1 TUNE_SECONDS=${TUS:-490} KEY_SECONDS=16 \
  OUT=$X bash bench/h200_tune.sh 2>&1 | tail -30 > "$X/fresh.log"
date +%s >> "$X/t0"
cp /tmp/tune-fresh/tune-full.log "$X/" 2>/dev/null
