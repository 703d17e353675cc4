# lease 41, call 2: host time of a decode call through the torch ops, this tree against c089224's
# (the torch layer and NormKernel before the lean path) and the peers; then the GPU tests of the
# torch ops and of the forward paths NormKernel now picks by row bounds
set -uo pipefail
source .device/b/activate.sh || exit 1
export PYTHONUNBUFFERED=1
X=$OUT/x; mkdir -p "$X"
finish() { tar czf "$OUT/x.tgz" -C "$OUT" x; }
trap finish EXIT
T0=$(date +%s)
el() { echo "[$(($(date +%s) - T0)) s] $*"; }
python - > "$X/device.txt" <<'PY'
import importlib.metadata as md, torch, tvm, tvm_ffi, triton, platform, os
print(torch.cuda.get_device_name(), "torch", torch.__version__, "tvm", tvm.__version__, "ffi", tvm_ffi.__version__,
      "triton", triton.__version__, "liger", md.version("liger-kernel"), "python", platform.python_version())
print(open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0], os.cpu_count(), "cpus")
PY
cat "$X/device.txt"
python -c "from tvmnorm.build import source_hash; print(source_hash())" > "$X/source-hash.txt"
mkdir -p /tmp/old && tar xzf .device/l41/old-tvmnorm.tgz -C /tmp/old
export TVMNORM_CACHE=/tmp/tc
H=128,1024,4096,7168
timeout 200 python bench/host_overhead.py --out "$X" --name host-new-1 --hidden $H --impls tvmnorm,tvmnorm_kernel,torch_eager,liger > "$X/host-new-1.log" 2>&1
el "new 1: $(tail -1 "$X/host-new-1.log")"
PYTHONPATH=/tmp/old:$PYTHONPATH timeout 100 python bench/host_overhead.py --out "$X" --name host-old-1 --hidden $H --impls tvmnorm,tvmnorm_kernel,torch_eager > "$X/host-old-1.log" 2>&1
el "old 1: $(tail -1 "$X/host-old-1.log")"
timeout 100 python bench/host_overhead.py --out "$X" --name host-new-2 --hidden $H --impls tvmnorm,tvmnorm_kernel,torch_eager > "$X/host-new-2.log" 2>&1
el "new 2"
PYTHONPATH=/tmp/old:$PYTHONPATH timeout 100 python bench/host_overhead.py --out "$X" --name host-old-2 --hidden $H --impls tvmnorm,tvmnorm_kernel,torch_eager > "$X/host-old-2.log" 2>&1
el "old 2"
timeout 60 python .device/l41/layers.py > "$X/layers-new.txt" 2>&1
PYTHONPATH=/tmp/old:$PYTHONPATH timeout 60 python .device/l41/layers.py > "$X/layers-old.txt" 2>&1
el "layers"
timeout 150 python bench/host_overhead.py --out "$X" --name host-compile --hidden 128,4096 --tokens 1,64 --modes fwd --impls tvmnorm,torch_eager,torch_compile > "$X/host-compile.log" 2>&1
el "compile: $(tail -1 "$X/host-compile.log")"
left=$((580 - ($(date +%s) - T0)))
el "tests, $left s"
SHARDS=14 GPUS=1 OUT=$X/t TEST_SECONDS=$left bash bench/gpu_tests.sh tests/test_torch_gpu.py tests/test_gpu_core.py \
  -k "torch_gpu or cuda_matrix or zero_rows or million_rows or int32 or small_calls or past_int32 or cuda_fp8_output or cuda_graph or programmatic or odd_hidden or large_hidden" > "$X/t.log" 2>&1
el "$(tail -3 "$X/t.log")"
