# the warps' sums by shuffles (session 59; one call after the staging call, ~450 s, H100 or
# H200; carry .device/b): CudaRowConfig.shuffle_sums, compiled and structure-tested on the CPU
# box but never run on a GPU. 1. its float64 GPU tests (test_cuda_fwd_warp_sums: 2 to 32 warps a
# row, bf16, fp16, fp8 with y kept, fp32 loaded per stage; 1, 257 and 16384 rows) beside the
# other warp_sums cases; 2. bench/decode_probe.py --rule-knobs at every catalog width ("+shfl":
# the small-call rule with it, wherever the rule takes one barrier a row sum), both norms. The
# rule's 32 warps at 8192 lost 0.25-0.3 us a cell to 16 warps or two barriers in
# ../h100-run62/ and ../h200-run63/: if +shfl wins both norms' cells on the whole, the rule
# takes it (small_call_cuda_heuristic's shuffle_sums default), and the tuned forward's space
# could offer it beside warp_sums.
source bench/lease_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
SHARDS=8 GPUS=1 OUT=$X/t TEST_SECONDS=120 bash bench/gpu_tests.sh tests/test_gpu_core.py -k "fwd_warp_sums" \
  > "$X/tests.log" 2>&1
el "tests rc $?"; head -12 "$X/t/gpu-tests/summary.txt"
for part in "layernorm 180" "rmsnorm 160"; do
  set -- $part
  timeout "$2" python bench/decode_probe.py --out "$X/$1" --rule-knobs --norms "$1" --rounds 3 \
    --hidden 8192,7168,5120,4096,3584,2560,2048,1536,1024,896,512 > "$X/$1.log" 2>&1
  el "$1 rc $?"; grep -v "^copy" "$X/$1.log" | cut -c1-230 | tail -4
done
