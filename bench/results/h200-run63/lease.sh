# lease 62 (session 59; one call after staging, ~330 s): decode_probe --rule-knobs at every catalog
# width, both norms, with the committed small-call rule (16 bytes a thread, one barrier a row
# sum): a second sample of the rule against its knobs (after lease 61's four layernorm widths),
# above all whether two barriers a row sum (-ws) is the faster for layernorm's two row sums.
source bench/lease_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
for part in "layernorm 170" "rmsnorm 150"; do
  set -- $part
  timeout "$2" python bench/decode_probe.py --out "$X/$1" --rule-knobs --norms "$1" --rounds 3 \
    --hidden 1024,2560,4096,8192,7168,5120,3584,2048,1536,896,512,128 > "$X/$1.log" 2>&1
  el "$1 rc $?"
done
