#!/usr/bin/env bash
# Before a GPU lease, on this box: what the planned calls carry, built from this tree. A library
# or JIT cache from other kernel sources (key.py, build.py, _tvm.py, compute/, sched/, docstrings
# included: the hash is of the bytes) is refused on the device, as lease 66's library was, so run
# this after the last edit there and check .device/packed-source-hash.txt before the calls.
#   .device/tc.txz          the default kernels the calls time beside the records (~2 min a stage
#                           set on 2 cores): the bf16 and fp8 forward (the proof's decode parts)
#                           and the fp16 fwd_add/bwd_add and bf16 fp8 fwd_add (h200-next/l68.sh;
#                           lease 67's benchmark compiled them on the device and ran out of time)
#   .device/proof/lib.txz   the committed records' library (bench/h200_proof.sh pack, ~3.5 min)
#   .device/next/           h100rec.txz (the 93 H100-adopted records, ~2.5 min), the lease scripts
#                           and old/ (the records l54.sh's verify.sh compares lease 51's against)
# About 12 minutes in all.
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
bash bench/results/h200-run67/l66.sh pack
cp bench/results/h200-next/*.sh bench/results/h200-run51/verify.sh .device/next/
# l54.sh's verify.sh: lease 51's five backward records against the records before them
mkdir -p .device/next/old && git show 80ebf40:schedules/cuda-sm_90.json > .device/next/old/cuda-sm_90.json
python -c "from tvmnorm.build import source_hash; print(source_hash())" | tee .device/packed-source-hash.txt
ls -la .device/tc.txz .device/proof/lib.txz .device/next/
