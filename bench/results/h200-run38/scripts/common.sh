# sourced by the l38 scripts (second call of a lease): TVM, the JIT cache, versions into $OUT/x
set -uo pipefail
source .device/b/activate.sh || exit 1
mkdir -p /tmp/tvmnorm-cache && tar xJf .device/tc.txz -C /tmp/tvmnorm-cache --strip-components=1
export TVMNORM_CACHE=/tmp/tvmnorm-cache PYTHONUNBUFFERED=1
X=$OUT/x; mkdir -p "$X"
python - > "$X/device.txt" <<'PY'
import importlib.metadata as md, torch, tvm, tvm_ffi, triton
print(torch.cuda.get_device_name(), "torch", torch.__version__, "tvm", tvm.__version__, "ffi", tvm_ffi.__version__,
      "triton", triton.__version__, "liger", md.version("liger-kernel"))
PY
python -c "from tvmnorm.runtime import cache_dir; print(cache_dir().name)" > "$X/source-hash.txt"
ls /tmp/tvmnorm-cache >> "$X/source-hash.txt"
finish() { tar czf "$OUT/x.tgz" -C "$OUT" x; }
trap finish EXIT
