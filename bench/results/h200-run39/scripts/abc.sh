# PDL, third experiment: C = B's kernels without the leaders' explicit trigger (TVMNORM_PDL_TRIGGER=0:
# a follower launches when its leader's blocks exit), against B and N, at train rows (bf16 bwd
# and fp8 fwd) B N C C N B, then at decode rows (bwd and fp8 fwd at four widths) B C C B
. .device/l39/common.sh
python -c "import json;m=json.load(open('/tmp/libC/manifest.json'));print('C', m['pdl'], m['tvmnorm_source_hash'], len(m['kernels']))" >> "$X/libs.txt"
cat "$X/libs.txt"
for R in B1 N1 C1 C2 N2 B2; do L=${R:0:1}
  timeout 80 python -m tvmnorm.bench --target cuda --ops rmsnorm_bwd,layernorm_bwd,rmsnorm_fwd_fp8,layernorm_fwd_fp8 \
    --dtypes bf16 --shapes all --rows train --impls tvmnorm_tuned --library /tmp/lib$L \
    --out "$X" --name train-$R --no-plots --quiet > "$X/train-$R.log" 2>&1
  tail -1 "$X/train-$R.log"
done
for R in B1 C1 C2 B2; do L=${R:0:1}
  timeout 60 python -m tvmnorm.bench --target cuda --ops rmsnorm_bwd,layernorm_bwd,rmsnorm_fwd_fp8,layernorm_fwd_fp8 \
    --dtypes bf16 --hidden 512,1024,4096,8192 --rows decode --impls tvmnorm_tuned --library /tmp/lib$L \
    --out "$X" --name decode-$R --no-plots --quiet > "$X/decode-$R.log" 2>&1
  tail -1 "$X/decode-$R.log"
done
