# the decode forward's kernel against Liger (written in session 58; one call after the staging
# call, ~550 s, on an H100 or an H200): on the H100 of ../h100-run59/ Liger's layernorm forward
# led the small-call kernel that serves decode rows at 38 of 48 cells, by up to 1.8 us (the
# H200's leases never saw it: Liger's launches there were host-bound, 16.7-75 us). This times the
# served kernel beside its neighbours (bench/decode_probe.py --around-served: weights loaded with
# x, one barrier a row sum, half and twice the threads, the other vector width) and Liger and
# torch eager, each point checked against float64 first, at the catalog's decode rows (1, 8, 64,
# 256): which knob the small-call rule (sched.default.small_call_cuda_heuristic) should take.
# Then rmsnorm at 4096 (it led Liger at 47 of 48 cells there: whether the knobs help it too).
source bench/lease_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
# one width a run, each its own folder and time limit (the probe writes its JSON after each row
# count, so a run cut off keeps what it timed): ~20 points x 4 row counts x 3 rounds is ~100 s
# with the compiles (the forty-first lease's probe: 55 points x 4 in < 250 s)
for part in "layernorm 2560 120" "layernorm 1024 110" "layernorm 8192 110" "layernorm 4096 110" "rmsnorm 4096 90"; do
  set -- $part
  timeout "$3" python bench/decode_probe.py --out "$X/$1-$2" --around-served --norms "$1" --hidden "$2" \
    --rounds 3 > "$X/$1-$2.log" 2>&1
  el "$1 $2 rc $?"; grep -v "^copy" "$X/$1-$2.log" | cut -c1-230 | tail -5
done
