#!/usr/bin/env bash
# H200 numbers: the full shape catalog, all six ops, bf16 (DTYPES=bf16,fp16 for fp16 too), every
# implementation (tvmnorm tuned and default, torch eager, torch.compile, Liger), refchecked
# against float64 and timed with triton.testing.do_bench against a 2 GiB copy roofline.
#
#   OUT=/path bash bench/h200.sh      # or: bash bench/h200.sh /path   (default bench/results/h200)
#
# Needs torch with CUDA, triton, liger-kernel and TVM importable (PYTHONPATH is fine), and the
# tuned CUDA library (tvmnorm/_lib/cuda or $TVMNORM_LIBRARY; without it tvmnorm_tuned is "missing").
# Each op runs in its own process, so a CUDA fault in one op cannot take the others down; a
# failing implementation inside an op is recorded as "error"/"wrong" and the run goes on. The
# parts are merged into $OUT/h200.json (+ .csv, plots) at the end.
# Training rows (16384 tokens) for every op; decode rows (1/8/64/256 tokens) for the forward ops
# only, since decode has no backward. Expect torch.compile to dominate the run time (one Inductor
# compile per shape and op).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-bench/results/h200}}
DTYPES=${DTYPES:-bf16}
SHAPES=${SHAPES:-all}
IMPLS=${IMPLS:-tvmnorm_tuned,tvmnorm_default,torch_eager,torch_compile,liger}
mkdir -p "$OUT/parts"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv \
  > "$OUT/nvidia-smi.csv" 2>&1 || true
status=0
run_part() {  # name ops rows
  python -m tvmnorm.bench --target cuda --ops "$2" --dtypes "$DTYPES" --shapes "$SHAPES" --rows "$3" \
    --impls "$IMPLS" --out "$OUT/parts/$1" --name "$1" --no-plots 2>&1 | tee "$OUT/parts/$1.log"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then echo "!! part $1 exited with $rc (see $OUT/parts/$1.log)"; status=1; fi
}
for op in rmsnorm_fwd layernorm_fwd rmsnorm_fwd_fp8 layernorm_fwd_fp8; do
  run_part "${op}_train" "$op" train
  run_part "${op}_decode" "$op" decode
done
for op in rmsnorm_bwd layernorm_bwd; do
  run_part "${op}_train" "$op" train
done
parts=$(ls "$OUT"/parts/*/*.json 2>/dev/null)
if [ -n "$parts" ]; then
  python -m tvmnorm.bench --merge $parts --out "$OUT" --name h200 | tee "$OUT/h200.txt"
fi
exit $status
