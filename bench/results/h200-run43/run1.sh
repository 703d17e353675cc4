# lease 43, call 2: the GPU tests of what the last lease left unrun (the fp8 forward's host
# path, the PDL chains and CUDA graphs on the final tree) and of this session's CUDA arch
# (default kernels compiled for sm_80 / sm_89 run here from their PTX)
source bench/lease_env.sh || exit 1
mkdir -p /tmp/tc && tar xJf .device/l43/tc.txz -C /tmp/tc --strip-components=1
export TVMNORM_CACHE=/tmp/tc
python -c "from tvmnorm.targets import cuda_arch, target_name; print('cuda_arch', cuda_arch(), target_name('cuda'))" | tee "$X/arch.txt"
SHARDS=15 GPUS=1 OUT=$X/t TEST_SECONDS=420 bash bench/gpu_tests.sh tests/test_gpu_core.py tests/test_torch_gpu.py \
  -k "fp8 or programmatic or older_gpu or graph or translation_units" > "$X/tests.log" 2>&1
el "tests rc $?"; tail -5 "$X/tests.log"; cat "$X/t/gpu-tests/summary.txt" | head -30
