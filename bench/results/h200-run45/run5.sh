# lease 45, call 5 (a fresh machine): bench/add_norm.py again, its float64 reference now the norm
# of h rounded to bf16 as every impl rounds it (call 4's reference, the exact sum, flagged every
# impl's dw), at 16384 tokens and at 64 (decode)
source bench/lease_env.sh || exit 1
mkdir -p /tmp/tc && tar xJf .device/l45/tc.txz -C /tmp/tc --strip-components=1; export TVMNORM_CACHE=/tmp/tc
(time python -m tvmnorm build --target cuda --hidden 2048,4096,7168,8192 --stages fwd,bwd,bwd_add --dtypes bf16 \
  --layouts compact --out /tmp/lib-add --jobs 16) > "$X/build-add.log" 2>&1
el "build rc $?"; tail -4 "$X/build-add.log"
TVMNORM_LIBRARY=/tmp/lib-add timeout 480 python bench/add_norm.py --out "$X" --tokens 16384,64 --rounds 2 > "$X/add-norm.log" 2>&1
el "add_norm rc $?"; grep -c " ok " "$X/add-norm.log"; grep WRONG "$X/add-norm.log" | cut -c1-200; tail -2 "$X/add-norm.log"
