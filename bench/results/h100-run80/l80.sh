# lease 80 (session 71), one call after the staging call, on any GPU (carry .device/b,
# .device/next; ~300 s): lease 79 (bwd_parts on an H100) found the backward's gap at 2560/5120 in
# the dx, not finalize (layernorm 2560 dx 118.3 us = 0.70 of copy against 0.82-0.87 at
# 2048/4096), and lease 78's Nsight Compute put layernorm 2560's record at 256 blocks of 160
# threads where an SM holds 3 (0.65 waves, 14.7% achieved occupancy). T (rows a chunk) sets the
# grid, and the tuner tries only 16/32/64. The committed records with their dx at other T
# (bwd_parts.py --record-t), float64-checked, dx alone and dx + finalize.
source bench/lease_env.sh || exit 1
export TVMNORM_CACHE=/tmp/tvmnorm-cache
el "$(nvidia-smi --query-gpu=name --format=csv,noheader)"
timeout 420 python bench/bwd_parts.py --out "$X" --norms layernorm,rmsnorm --hidden 2560,5120,2048,4096,7168 \
  --record-t 32,40,48,64,96
el "record-t rc $?"
