# the small-call rule's knobs (session 59; one call a norm after the staging call, ~540 s each, H100 or
# H200): bench/decode_probe.py --rule-knobs at every catalog width, the rule (small_call_cuda_heuristic:
# at most 32 bytes a thread in 8-byte vectors, the fewest whole warps that split the row evenly,
# one barrier a row sum, weights loaded with x) against each knob moved alone and the key's
# default forward (the kernel that served decode rows before), beside Liger and torch eager.
#   bash .device/next/l61.sh layernorm|rmsnorm
source bench/lease_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 545 python bench/decode_probe.py --out "$X/$1" --rule-knobs --norms "$1" --rounds 4 \
  --hidden 1024,2560,4096,8192,7168,5120,3584,2048,1536,896,512,128 > "$X/$1.log" 2>&1
el "$1 rc $?"; grep -v "^copy" "$X/$1.log" | cut -c1-250 | tail -50
