# PDL A/B, second call: decode rows (1, 8, 64, 256), bf16 fwd, bwd and fp8 fwd: B N N B
. .device/l39/common.sh
for R in B1 N1 N2 B2; do L=${R:0:1}
  timeout 100 python -m tvmnorm.bench --target cuda --ops rmsnorm_fwd,layernorm_fwd,rmsnorm_bwd,layernorm_bwd,rmsnorm_fwd_fp8,layernorm_fwd_fp8 \
    --dtypes bf16 --shapes all --rows decode --impls tvmnorm_tuned --library /tmp/lib$L \
    --out "$X" --name decode-$R --no-plots --quiet > "$X/decode-$R.log" 2>&1
  tail -1 "$X/decode-$R.log"
done
