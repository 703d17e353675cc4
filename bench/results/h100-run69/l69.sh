# lease 69 (written in session 62), two calls after the staging call (carry .device/b and
# .device/next with a copy of this script and dx_fold.patch; PHASE=build, ~300 s, then PHASE=bench
# within 30 s, ~300 s; both phases in one call on a CPU), any GPU: a same-machine A/B, so an
# H100 serves as well as an H200. The backward's dx with its row constants folded (dx_fold.patch, beside this script; ../sass-dx-algebra.txt: 14% fewer fp32
# instructions in the layernorm 8192 dx, 6% fewer instructions in all at rmsnorm 8192) against
# the dx as committed: the library of the committed bf16 bwd records built from this tree
# ("base") and from a copy of tvmnorm/ with the patch applied ("fold"; a library serves only the
# sources that built it, so each runs under its own tree), timed base, fold, fold, base at 16384
# tokens; `tvmnorm.bench` checks every kernel against float64 before timing it. After the lease,
# if fold wins in both pairs: apply the patch to tvmnorm/compute/norms.py, rebuild the packs
# (scripts/lease_packs.sh), and retune or re-time the backward records on an H200.
#   PHASE=build bash .device/next/l69.sh; then PHASE=bench bash .device/next/l69.sh   # on the device
#   DRY=1 TARGET=llvm HIDDEN=1024 OUT=/tmp/o bash bench/results/h100-run69/l69.sh   # the flow, on a CPU
if [ -z "${DRY:-}" ]; then
  source bench/lease_env.sh || exit 1
  SITE=/opt/tvmnorm-dev/site
else
  set -uo pipefail; X=$OUT/x; mkdir -p "$X"; T0=$(date +%s); SITE=$(python -c "import sys; print(':'.join(sys.path[1:]))")
  el() { echo "[$(($(date +%s) - T0)) s] $*"; }
fi
ROOT=$PWD TARGET=${TARGET:-cuda} H=${HIDDEN:-128,512,1024,2048,4096,5120,7168,8192}
export TVMNORM_CACHE=/tmp/tvmnorm-cache
PATCH=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/dx_fold.patch
PHASE=${PHASE:-all}
tree() { [ "$1" = fold ] && echo /tmp/alt || echo "$ROOT"; }
if [ "$PHASE" != bench ]; then
rm -rf /tmp/alt && mkdir -p /tmp/alt && cp -r tvmnorm /tmp/alt/ || exit 1
if command -v patch > /dev/null; then patch -s -p1 -d /tmp/alt < "$PATCH"; else (cd /tmp/alt && git apply "$PATCH"); fi \
  || { el "the patch did not apply"; exit 1; }
build() {  # both at once: the device has 16 cores
  (cd "$(tree $1)" && PYTHONPATH="$SITE:$(tree $1)" timeout 500 python -m tvmnorm build --target "$TARGET" --hidden "$H" \
    --stages bwd --dtypes bf16 --tuned-only --layouts compact --schedules "$ROOT/schedules" --out /tmp/lib-$1) > "$X/build-$1.log" 2>&1
  el "built $1 rc $?"; tail -1 "$X/build-$1.log"
}
build base & build fold & wait
fi
[ "$PHASE" != build ] || exit 0
for r in base-0 fold-0 fold-1 base-1; do
  v=${r%-*}
  (cd "$(tree $v)" && PYTHONPATH="$SITE:$(tree $v)" TVMNORM_LIBRARY=/tmp/lib-$v timeout 100 python -m tvmnorm.bench \
    --target "$TARGET" --ops rmsnorm_bwd,layernorm_bwd --dtypes bf16 --hidden "$H" --rows train --impls tvmnorm_tuned \
    --out "$X/ab" --name $r --no-plots) > "$X/ab-$r.log" 2>&1
  el "$r rc $?"
done
python - "$X/ab" <<'PY'
import sys
sys.path.insert(0, "scripts")
from knob_ab import tuned_us  # packed key -> tvmnorm_tuned us of the cases whose check passed
from tvmnorm import NormKey
d = sys.argv[1]
base, fold = ([tuned_us(f"{d}/{v}-{i}.json") for i in (0, 1)] for v in ("base", "fold"))
for packed in sorted(set.intersection(*map(set, base + fold))):
    key, b, f = NormKey.unpack(packed), [run[packed] for run in base], [run[packed] for run in fold]
    print(f"{key.norm:9s} {key.hidden_size:5d} base {b[0]:8.2f} {b[1]:8.2f}  fold {f[0]:8.2f} {f[1]:8.2f}"
          f"  fold/base {max(f) / min(b):.3f}{'  fold wins both pairs' if max(f) < min(b) else ''}")
PY
