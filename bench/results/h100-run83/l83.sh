# lease 83 (session 71), one call after the staging call, on any GPU (carry .device/b,
# .device/next; ~250 s): `tvmnorm tune --sweep-chunk-rows` with its measure now the library's dx +
# finalize under the bench's timer (tune.dx_call_us; lease 81's search-measure sweep picked T the
# whole call ran slower) at 2560/5120: does it pick what lease 82's A/B of whole calls did
# (layernorm 2560 at 48, rmsnorm 5120 at 40; the others their own)?
source bench/lease_env.sh || exit 1
export TVMNORM_CACHE=/tmp/tvmnorm-cache
el "$(nvidia-smi --query-gpu=name --format=csv,noheader)"
mkdir -p /tmp/sched-new && cp schedules/cuda-sm_90.json /tmp/sched-new/
timeout 270 python -m tvmnorm tune --target cuda --norms rmsnorm,layernorm --stages bwd --dtypes bf16 --hidden 2560,5120 \
  --trials 1 --sweep-chunk-rows --schedules /tmp/sched-new --logs /tmp/tl --no-build > "$X/sweep.log" 2>&1
el "sweep rc $?"; grep -E "chunk sweep|failed|Error" "$X/sweep.log" | cut -c1-400
cp /tmp/sched-new/cuda-sm_90.json "$X/"
