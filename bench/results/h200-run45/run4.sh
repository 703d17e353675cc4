# lease 45, call 4 (a fresh machine): the three library-of-layouts GPU tests call 1's time limit
# left unrun, then bench/add_norm.py (call 3 stopped on Liger's own weight), as call 3
source bench/lease_env.sh || exit 1
mkdir -p /tmp/tc && tar xJf .device/l45/tc.txz -C /tmp/tc --strip-components=1; export TVMNORM_CACHE=/tmp/tc
(time python -m tvmnorm build --target cuda --hidden 2048,4096,7168,8192 --stages fwd,bwd,bwd_add --dtypes bf16 \
  --layouts compact --out /tmp/lib-add) > "$X/build-add.log" 2>&1 &
timeout 300 python -m pytest -q -rfEs -p no:cacheprovider -m gpu tests/test_gpu_core.py -k "test_cuda_library_of_x_layouts and 28679 and (fp8e4m3_cfp32_h7168 or (layernorm_bwd_ibf16_wbf16_obf16_cfp32_h4096-strided))" > "$X/tests-rest.log" 2>&1
el "rest tests rc $?"; tail -3 "$X/tests-rest.log"
wait
el "build done"; tail -4 "$X/build-add.log"
TVMNORM_LIBRARY=/tmp/lib-add timeout 420 python bench/add_norm.py --out "$X" --tokens 16384,64 --rounds 2 > "$X/add-norm.log" 2>&1
el "add_norm rc $?"; cut -c1-150 "$X/add-norm.log" | tail -45
