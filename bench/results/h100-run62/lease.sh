# lease 61 (session 59; the call after staging, ~500 s, H100 or H200): the new small-call rule
# (sched.default.small_call_cuda_heuristic: a row a block at most 16 bytes a thread, one barrier a
# row sum) checked and timed. 1. its GPU tests (small calls through the JIT cache and a library,
# warp_sums and early_weights forwards against float64); 2. the decode forwards of the proof
# (bench/h200_proof.sh decode, forward parts: the library's small-call kernels, float64-checked
# per case, beside the default, torch eager and Liger); 3. decode_probe --rule-knobs at four
# layernorm widths (the rule with +ew among its knobs) in what time is left.
source bench/lease_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
export TVMNORM_CACHE=/tmp/tvmnorm-cache
SHARDS=8 GPUS=1 OUT=$X/t TEST_SECONDS=100 bash bench/gpu_tests.sh tests/test_gpu_core.py \
  -k "small_calls or fwd_warp_sums or fwd_early_weights" > "$X/tests.log" 2>&1
el "tests rc $?"; head -12 "$X/t/gpu-tests/summary.txt"
DECODE_S=300 DECODE_PARTS="rmsnorm_fwd_decode layernorm_fwd_decode rmsnorm_fwd_fp8_decode layernorm_fwd_fp8_decode" \
  bash bench/h200_proof.sh decode 2>&1 | tail -40
el "decode done"
timeout 100 python bench/decode_probe.py --out "$X/probe" --rule-knobs --norms layernorm --rounds 3 \
  --hidden 1024,2560,4096,8192 > "$X/probe.log" 2>&1
el "probe rc $?"; grep -v "^copy" "$X/probe.log" | cut -c1-230 | tail -16
