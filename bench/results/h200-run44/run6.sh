# lease 44, call 6 (review): the folded fp8 GPU test of both layouts
source bench/lease_env.sh || exit 1
export TVMNORM_CACHE=/tmp/tc
timeout 200 python -m pytest -q -rfEs -p no:cacheprovider -m gpu tests/test_torch_gpu.py -k "x_layout_fp8" > "$X/tests.log" 2>&1
el "rc $?"; tail -3 "$X/tests.log"
