# sourced by the l40 scripts (calls after stage.sh): TVM, versions and the libraries into $OUT/x
set -uo pipefail
source .device/b/activate.sh || exit 1
export PYTHONUNBUFFERED=1
X=$OUT/x; mkdir -p "$X"
for L in bf16 fp16; do [ -d /tmp/lib$L ] || tar xJf .device/l40/lib$L.txz -C /tmp; done
python - > "$X/device.txt" <<'PY'
import importlib.metadata as md, torch, tvm, tvm_ffi, triton
print(torch.cuda.get_device_name(), "torch", torch.__version__, "tvm", tvm.__version__, "ffi", tvm_ffi.__version__,
      "triton", triton.__version__, "liger", md.version("liger-kernel"))
PY
python -c "from tvmnorm.build import source_hash; print(source_hash())" > "$X/source-hash.txt"
finish() { tar czf "$OUT/x.tgz" -C "$OUT" x; }
trap finish EXIT
T0=$(date +%s)
el() { echo "[$(($(date +%s) - T0)) s] $*"; }
