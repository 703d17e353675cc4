# lease 49, call 2: shared_sums on the GPU. (1) the GPU tests of the dx with its running sums in
# shared memory (test_cuda_dx_sums_in_shared_memory, float64, 7 points x 6 row counts); (2) the layernorm bf16 backward at
# 2048-8192 retuned from the committed records with shared_sums in the space (TUNE_ONLY: the
# check, benchmark and accept run in call 3 on the same machine)
source bench/lease_env.sh || exit 1
export TVMNORM_CACHE=/tmp/tvmnorm-cache
SHARDS=15 GPUS=1 OUT=$X/ss TEST_SECONDS=200 bash bench/gpu_tests.sh tests/test_gpu_core.py -k "sums_in_shared_memory" \
  > "$X/tests-ss.log" 2>&1
el "shared sums gpu tests rc $?"; tail -2 "$X/tests-ss.log"; head -12 "$X/ss/gpu-tests/summary.txt"
KEYS=0x8004125,0xa004125,0xe004125,0x10004125,0x14004125,0x1c004125,0x20004125 HIDDEN=2048,2560,3584,4096,5120,7168,8192 \
  NORMS=layernorm STAGES=bwd RETUNE=1 TUNE_ONLY=1 TRIALS=${TRIALS:-32} TUNE_SECONDS=${TUNE_SECONDS:-300} \
  OUT=$X/tune bash bench/h200_tune.sh > "$X/h200-tune.log" 2>&1
el "tune rc $?"; tail -30 "$X/tune/tune.log" | cut -c1-200
