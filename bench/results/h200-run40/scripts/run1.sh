# lease 40, call 2: the PDL library (HEAD's kernel sources) timed where lease 39 did not (fp16
# train bwd, bf16 decode at every width), float64 check of both libraries, the GPU tests
# never run on a GPU (CUDA-graph replay, PDL chains), then the first third of the GPU suite
. .device/l40/common.sh
for L in bf16 fp16; do python -c "import json;m=json.load(open('/tmp/lib$L/manifest.json'));print('$L', m['pdl'], m['tvmnorm_source_hash'], len(m['kernels']))"; done | tee "$X/libs.txt"
for R in 1 2; do
  timeout 100 python -m tvmnorm.bench --target cuda --ops rmsnorm_bwd,layernorm_bwd \
    --dtypes fp16 --shapes all --rows train --impls tvmnorm_tuned --library /tmp/libfp16 \
    --out "$X" --name fp16-train-$R --no-plots --quiet > "$X/fp16-train-$R.log" 2>&1
  el "fp16 train $R: $(tail -1 "$X/fp16-train-$R.log")"
done
timeout 150 python -m tvmnorm.bench --target cuda --ops rmsnorm_bwd,layernorm_bwd,rmsnorm_fwd_fp8,layernorm_fwd_fp8 \
  --dtypes bf16 --hidden 128,896,1536,2048,2560,3584,5120,7168 --rows decode --impls tvmnorm_tuned --library /tmp/libbf16 \
  --out "$X" --name bf16-decode --no-plots --quiet > "$X/bf16-decode.log" 2>&1
el "bf16 decode: $(tail -1 "$X/bf16-decode.log")"
timeout 150 python -m pytest -q -rfEs -p no:cacheprovider -m gpu tests/test_gpu_core.py -k "cuda_graph or programmatic" \
  > "$X/pdl-tests.txt" 2>&1 &
tp=$!
for L in bf16 fp16; do
  TVMNORM_LIBRARY=/tmp/lib$L timeout 150 python bench/gpu_check.py --tuned --out "$X/check-$L" > "$X/check-$L.log" 2>&1 &
done
wait
el "pdl tests: $(tail -1 "$X/pdl-tests.txt")"
for L in bf16 fp16; do el "check $L: $(grep SUMMARY "$X/check-$L/h200-tuned-correctness.txt")"; done
left=$((560 - ($(date +%s) - T0)))
el "suite slice 0/3, $left s"
SLICE=0/3 SHARDS=15 GPUS=1 OUT=$X/s0 TEST_SECONDS=$left bash bench/gpu_tests.sh > "$X/s0.log" 2>&1
el "$(tail -3 "$X/s0.log")"
