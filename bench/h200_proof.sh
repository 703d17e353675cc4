#!/usr/bin/env bash
# The tuning issue's proof measured in one lease: the library of the committed records
# (schedules/cuda-sm_90.json) beside the default kernels, torch eager, torch.compile and Liger,
# with the copy ceiling of each part's own process, every table of bench/results/h200-tuned.json
# from one tree's kernels (that file merges the peers' fastest rounds of many leases).
#
#   bash bench/h200_proof.sh pack        # here: the library (compact x, bf16 + fp16 fwd/bwd, fp8 e4m3
#                                        # forward) built with nvcc, ~3.5 min on 2 cores, packed as
#                                        # .device/proof/lib.txz (~6 MB); the JIT cache: scripts/device_prep.sh
#   run 1, carry .device/a .device/tc.txz (and .device/test-cache.txz where a lease brought one):
#       bash .device/a/stage.sh && bash bench/h200_proof.sh cache
#   run 2, carry .device/b .device/proof:    bash bench/h200_proof.sh bf16
#   run 3, carry .device/b .device/proof:    bash bench/h200_proof.sh fp8-fp16
#                                            (or FP8_S=230 ... fp8: the fp8 forward alone)
#   run 4, carry .device/b .device/proof:    bash bench/h200_proof.sh decode
#                                            (its deadline is 540 s after the part starts: give
#                                            the call timeout_s 600; lease 77's 540 killed it on
#                                            an H100, where the bench runs to that deadline)
#
# Each device part stays inside one 600 s call (DEADLINE_EPOCH stops bench/h200.sh's parts in
# time) and leaves its bench/h200.sh output under $OUT/x/<part>, packed as $OUT/x.tgz with the
# device, versions and kernel-source hash (bench/lease_env.sh, which the part sources).
# bf16: the forward and backward at 16384 tokens, every impl, two rounds (an impl counts at its
# fastest; ~9 s a case, torch.compile's compile the most of it); fp8-fp16: the fp8 forward with
# every impl, fp16 without torch.compile (its fp16 runs were host-bound, bench/results/h200-run38),
# then the GPU tests of the residual add + norm with fp8 output; decode: 1, 8, 64 and 256 tokens
# without torch.compile (one graph per row count). Then, here: `python -m tvmnorm.bench --merge`
# of the parts' JSON and `python bench/readme_tables.py` on the result.
set -uo pipefail
cd "$(dirname "$0")/.."
LIB=/tmp/tvmnorm-lib-proof
part=${1:?"usage: $0 pack|cache|bf16|fp8|fp8-fp16|decode"}
device_part() {  # name seconds: TVM on the path, the library unpacked once a machine, the deadline set
  declare -F el > /dev/null || source bench/lease_env.sh || exit 1
  export TVMNORM_CACHE=/tmp/tvmnorm-cache TVMNORM_LIBRARY=$LIB
  if [ ! -f "$LIB/manifest.json" ]; then
    mkdir -p "$LIB" && tar xJf .device/proof/lib.txz -C "$LIB" --strip-components=1 || exit 1
  fi
  export DEADLINE_EPOCH=$(($(date +%s) + $2))
  P=$X/$1
}
case "$part" in
  pack)
    rm -rf "$LIB" && mkdir -p .device/proof
    python -m tvmnorm build --target cuda --shapes all --stages fwd,bwd --dtypes bf16,fp16 --fp8 fp8e4m3 \
      --layouts compact --out "$LIB" || exit 1
    XZ_OPT="-9 -T0" tar cJf .device/proof/lib.txz -C "$(dirname "$LIB")" "$(basename "$LIB")"
    ls -la .device/proof/lib.txz
    ;;
  cache)
    mkdir -p /tmp/tvmnorm-cache && tar xJf .device/tc.txz -C /tmp/tvmnorm-cache --strip-components=1
    # the default kernels an earlier lease's GPU tests compiled (bench/gpu_tests.sh CACHE_BACK=1)
    [ ! -f .device/test-cache.txz ] || tar xJf .device/test-cache.txz -C /tmp
    ls /tmp/tvmnorm-cache
    ;;
  bf16)
    device_part bf16 550
    ROUNDS=2 PARTS="rmsnorm_fwd_train layernorm_fwd_train rmsnorm_bwd_train layernorm_bwd_train" OUT=$P \
      bash bench/h200.sh > "$P.log" 2>&1
    echo "bf16 rc $?"; grep -h "^\[\|!!" "$P.log" | cut -c1-170 | tail -60
    ;;
  fp8|fp8-fp16)
    # fp8 alone (FP8_S bounds it): the fp8 forward's table after its records changed, where too
    # little device time is left for the fp16 part and the tests
    device_part fp8 "${FP8_S:-300}"
    ROUNDS=2 PARTS="rmsnorm_fwd_fp8_train layernorm_fwd_fp8_train" OUT=$P bash bench/h200.sh > "$P.log" 2>&1
    rc=$?
    echo "fp8 rc $rc"
    if [ "$part" = fp8 ]; then
      grep -h "^\[\|!!" "$P.log" | cut -c1-170 | tail -30
      exit $rc
    fi
    device_part fp16 170
    DTYPES=fp16 ROUNDS=2 IMPLS=tvmnorm_tuned,tvmnorm_default,torch_eager,liger \
      PARTS="rmsnorm_fwd_train layernorm_fwd_train rmsnorm_bwd_train layernorm_bwd_train" OUT=$P \
      bash bench/h200.sh > "$P.log" 2>&1
    echo "fp16 rc $?"
    SHARDS=8 GPUS=1 OUT=$X/t TEST_SECONDS=90 bash bench/gpu_tests.sh tests/test_torch_gpu.py -k "add_norm_fp8" \
      > "$X/tests.log" 2>&1
    echo "tests rc $?"; head -20 "$X/t/gpu-tests/summary.txt"
    grep -h "^\[\|!!" "$X/fp8.log" "$X/fp16.log" | cut -c1-170 | tail -80
    ;;
  decode)
    # DECODE_PARTS / DECODE_S: a subset in less time (the forward's alone after a change to the
    # small-call kernel, which the backward does not run)
    device_part decode "${DECODE_S:-540}"
    ROUNDS=2 IMPLS=tvmnorm_tuned,tvmnorm_default,torch_eager,liger \
      PARTS="${DECODE_PARTS:-rmsnorm_fwd_decode layernorm_fwd_decode rmsnorm_bwd_decode layernorm_bwd_decode rmsnorm_fwd_fp8_decode layernorm_fwd_fp8_decode}" \
      OUT=$P bash bench/h200.sh > "$P.log" 2>&1
    echo "decode rc $?"; grep -h "!!" "$P.log" | head; tail -30 "$P.log" | cut -c1-170
    ;;
  *)
    echo "usage: $0 pack|cache|bf16|fp8|fp8-fp16|decode" >&2
    exit 2
    ;;
esac
