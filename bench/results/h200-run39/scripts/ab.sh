# PDL A/B, first call: the PDL GPU tests (their library built with nvcc here), then at train rows
# the committed records (bf16 fwd, bwd, fp8 fwd) in two libraries built from this tree: B (the
# kernels that follow another of a call launched with programmatic dependent launch) and N
# (TVMNORM_PDL=0: the same kernels launched plainly), timed B N N B.
. .device/l39/common.sh
for L in B N; do python -c "import json;m=json.load(open('/tmp/lib$L/manifest.json'));print('$L', m['pdl'], m['tvmnorm_source_hash'], len(m['kernels']))" >> "$X/libs.txt"; done
cat "$X/libs.txt" "$X/source-hash.txt"
timeout 220 python -m pytest -q -m gpu tests/test_gpu_core.py -k "programmatic or several_translation_units or small_calls" > "$X/gpu-tests.txt" 2>&1
tail -3 "$X/gpu-tests.txt"
for R in B1 N1 N2 B2; do L=${R:0:1}
  timeout 100 python -m tvmnorm.bench --target cuda --ops rmsnorm_fwd,layernorm_fwd,rmsnorm_bwd,layernorm_bwd,rmsnorm_fwd_fp8,layernorm_fwd_fp8 \
    --dtypes bf16 --shapes all --rows train --impls tvmnorm_tuned --library /tmp/lib$L \
    --out "$X" --name train-$R --no-plots --quiet > "$X/train-$R.log" 2>&1
  tail -1 "$X/train-$R.log"
done
