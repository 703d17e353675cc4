# lease 44, call 5: bench/x_layouts.py at 16384 tokens with call 4's library (tuned compact
# kernels, and their records replayed for the layouts)
source bench/lease_env.sh || exit 1
export TVMNORM_CACHE=/tmp/tc
[ -f .device/l44lib/manifest.json ] || python -m tvmnorm build --target cuda --hidden 128,4096 --stages fwd,bwd \
  --dtypes bf16 --out .device/l44lib > "$X/build.log" 2>&1
TVMNORM_LIBRARY=.device/l44lib timeout 420 python bench/x_layouts.py --out "$X" --tokens 16384 --rounds 3 \
  > "$X/x-layouts.log" 2>&1
el "x_layouts rc $?"; cut -c1-110 "$X/x-layouts.log" | tail -40
