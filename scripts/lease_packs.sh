#!/usr/bin/env bash
# Before a GPU lease, on this box: what the planned calls carry, built from this tree. A library
# or JIT cache from other kernel sources (key.py, build.py, _tvm.py, compute/, sched/, docstrings
# included: the hash is of the bytes) is refused on the device, as lease 66's library was, so run
# this after the last edit there and check .device/packed-source-hash.txt before the calls.
#   .device/tc.txz          the default kernels the calls time beside the records (~2 min a stage
#                           set on 2 cores): the bf16 and fp8 forward (the proof's decode parts)
#                           and the fp16 fwd_add/bwd_add and bf16 fp8 fwd_add (h200-run72/l68.sh
#                           timed records beside them; lease 67's benchmark, compiling them on
#                           the device, had run out of time)
#   .device/proof/lib.txz   the committed records' library (bench/h200_proof.sh pack, ~3.5 min)
#   .device/next/           the lease scripts of bench/results/h200-next/
# About 10 minutes in all. A lease's GPU tests come back with the default kernels they compiled
# (bench/gpu_tests.sh CACHE_BACK=1): kept as .device/test-cache.txz, staged with .device/a while
# the source hash stands.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d .device/a ] && [ -d .device/b ] || bash ../shared/device/pack.sh
W=(python scripts/warm_cache.py --target cuda --out .device/tc2 --jobs "${JOBS:-$(nproc)}" --shapes all)
rm -rf .device/tc2
"${W[@]}" --stages fwd --dtypes bf16 --fp8 fp8e4m3
"${W[@]}" --stages fwd_add,bwd_add --dtypes fp16
"${W[@]}" --stages fwd_add --dtypes bf16 --fp8 fp8e4m3 --fp8-only
XZ_OPT="-9 -T0" tar cJf .device/tc.txz -C .device tc2
bash bench/h200_proof.sh pack
mkdir -p .device/next
cp bench/results/h200-next/*.sh .device/next/
python -c "from tvmnorm.build import source_hash; print(source_hash())" | tee .device/packed-source-hash.txt
ls -la .device/tc.txz .device/proof/lib.txz .device/next/
