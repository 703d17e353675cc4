#!/usr/bin/env bash
# The GPU tests in SHARDS pytest processes spread over GPUS GPUs. A GPU test spends most of its
# time on the host, one core: compiling the default kernels it calls (~9 s a backward key's set,
# most of it nvcc; session 64) and the float64 reference. One pytest process needed about 15
# minutes for the 492 GPU tests on an H200 lease, so the tests are cut into shards that run at
# once (they check numbers, not speed: GPUs may be shared) and share one kernel cache.
#
#   source .device/b/activate.sh && SHARDS=12 GPUS=2 OUT=$OUT bash bench/gpu_tests.sh
#   SHARDS=4 GPUS=1 MARK="gpu" bash bench/gpu_tests.sh tests/test_gpu_core.py -k edges
#
# bench/gpu_shards.py deals the ids by their logged seconds (bench/gpu_test_times.tsv: after a
# lease, `python bench/gpu_shards.py merge <the archive's gpu-tests/times-*.txt>`), the tests
# that share a library fixture together (one piece while they fit a shard's fair share), so a
# library is built once a piece, not once a shard that drew one of its tests; a shard sees one
# GPU, so the tests marked multigpu run afterwards in one process that sees all
# GPUS (on the fourth lease the two-device test was skipped in its shard). Each
# shard writes $OUT/gpu-tests/shard-<i>.txt; the summary ($OUT/gpu-tests/summary.txt) adds up
# passed/failed/skipped/errors and lists every failure. TEST_SECONDS bounds each shard. Exit
# status: 0 only if every shard passed. SLICE=i/n runs only the i-th of n interleaved parts of the
# ids (i from 0; the multi-GPU tests go with part 0): on one H200 the whole suite's 15 shards took
# 456-511 s in the twenty-first lease, at the edge of a 600 s call, so two calls run SLICE=0/2
# and SLICE=1/2. The suite has since grown to ~1570 GPU tests, ~14 s each a shard on an H100
# (leases 70, 71, before the shards shared a cache): a quarter (SLICE=i/4) in 15 shards of 300 s
# reached 311-331 of its 392. A shard stopped by TEST_SECONDS is
# counted from its progress characters. PACK=1 packs $OUT/gpu-tests into $OUT/gpu-tests.tgz (a
# device call returns at most 8 files; lease 69's 40 shard files did not come back). IDS=file runs
# only the ids listed in the file; $OUT/gpu-tests/not-reached.txt lists what stopped shards left.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/tvmnorm-out}
SHARDS=${SHARDS:-8}
GPUS=${GPUS:-1}
MARK=${MARK:-gpu}
D=$OUT/gpu-tests
# the shards share one default-kernel cache (tests/conftest.py), by default the one that
# `bench/h200_proof.sh cache` unpacks the staged kernels into
export TVMNORM_TEST_CACHE=${TVMNORM_TEST_CACHE:-/tmp/tvmnorm-cache}
mkdir -p "$D"
# tests marked multigpu need every GPU visible: they run in one more process, after the shards
TVMNORM_LIBRARY_GROUPS=$D/groups.txt python -m pytest --collect-only -q -m "($MARK) and not multigpu" \
  -p no:cacheprovider "${@:-tests}" 2>/dev/null | grep '::' > "$D/ids.txt"
python -m pytest --collect-only -q -m "($MARK) and multigpu" -p no:cacheprovider "${@:-tests}" 2>/dev/null \
  | grep '::' > "$D/ids-multigpu.txt"
if [ -n "${IDS:-}" ]; then
  # IDS=file: only the collected ids listed there (a lease's leftovers, bench/results/*/rest-ids.txt)
  for f in ids ids-multigpu; do
    grep -Fxf "$IDS" "$D/$f.txt" > "$D/$f-only.txt"; mv "$D/$f-only.txt" "$D/$f.txt"
  done
fi
if [ -n "${SLICE:-}" ]; then
  slice_i=${SLICE%/*} slice_n=${SLICE#*/}
  awk -v n="$slice_n" -v i="$slice_i" '(NR - 1) % n == i' "$D/ids.txt" > "$D/ids-slice.txt" && mv "$D/ids-slice.txt" "$D/ids.txt"
  [ "$slice_i" -eq 0 ] || : > "$D/ids-multigpu.txt"
fi
total=$(($(wc -l < "$D/ids.txt") + $(wc -l < "$D/ids-multigpu.txt")))
if [ "$total" -eq 0 ]; then
  # a collection error (an import, a conftest hook) left no ids: say why rather than pass 0 tests
  echo "no test collected (MARK=$MARK${IDS:+, IDS=$IDS}); pytest says:" >&2
  python -m pytest --collect-only -q -m "$MARK" -p no:cacheprovider "${@:-tests}" 2>&1 | tail -15 >&2
  exit 1
fi
echo "$total tests in $SHARDS shards on $GPUS GPU(s), $(wc -l < "$D/ids-multigpu.txt") of them on all GPUs at once"
set -f  # test ids hold brackets: never glob them against file names
python bench/gpu_shards.py deal --ids "$D/ids.txt" --groups "$D/groups.txt" --shards "$SHARDS" --out "$D" || exit 1
for ((i = 0; i < SHARDS; i++)); do
  [ -s "$D/ids-$i.txt" ] || continue
  # shellcheck disable=SC2046 - one argument per test id (ids hold no spaces)
  TVMNORM_TEST_TIMES=$D/times-$i.txt CUDA_VISIBLE_DEVICES=$((i % GPUS)) timeout "${TEST_SECONDS:-540}" python -m pytest -q -rfEs -p no:cacheprovider \
    -m "$MARK" $(cat "$D/ids-$i.txt") > "$D/shard-$i.txt" 2>&1 &
done
wait
if [ -s "$D/ids-multigpu.txt" ]; then
  # shellcheck disable=SC2046 - one argument per test id
  CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((GPUS - 1))) timeout "${TEST_SECONDS:-540}" python -m pytest -q -rfEs \
    -p no:cacheprovider -m "($MARK) and multigpu" $(cat "$D/ids-multigpu.txt") > "$D/shard-multigpu.txt" 2>&1
fi
python bench/gpu_test_summary.py "$D" "$total" | tee "$D/summary.txt"
rc=${PIPESTATUS[0]}
# CACHE_BACK=1: the shared cache comes back as $OUT/test-cache.txz, for the next lease to stage
# (a default kernel took ~10 s of a shard's time to compile, most of a test's)
if [ -n "${CACHE_BACK:-}" ]; then
  XZ_OPT="-6 -T0" tar cJf "$OUT/test-cache.txz" -C "$(dirname "$TVMNORM_TEST_CACHE")" "$(basename "$TVMNORM_TEST_CACHE")"
  ls -la "$OUT/test-cache.txz"
fi
# A device call returns at most 8 files: PACK=1 leaves one archive and the summary beside it
if [ -n "${PACK:-}" ]; then
  cp "$D/summary.txt" "$OUT/gpu-tests-summary.txt"
  tar czf "$OUT/gpu-tests.tgz" -C "$OUT" gpu-tests && rm -rf "$D"
fi
exit "$rc"
