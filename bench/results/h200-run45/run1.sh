# lease 45, call 1: the GPU tests of a library built with x's layouts (test_cuda_library_of_x_layouts:
# seven committed records, nvcc, a module a layout) beside the records-replayed (JIT) ones; the
# torch layer's per-head and strided GPU tests and those of the residual add + norm (bwd_add); in the background, two libraries of the x_layouts
# bench's keys: every layout, and compact alone (for call 2)
source bench/lease_env.sh || exit 1
mkdir -p /tmp/tc && tar xJf .device/l45/tc.txz -C /tmp/tc --strip-components=1; export TVMNORM_CACHE=/tmp/tc
B=(python -m tvmnorm build --target cuda --hidden 128,4096 --stages fwd,bwd --dtypes bf16 --jobs 4)
( (time "${B[@]}" --out /tmp/lib-all) > "$X/build-all.log" 2>&1; (time "${B[@]}" --out /tmp/lib-compact --layouts compact) > "$X/build-compact.log" 2>&1 ) &
SHARDS=2 GPUS=1 OUT=$X/tl TEST_SECONDS=420 bash bench/gpu_tests.sh tests/test_gpu_core.py -k "x_layouts" > "$X/tests-lib.log" 2>&1 &
SHARDS=8 GPUS=1 OUT=$X/tt TEST_SECONDS=420 bash bench/gpu_tests.sh tests/test_torch_gpu.py -k "strided or per_head or aligned or alignment or x_layout or add_norm" > "$X/tests-torch.log" 2>&1
el "torch layout tests rc $?"; tail -2 "$X/tests-torch.log"; head -12 "$X/tt/gpu-tests/summary.txt"
wait
el "library layout tests done"; tail -2 "$X/tests-lib.log"; head -20 "$X/tl/gpu-tests/summary.txt"
tail -4 "$X/build-all.log" "$X/build-compact.log"; ls -la /tmp/lib-all /tmp/lib-compact
