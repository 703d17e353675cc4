# lease 45, call 2: a per-head call's first-call latency in a fresh process with an empty kernel
# cache, from a library of every layout against one of compact rows alone (whose per-head kernels
# nvcc compiles on first use); then bench/x_layouts.py with the library of every layout
source bench/lease_env.sh || exit 1
B=(python -m tvmnorm build --target cuda --hidden 128,4096 --stages fwd,bwd --dtypes bf16 --jobs 16)
for lay in all compact; do
  [ -f /tmp/lib-$lay/manifest.json ] || "${B[@]}" --out /tmp/lib-$lay --layouts $lay > "$X/build-$lay-2.log" 2>&1
done
for lay in all compact all compact; do
  rm -rf /tmp/empty-cache; TVMNORM_CACHE=/tmp/empty-cache TVMNORM_LIBRARY=/tmp/lib-$lay python - <<'PY' 2>&1 | tee -a "$X/first-call.log"
import os, time, torch
t0 = time.perf_counter()
from tvmnorm.torch import rms_norm
from tvmnorm.torch import _host
qkv = torch.randn(64, 6144, dtype=torch.bfloat16, device="cuda")
q = qkv[:, :4096].view(64, 32, 128)
w = torch.randn(128, dtype=torch.bfloat16, device="cuda")
t1 = time.perf_counter()
y = rms_norm(q, w); torch.cuda.synchronize()
t2 = time.perf_counter()
y = rms_norm(q, w); torch.cuda.synchronize()
t3 = time.perf_counter()
ref = (q.float() * torch.rsqrt(q.float().pow(2).mean(-1, keepdim=True) + 1e-6) * w.float())
err = ((y.float() - ref).norm() / ref.norm()).item()
origins = sorted({k.origin for k in _host._KERNELS.values()})
print(f"library={os.environ['TVMNORM_LIBRARY']} import+setup {t1 - t0:.2f} s, first per-head call {t2 - t1:.3f} s, "
      f"second {1e3 * (t3 - t2):.2f} ms, rel err {err:.2e}, origins {origins}")
PY
done
el "first calls done"
[ -d /tmp/tc ] || { mkdir -p /tmp/tc && tar xJf .device/l45/tc.txz -C /tmp/tc --strip-components=1; }
TVMNORM_CACHE=/tmp/tc TVMNORM_LIBRARY=/tmp/lib-all timeout 420 python bench/x_layouts.py --out "$X" --tokens 16384 --rounds 2 \
  > "$X/x-layouts.log" 2>&1
el "x_layouts rc $?"; cut -c1-120 "$X/x-layouts.log" | tail -30
