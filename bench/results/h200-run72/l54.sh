# lease 54 (session 56), one call after the staging call, on an H200 (~420 s): lease 51's five
# backward records against the records before them (verify.sh, OLD=.device/next/old), then lease
# 53's bf16 backward-with-add records (tuned on an H100, ../h200-run53/) checked against float64
# and timed here beside the default, torch eager and torch.compile: the library of the committed
# bwd_add records at 896-5120 (both norms; rmsnorm 896-3584's records came from an H200 earlier).
# On an H100 it does nothing: verify.sh means nothing there, and the H100's bwd_add timings and
# A/B exist (../h200-run53/, ../h200-run54/: the latter from ../h200-run54/ab53.sh, which this
# script ran then).
source bench/lease_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { el "not an H200: nothing to do"; exit 0; }
(OLD=.device/next/old; source .device/next/verify.sh) > "$X/verify.log" 2>&1; el "verify rc $?"
tail -45 "$X/verify.log" | cut -c1-160
export TVMNORM_CACHE=/tmp/tvmnorm-cache TVMNORM_LIBRARY=/tmp/lib-bwd_add
H=896,1024,1536,2048,2560,3584,4096,5120
timeout 200 python -m tvmnorm build --target cuda --hidden $H --stages bwd_add --dtypes bf16 --tuned-only \
  --layouts compact --out /tmp/lib-bwd_add > "$X/build-bwd_add.log" 2>&1; el "built rc $?"; tail -1 "$X/build-bwd_add.log"
timeout ${CHECK_S:-60} python bench/gpu_check.py --tuned --out "$X" > "$X/check-bwd_add.log" 2>&1; el "check rc $?"
tail -3 "$X/check-bwd_add.log"
timeout ${BENCH_S:-150} python -m tvmnorm.bench --target cuda --ops rmsnorm_bwd_add,layernorm_bwd_add --dtypes bf16 \
  --hidden $H --rows train --impls tvmnorm_tuned,tvmnorm_default,torch_eager,torch_compile --out "$X" \
  --name h200-bwd_add --no-plots > "$X/bench-bwd_add.log" 2>&1; el "bench rc $?"
grep -h "^ *[0-9]\|^[a-z]" "$X/bench-bwd_add.log" | head -40
