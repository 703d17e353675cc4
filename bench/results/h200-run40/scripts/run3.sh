# lease 40, second machine: the small-call forward with its weights loaded early (392cbf5), the
# library of the bf16 and fp8 forward records built here; decode rows against the default rule's
# kernel (the small-call kernel before: weights after the row sums) and torch eager, in rounds
set -uo pipefail
source .device/b/activate.sh || exit 1
export PYTHONUNBUFFERED=1 TVMNORM_CACHE=/tmp/tvmnorm-cache
X=$OUT/x; mkdir -p "$X" /tmp/tvmnorm-cache
finish() { tar czf "$OUT/x.tgz" -C "$OUT" x; }
trap finish EXIT
T0=$(date +%s)
el() { echo "[$(($(date +%s) - T0)) s] $*"; }
tar xJf .device/l40/libsc.txz -C /tmp
tar xJf .device/l40/tc2.txz -C /tmp/tvmnorm-cache --strip-components=1
ls /tmp/tvmnorm-cache
python - > "$X/device.txt" <<'PY'
import importlib.metadata as md, torch, tvm, tvm_ffi, triton
print(torch.cuda.get_device_name(), "torch", torch.__version__, "tvm", tvm.__version__, "ffi", tvm_ffi.__version__,
      "triton", triton.__version__, "liger", md.version("liger-kernel"))
PY
python -c "from tvmnorm.build import source_hash; print(source_hash())" > "$X/source-hash.txt"
python -c "import json;m=json.load(open('/tmp/libsc/manifest.json'));print(m['pdl'], m['tvmnorm_source_hash'], len(m['kernels']))" | tee "$X/libs.txt"
timeout 200 python -m tvmnorm.bench --target cuda --ops rmsnorm_fwd,layernorm_fwd --dtypes bf16 --shapes all --rows decode \
  --impls tvmnorm_tuned,tvmnorm_default,torch_eager --rounds 3 --library /tmp/libsc \
  --out "$X" --name decode-fwd --no-plots --quiet > "$X/decode-fwd.log" 2>&1
el "decode fwd: $(tail -1 "$X/decode-fwd.log")"
timeout 150 python -m pytest -q -rfEs -p no:cacheprovider -m gpu tests/test_gpu_core.py -k "small_calls or early_weights" \
  > "$X/sc-tests.txt" 2>&1 &
TVMNORM_LIBRARY=/tmp/libsc timeout 150 python bench/gpu_check.py --tuned --out "$X/check-sc" > "$X/check-sc.log" 2>&1 &
wait
el "tests: $(tail -1 "$X/sc-tests.txt")"
el "check: $(grep SUMMARY "$X/check-sc/h200-tuned-correctness.txt")"
left=$((330 - ($(date +%s) - T0)))
timeout $left python -m tvmnorm.bench --target cuda --ops rmsnorm_fwd_fp8,layernorm_fwd_fp8 --dtypes bf16 --shapes all --rows decode \
  --impls tvmnorm_tuned,tvmnorm_default --rounds 2 --library /tmp/libsc \
  --out "$X" --name decode-fp8 --no-plots --quiet > "$X/decode-fp8.log" 2>&1
el "decode fp8: $(tail -1 "$X/decode-fp8.log")"
