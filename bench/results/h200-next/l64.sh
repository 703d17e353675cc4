# the warps' sums by shuffles (session 59; one call after the staging call, ~250 s, H100 or
# H200; carry .device/b): CudaRowConfig.shuffle_sums, compiled and structure-tested on the CPU
# box but never run on a GPU. 1. its float64 GPU tests (test_cuda_fwd_warp_sums: 32 warps a row,
# bf16, fp8 with y kept, fp32 loaded per stage; 1, 257 and 16384 rows) beside the other
# warp_sums cases; 2. bench/decode_probe.py --rule-knobs at 8192 (the one catalog width whose
# small-call kernel has 32 warps: "+shfl" is the rule with it), both norms, five rounds. If
# +shfl wins both norms' cells on the whole (the rule's 32 warps lost 0.25-0.3 us a cell to 16
# warps or two barriers in ../h100-run62/ and ../h200-run63/), the rule takes it
# (small_call_cuda_heuristic's shuffle_sums default) and the tuned forward's space could offer it.
source bench/lease_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
SHARDS=8 GPUS=1 OUT=$X/t TEST_SECONDS=120 bash bench/gpu_tests.sh tests/test_gpu_core.py -k "fwd_warp_sums" \
  > "$X/tests.log" 2>&1
el "tests rc $?"; head -12 "$X/t/gpu-tests/summary.txt"
for norm in layernorm rmsnorm; do
  timeout 80 python bench/decode_probe.py --out "$X/$norm" --rule-knobs --norms $norm --rounds 5 --hidden 8192 \
    > "$X/$norm.log" 2>&1
  el "$norm rc $?"; grep -v "^copy" "$X/$norm.log" | cut -c1-230 | tail -4
done
