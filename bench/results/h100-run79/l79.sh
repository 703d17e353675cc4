# lease 79 (session 71), one call after the staging call, on any GPU (carry .device/b,
# .device/proof, .device/next; ~200 s): lease 78's Nsight Compute put the bf16 backward's dx at
# 2560/5120 at 97-219 us on an H100 while the whole call took 121-243 us (lease 77's bench):
# ~24 us outside the dx there against 9-15 at 2048/4096. bench/bwd_parts.py on the committed
# records (the proof library) times dx, finalize and the whole call apart, and finalize split
# other ways (columns x lanes [x unroll]): finalize_split gives 2560 and 5120 160 blocks, the
# powers of two 256.
source bench/lease_env.sh || exit 1
export TVMNORM_CACHE=/tmp/tvmnorm-cache TVMNORM_LIBRARY=/tmp/tvmnorm-lib-proof
if [ ! -f "$TVMNORM_LIBRARY/manifest.json" ]; then
  mkdir -p "$TVMNORM_LIBRARY" && tar xJf .device/proof/lib.txz -C "$TVMNORM_LIBRARY" --strip-components=1 || exit 1
fi
el "$(nvidia-smi --query-gpu=name --format=csv,noheader)"
timeout 420 python bench/bwd_parts.py --out "$X" --norms rmsnorm,layernorm \
  --hidden 1536,2048,2560,3584,4096,5120,7168 --finalize 8x64,16x32,32x16,8x128,4x128,4x256,16x64
el "bwd_parts rc $?"
