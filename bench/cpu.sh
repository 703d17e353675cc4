#!/usr/bin/env bash
# CPU numbers: tvmnorm llvm kernels (tuned where the library has them, and the default schedule)
# against torch's CPU F.rms_norm / F.layer_norm, fp32 and bf16, on this machine.
# Writes bench/results/cpu.json, cpu.csv and cpu_*.png.
#
#   . .venv/bin/activate && bash bench/cpu.sh      # the catalog at 2048 tokens
#   TOKENS=512 OPS=rmsnorm_fwd bash bench/cpu.sh
#   IMPLS=tvmnorm_tuned,tvmnorm_default,torch_eager,torch_compile bash bench/cpu.sh
#
# The tuned library is the runtime's (tvmnorm/_lib/llvm or $TVMNORM_LIBRARY); without one the
# tvmnorm_tuned rows say "missing". torch.compile is left out by default: Inductor's C++ build
# takes tens of seconds per shape on two cores.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT_DIR:-bench/results}
TOKENS=${TOKENS:-2048}
OPS=${OPS:-rmsnorm_fwd,rmsnorm_bwd,layernorm_fwd,layernorm_bwd}
IMPLS=${IMPLS:-tvmnorm_tuned,tvmnorm_default,torch_eager}
# torch's OpenMP workers spin instead of sleeping: on this 2-core VM, futex wake-ups after TVM's
# pool has run stalled torch calls for multiples of 16 ms
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-ACTIVE}
# torch eager allocates its outputs on every call; keep freed memory in the heap so each call does
# not fault in fresh pages (page faults are slow on this VM and made torch's times erratic)
export MALLOC_MMAP_THRESHOLD_=${MALLOC_MMAP_THRESHOLD_:-33554432}
export MALLOC_TRIM_THRESHOLD_=${MALLOC_TRIM_THRESHOLD_:-17179869184}
export MALLOC_TOP_PAD_=${MALLOC_TOP_PAD_:-1073741824}
"${PYTHON:-python}" -m tvmnorm.bench --target llvm --ops "$OPS" --dtypes fp32,bf16 --shapes all --rows "$TOKENS" \
  --impls "$IMPLS" --warmup-ms 20 --rep-ms 200 --out "$OUT_DIR" --name cpu "$@"
