# A same-machine A/B of a retune, after `job.sh` JOB=fwd (or bwd: STAGES=bwd) PHASE=bench on the
# same machine: the library of the committed bf16 records of STAGES at HIDDEN ("old", built here) against the
# retune's ($STATE/lib, "new"), timed old, new, new, old at 16384 tokens (tuned impl only), for
# bench/results/h200-run51/ab_accept.py (on an H100 the only fair judge: the H200's timings in
# h200-tuned.json would keep every committed record). Leases 52, 67, 75 and 77 ran it.
#   HIDDEN=4096,5120 bash bench/lease_ab.sh
#   FP8=fp8e4m3 HIDDEN=128,1024 bash bench/lease_ab.sh    # the fp8-output forward (JOB=fwd_fp8)
#   STAGES=bwd HIDDEN=2560,5120 NEW=/tmp/tvmnorm-tune-bwd/lib bash bench/lease_ab.sh   # JOB=bwd
source bench/lease_env.sh || exit 1
export TVMNORM_CACHE=/tmp/tvmnorm-cache
hidden=${HIDDEN:?"HIDDEN: the retuned widths, e.g. 128,896"}
stages=${STAGES:-fwd}
ops=${FP8:+rmsnorm_fwd_fp8,layernorm_fwd_fp8}
timeout 200 python -m tvmnorm build --target cuda --hidden "$hidden" --stages "$stages" --dtypes bf16 \
  ${FP8:+--fp8 "$FP8" --fp8-only} --tuned-only --layouts compact --schedules schedules --out /tmp/lib-old > "$X/build-old.log" 2>&1; el "built old $?"; tail -1 "$X/build-old.log"
for r in old-0 new-0 new-1 old-1; do
  lib=$([ "${r%-*}" = old ] && echo /tmp/lib-old || echo "${NEW:-/tmp/tvmnorm-tune-fwd/lib}")
  TVMNORM_LIBRARY=$lib timeout 60 python -m tvmnorm.bench --target cuda --ops "${ops:-rmsnorm_$stages,layernorm_$stages}" \
    --dtypes bf16 --hidden "$hidden" --rows train --impls tvmnorm_tuned --out "$X/ab" --name $r --no-plots > "$X/ab-$r.log" 2>&1
  el "$r $?"
done
grep -h "^ *[0-9]\|^[a-z]" "$X/ab-old-0.log" "$X/ab-new-0.log" | head -60
