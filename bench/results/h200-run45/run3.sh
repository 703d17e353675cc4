# lease 45, call 3: bench/add_norm.py: residual add + norm (tvmnorm.torch.rms_norm_add /
# layer_norm_add, the backward one bwd_add kernel) against tvmnorm's norm of x + residual, torch
# eager, torch.compile and Liger's fused add + RMSNorm, bf16, 16384 tokens, with a library of the
# committed records (the forward and the plain backward tuned; bwd_add has no records: default)
source bench/lease_env.sh || exit 1
[ -d /tmp/tc ] || { mkdir -p /tmp/tc && tar xJf .device/l45/tc.txz -C /tmp/tc --strip-components=1; }
export TVMNORM_CACHE=/tmp/tc
(time python -m tvmnorm build --target cuda --hidden 2048,4096,7168,8192 --stages fwd,bwd,bwd_add --dtypes bf16 \
  --layouts compact --out /tmp/lib-add) > "$X/build-add.log" 2>&1
el "build rc $?"; tail -4 "$X/build-add.log"
TVMNORM_LIBRARY=/tmp/lib-add timeout 450 python bench/add_norm.py --out "$X" --tokens 16384 --rounds 2 > "$X/add-norm.log" 2>&1
el "add_norm rc $?"; cut -c1-150 "$X/add-norm.log" | tail -45
