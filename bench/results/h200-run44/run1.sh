# lease 44, call 1: the GPU tests of x's layouts (strided and per-head rows, their alignment
# checks), then bench/x_layouts.py (the layouts' kernels against compact ones and the peers)
source bench/lease_env.sh || exit 1
mkdir -p /tmp/tc && tar xJf .device/l44/tc.txz -C /tmp/tc --strip-components=1; export TVMNORM_CACHE=/tmp/tc
SHARDS=12 GPUS=1 OUT=$X/t TEST_SECONDS=230 bash bench/gpu_tests.sh tests/test_torch_gpu.py tests/test_gpu_core.py \
  -k "strided or per_head or aligned or alignment" > "$X/tests.log" 2>&1
el "layout tests rc $?"; tail -3 "$X/tests.log"; head -20 "$X/t/gpu-tests/summary.txt"
timeout 280 python bench/x_layouts.py --out "$X" > "$X/x-layouts.log" 2>&1
el "x_layouts rc $?"; tail -45 "$X/x-layouts.log"
