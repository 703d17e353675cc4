# lease 78 (next session), one call after the staging call, on any GPU (carry .device/b,
# .device/proof; ~300 s): why the bf16 backward at 2560 and 5120 trails its neighbours' frac on
# both cards (H100 lease 77: rmsnorm 0.79 / 0.77, layernorm 0.68 / 0.68 against 0.85-0.88 at
# 4096; H200: layernorm 0.66 / 0.68 against 0.77). Lease 77's retune from another seed found
# kernels of the same speed, and its database (tuning_logs/cuda-sm_90/run-2026-12-07-l77-bwd-
# 2560-5120/) holds no shape near 4096's efficiency: at 5120 every threads x vec point took
# >= 213 us (rmsnorm) and >= 243.9 (layernorm) for the dx, though 5120's records split a row
# as 4096's do (16 columns a thread, 2 blocks an SM, 256 blocks at T = 64). Nsight Compute on the
# committed records' dx at each width beside its power-of-two neighbour: DRAM throughput,
# achieved occupancy and its limiter, warp stalls (bench/h200_ncu.sh), at 16384 tokens.
source bench/lease_env.sh || exit 1
export TVMNORM_CACHE=/tmp/tvmnorm-cache TVMNORM_LIBRARY=/tmp/tvmnorm-lib-proof
if [ ! -f "$TVMNORM_LIBRARY/manifest.json" ]; then
  mkdir -p "$TVMNORM_LIBRARY" && tar xJf .device/proof/lib.txz -C "$TVMNORM_LIBRARY" --strip-components=1 || exit 1
fi
el "$(nvidia-smi --query-gpu=name --format=csv,noheader)"
OUT=$X timeout 420 bash bench/h200_ncu.sh \
  "rmsnorm_bwd 4096 tvmnorm_tuned dx_kernel" "rmsnorm_bwd 5120 tvmnorm_tuned dx_kernel" \
  "layernorm_bwd 4096 tvmnorm_tuned dx_kernel" "layernorm_bwd 5120 tvmnorm_tuned dx_kernel" \
  "layernorm_bwd 2048 tvmnorm_tuned dx_kernel" "layernorm_bwd 2560 tvmnorm_tuned dx_kernel"
el "ncu rc $?"
grep -h -E "^==|Duration|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Size|Grid Size|Waves Per SM|Block Limit" \
  "$X"/ncu/*.txt | cut -c1-150 | head -120
