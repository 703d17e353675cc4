# lease 41d, call 2: the decode forward at hidden 512 (rmsnorm 512 x 64 rows tied torch eager at
# 5.0 us in h200-tuned.json), the library's small-call kernel beside torch eager, three rounds
set -uo pipefail
source .device/b/activate.sh || exit 1
export PYTHONUNBUFFERED=1
X=$OUT/x; mkdir -p "$X"
finish() { tar czf "$OUT/x.tgz" -C "$OUT" x; }
trap finish EXIT
python -c "from tvmnorm.build import source_hash; print(source_hash())" > "$X/source-hash.txt"
timeout 150 python -m tvmnorm.bench --target cuda --ops rmsnorm_fwd,layernorm_fwd --dtypes bf16 --hidden 512 \
  --rows decode --impls tvmnorm_tuned,torch_eager --rounds 3 --library .device/l41/lib512 \
  --out "$X" --name d512-decode --no-plots --quiet > "$X/d512-decode.log" 2>&1
tail -12 "$X/d512-decode.log"
TVMNORM_LIBRARY=.device/l41/lib512 timeout 60 python bench/gpu_check.py --tuned --out "$X/check" > "$X/check.log" 2>&1
grep SUMMARY "$X/check/h200-tuned-correctness.txt"
