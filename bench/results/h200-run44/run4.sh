# lease 44, call 4: a library's records replayed for strided and per-head x (build.RECORDS,
# Registry.get(..., layout)): the GPU tests of those kernels (test_gpu_core builds its own library
# of seven committed records), and a library of the bf16 128/4096 keys for call 5's timing
source bench/lease_env.sh || exit 1
export TVMNORM_CACHE=/tmp/tc
SHARDS=2 GPUS=1 OUT=$X/t TEST_SECONDS=330 bash bench/gpu_tests.sh tests/test_gpu_core.py -k "tuned_records" \
  > "$X/tests.log" 2>&1 &
python -m tvmnorm build --target cuda --hidden 128,4096 --stages fwd,bwd --dtypes bf16 --out .device/l44lib --jobs 8 \
  > "$X/build.log" 2>&1
el "build rc $?"; tail -2 "$X/build.log"
wait
el "tests done"; tail -3 "$X/tests.log"; head -20 "$X/t/gpu-tests/summary.txt"
