# lease 41c, call 2: the small-call rule (one vector a thread at QK-norm's hidden 128): the
# library of the two hidden-128 forward records beside the default (JIT) and torch eager at
# decode rows, three rounds; float64 of the library; the GPU tests of small calls and graphs
set -uo pipefail
source .device/b/activate.sh || exit 1
export PYTHONUNBUFFERED=1
X=$OUT/x; mkdir -p "$X"
finish() { tar czf "$OUT/x.tgz" -C "$OUT" x; }
trap finish EXIT
T0=$(date +%s)
el() { echo "[$(($(date +%s) - T0)) s] $*"; }
python - > "$X/device.txt" <<'PY'
import importlib.metadata as md, torch, tvm, tvm_ffi, triton
print(torch.cuda.get_device_name(), "torch", torch.__version__, "tvm", tvm.__version__, "ffi", tvm_ffi.__version__,
      "triton", triton.__version__, "liger", md.version("liger-kernel"))
PY
python -c "from tvmnorm.build import source_hash; print(source_hash())" > "$X/source-hash.txt"
L=.device/l41/lib128
export TVMNORM_CACHE=/tmp/tc
timeout 200 python -m tvmnorm.bench --target cuda --ops rmsnorm_fwd,layernorm_fwd --dtypes bf16 --hidden 128 \
  --rows decode --impls tvmnorm_tuned,tvmnorm_default,torch_eager --rounds 3 --library $L \
  --out "$X" --name qk-decode --no-plots --quiet > "$X/qk-decode.log" 2>&1
el "bench: $(tail -1 "$X/qk-decode.log")"
TVMNORM_LIBRARY=$L timeout 100 python bench/gpu_check.py --tuned --out "$X/check" > "$X/check.log" 2>&1
el "check: $(grep SUMMARY "$X/check/h200-tuned-correctness.txt")"
SHARDS=8 GPUS=1 OUT=$X/t TEST_SECONDS=200 bash bench/gpu_tests.sh tests/test_gpu_core.py tests/test_torch_gpu.py \
  -k "small_calls or own_kernel or (cuda_matrix and fwd and 128) or replay_in_a_cuda_graph or graphed" > "$X/t.log" 2>&1
el "$(tail -3 "$X/t.log")"
