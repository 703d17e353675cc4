# lease 41b, call 2: the torch ops' GPU tests (CUDA-graph capture, make_graphed_callables: never
# run on a GPU), then host time a call: the lean host path, graph replays and the peers
set -uo pipefail
source .device/b/activate.sh || exit 1
export PYTHONUNBUFFERED=1
X=$OUT/x; mkdir -p "$X"
finish() { tar czf "$OUT/x.tgz" -C "$OUT" x; }
trap finish EXIT
T0=$(date +%s)
el() { echo "[$(($(date +%s) - T0)) s] $*"; }
python -c "from tvmnorm.build import source_hash; print(source_hash())" > "$X/source-hash.txt"
git log --oneline -1 > "$X/commit.txt" 2>/dev/null
SHARDS=12 GPUS=1 OUT=$X/t TEST_SECONDS=240 bash bench/gpu_tests.sh tests/test_torch_gpu.py > "$X/t.log" 2>&1
el "$(tail -3 "$X/t.log")"
export TVMNORM_CACHE=/tmp/tc
timeout 260 python bench/host_overhead.py --out "$X" --name host-overhead --hidden 128,1024,4096,7168 \
  --impls tvmnorm,tvmnorm_kernel,torch_eager,liger,tvmnorm_graph,torch_eager_graph > "$X/host-overhead.log" 2>&1
el "host: $(tail -1 "$X/host-overhead.log")"
timeout 60 python .device/l41/layers.py > "$X/layers.txt" 2>&1
el "layers"
