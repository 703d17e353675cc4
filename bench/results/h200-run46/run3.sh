# lease 46, call 3: bench/add_norm.py (residual add + norm, forward and backward, against
# tvmnorm's norm of x + residual, torch eager, torch.compile and Liger) with a library of the
# committed records (fwd_add's from call 2 among them), bf16, 16384 tokens
source bench/lease_env.sh || exit 1
export TVMNORM_CACHE=/tmp/tc; mkdir -p /tmp/tc
(time python -m tvmnorm build --target cuda --hidden 2048,4096,7168,8192 --stages fwd,bwd,bwd_add,fwd_add --dtypes bf16 \
  --layouts compact --out /tmp/lib-add --jobs 16) > "$X/build-add.log" 2>&1
el "build rc $?"; tail -4 "$X/build-add.log"
TVMNORM_LIBRARY=/tmp/lib-add timeout 420 python bench/add_norm.py --out "$X" --tokens 16384 --rounds 2 > "$X/add-norm.log" 2>&1
el "add_norm rc $?"; cut -c1-150 "$X/add-norm.log" | tail -45
