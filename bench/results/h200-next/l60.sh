# the decode forward's kernel against Liger (written in session 58; one call after the staging
# call, ~450 s, on an H100 or an H200): on the H100 of ../h100-run59/ Liger's layernorm forward
# led the small-call kernel that serves decode rows at 38 of 48 cells, by up to 1.8 us (the
# H200's leases never saw it: Liger's launches there were host-bound, 16-75 us). This times the
# served kernel beside its neighbours (bench/decode_probe.py --around-served: weights loaded with
# x, one barrier a row sum, half and twice the threads, the other vector width) and Liger and
# torch eager, each point checked against float64 first, at the catalog's decode rows (1, 8, 64,
# 256): which knob the small-call rule (sched.default.small_call_cuda_heuristic) should take.
# Then rmsnorm at the widths left with time (it led Liger at 47 of 48 cells there).
source bench/lease_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
for part in "layernorm 1024,2560,4096,8192 200" "layernorm 512,896,2048,7168 150" "rmsnorm 896,4096,8192 100"; do
  set -- $part
  mkdir -p "$X/$1-$2"
  timeout "$3" python bench/decode_probe.py --out "$X/$1-$2" --around-served --norms "$1" --hidden "$2" --rounds 3 \
    > "$X/$1-$2.log" 2>&1
  el "$1 $2 rc $?"; grep -v "^copy" "$X/$1-$2.log" | cut -c1-230 | tail -20
done
