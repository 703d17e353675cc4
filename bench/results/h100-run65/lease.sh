# lease 65 (session 60), one call after the staging call (carry .device/b, .device/proof): the
# proof's decode forward parts with the library and JIT cache of kernel sources as of the
# small-call rule's shuffles from 24 warps; then on an H100 (where Liger's decode forward leads)
# Nsight Compute on both kernels at one row and their GPU time by torch.profiler.
source bench/lease_env.sh || exit 1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); el "$GPU"
DECODE_PARTS="rmsnorm_fwd_decode layernorm_fwd_decode rmsnorm_fwd_fp8_decode layernorm_fwd_fp8_decode" DECODE_S=270 \
  bash bench/h200_proof.sh decode 2>&1 | tail -25
el "decode done"
case "$GPU" in *H200*) exit 0 ;; esac
export TVMNORM_CACHE=/tmp/tvmnorm-cache TVMNORM_LIBRARY=/tmp/tvmnorm-lib-proof
timeout 100 python bench/profile_case.py --op layernorm_fwd,rmsnorm_fwd --hidden 4096,8192 --impl tvmnorm_tuned,liger \
  --rows 1 --calls 50 --kernels > "$X/kernels-x1.log" 2>&1; el "kernels rc $?"; cut -c1-150 "$X/kernels-x1.log" | tail -24
ROWS=1 OUT=$X timeout 260 bash bench/h200_ncu.sh "layernorm_fwd 4096 tvmnorm_tuned small_fwd" \
  "layernorm_fwd 4096 liger layer_norm_forward" "rmsnorm_fwd 8192 tvmnorm_tuned small_fwd" "rmsnorm_fwd 8192 liger rms_norm_forward"
el "ncu rc $?"
