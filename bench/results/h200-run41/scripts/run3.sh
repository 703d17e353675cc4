# lease 41b, call 3: the decode forward's block shapes at decode rows against torch eager
set -uo pipefail
source .device/b/activate.sh || exit 1
export PYTHONUNBUFFERED=1
X=$OUT/x; mkdir -p "$X"
finish() { tar czf "$OUT/x.tgz" -C "$OUT" x; }
trap finish EXIT
timeout 290 python bench/decode_probe.py --out "$X" --hidden 128 --norms rmsnorm,layernorm > "$X/decode-128.log" 2>&1
tail -8 "$X/decode-128.log"
timeout 250 python bench/decode_probe.py --out "$X/512" --hidden 512 --norms rmsnorm > "$X/decode-512.log" 2>&1
tail -4 "$X/decode-512.log"
