# same-run A/B of four fresh records (section 5) that ran 1-3.6% faster than the committed ones
# across runs: the committed library (C) and the fresh one (F), C F C F. Needs
# .device/l38/fresh-sch.json = tuning_logs/cuda-sm_90/run-2026-12-03-l38-fresh/tuned-cuda-sm_90.json
# (the device has no `tvmnorm` console script: python -m tvmnorm)
. .device/l38/common.sh
K=0x8004124,0xe004124,0x2004125,0x3804125
mkdir -p /tmp/fsch && cp .device/l38/fresh-sch.json /tmp/fsch/cuda-sm_90.json
python -m tvmnorm build --target cuda --keys $K --tuned-only --schedules /tmp/fsch --out /tmp/libF > "$X/build-F.log" 2>&1
python -m tvmnorm build --target cuda --keys $K --tuned-only --out /tmp/libC > "$X/build-C.log" 2>&1
for i in 1 2; do for L in C F; do
  python -m tvmnorm.bench --target cuda --ops rmsnorm_bwd,layernorm_bwd --dtypes bf16 --hidden 512,896,2048,3584 --rows train \
    --impls tvmnorm_tuned --library /tmp/lib$L --rounds 2 --out "$X" --name ab-$L$i --no-plots --quiet > "$X/ab-$L$i.log" 2>&1
done; done
