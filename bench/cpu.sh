#!/usr/bin/env bash
# CPU numbers: tvmnorm llvm kernels (tuned where the library has them, and the default schedule)
# against torch's CPU F.rms_norm / F.layer_norm, fp32 and bf16, on this machine.
# Writes bench/results/cpu.json, cpu.csv and cpu_*.png.
#
#   . .venv/bin/activate && TOKENS=4096 bash bench/cpu.sh      # the catalog at 4096 tokens
#   TOKENS=512 OPS=rmsnorm_fwd bash bench/cpu.sh
#   IMPLS=tvmnorm_tuned,tvmnorm_default,torch_eager,torch_compile bash bench/cpu.sh
#   SPLIT=0 bash bench/cpu.sh     # every impl in one process (see below)
#
# The tuned library is the runtime's (tvmnorm/_lib/llvm or $TVMNORM_LIBRARY); without one the
# tvmnorm_tuned rows say "missing". torch.compile is left out by default: Inductor's C++ build
# takes tens of seconds per shape on two cores.
#
# Threads (measured on the 2-core VM, see bench/cpu-notes.md):
# - TVM sizes its pool to hardware_concurrency / 2 on x86 (it assumes SMT), so on a 2-core box
#   without SMT its kernels ran on ONE core. TVM_NUM_THREADS = the core count fixes that.
# - TVM_BIND_THREADS=0: TVM's core pinning slowed torch's OpenMP threads in the same process.
# - OMP_WAIT_POLICY=PASSIVE: with ACTIVE, torch's own calls stalled for multiples of 8-16 ms
#   even in a process where TVM never ran (medians 10-30x the best call); PASSIVE is stable.
# - Two thread pools in one process (TVM's and torch's OpenMP) still slow each other down on
#   2 cores (a sleeping pool's wake-ups land on the busy core). So by default (SPLIT=1) the
#   tvmnorm impls and the torch impls run in separate processes, each measuring its own copy
#   roofline (NAME-tvm.json, NAME-torch.json), merged into NAME.json; SPLIT=0 runs everything
#   in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT_DIR:-bench/results}
TOKENS=${TOKENS:-4096}
OPS=${OPS:-rmsnorm_fwd,rmsnorm_bwd,layernorm_fwd,layernorm_bwd}
IMPLS=${IMPLS:-tvmnorm_tuned,tvmnorm_default,torch_eager}
SPLIT=${SPLIT:-1}
NAME=${NAME:-cpu}
CORES=$(nproc)
export TVM_NUM_THREADS=${TVM_NUM_THREADS:-$CORES}
export TVM_BIND_THREADS=${TVM_BIND_THREADS:-0}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
# torch eager allocates its outputs on every call; keep freed memory in the heap so each call does
# not fault in fresh pages (page faults are slow on this VM and made torch's times erratic)
export MALLOC_MMAP_THRESHOLD_=${MALLOC_MMAP_THRESHOLD_:-33554432}
export MALLOC_TRIM_THRESHOLD_=${MALLOC_TRIM_THRESHOLD_:-17179869184}
export MALLOC_TOP_PAD_=${MALLOC_TOP_PAD_:-1073741824}
PY=${PYTHON:-python}
bench() {  # impls out_dir name [extra args]
  local impls=$1 dir=$2 name=$3; shift 3
  "$PY" -m tvmnorm.bench --target llvm --ops "$OPS" --dtypes fp32,bf16 --shapes all --rows "$TOKENS" \
    --impls "$impls" --warmup-ms 20 --rep-ms 200 --out "$dir" --name "$name" "$@"
}
if [ "$SPLIT" = 0 ]; then
  bench "$IMPLS" "$OUT_DIR" "$NAME" "$@"
  exit 0
fi
TVM_IMPLS=$(tr , '\n' <<<"$IMPLS" | grep '^tvmnorm' | paste -sd, || true)
TORCH_IMPLS=$(tr , '\n' <<<"$IMPLS" | grep -v '^tvmnorm' | paste -sd, || true)
FILES=()
if [ -n "$TVM_IMPLS" ]; then
  bench "$TVM_IMPLS" "$OUT_DIR" "$NAME-tvm" --no-plots "$@"
  FILES+=("$OUT_DIR/$NAME-tvm.json")
fi
if [ -n "$TORCH_IMPLS" ]; then
  bench "$TORCH_IMPLS" "$OUT_DIR" "$NAME-torch" --no-plots "$@"
  FILES+=("$OUT_DIR/$NAME-torch.json")
fi
"$PY" -m tvmnorm.bench --merge "${FILES[@]}" --out "$OUT_DIR" --name "$NAME"
