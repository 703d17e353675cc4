#!/usr/bin/env bash
# One H200 lease: tune a few keys, build the CUDA library from them, then benchmark the catalog
# (bf16, training rows) for tvmnorm tuned/default, torch eager and Liger against the copy roofline.
# torch.compile is left to bench/h200.sh (one Inductor compile per shape does not fit one call).
#   OUT=/dir bash bench/h200_session.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/h200}
TUNE_HIDDEN=${TUNE_HIDDEN:-4096,7168}
mkdir -p "$OUT"
export TVMNORM_CACHE=/tmp/tvmnorm-cache PYTHONUNBUFFERED=1
timeout "${TUNE_SECONDS:-170}" python -m tvmnorm tune --target cuda --norms rmsnorm --stages fwd --dtypes bf16 \
  --hidden "$TUNE_HIDDEN" --trials "${TRIALS:-16}" --out /tmp/tvmnorm-lib 2>&1 | grep -v "INFO\|DEBUG" | tail -5 \
  | tee "$OUT/tune.log"
tar czf "$OUT/tuning.tgz" schedules tuning_logs 2>/dev/null
[ -f /tmp/tvmnorm-lib/manifest.json ] && export TVMNORM_LIBRARY=/tmp/tvmnorm-lib
timeout "${BENCH_SECONDS:-280}" python -m tvmnorm.bench --target cuda \
  --ops rmsnorm_fwd,rmsnorm_bwd,layernorm_fwd,layernorm_bwd --dtypes bf16 --shapes all --rows train \
  --impls tvmnorm_tuned,tvmnorm_default,torch_eager,liger --out "$OUT" --name h200-tuned --no-plots --quiet \
  2>&1 | tail -60
